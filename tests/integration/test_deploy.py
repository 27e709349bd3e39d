"""The deployment files: compose structure, Prometheus config and rules (promtool), and the
dashboard and rules only naming metrics the workers export."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.compact.metrics import CompactionMetrics
from ingest.ops.metrics import Metrics
from ingest.spark.jars import spark_jars_dir
from ingest.spark.session import AVRO_LIMIT_OPTIONS, JVM_OPTIONS_CONF
from ingest.table.metrics import TableMetrics
from ingest_dev.process import popen
from ingest_dev.testkit import free_port, port_open, wait_until

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"


def exported_names() -> set[str]:
    names: set[str] = set()
    # The workers' metrics, the table committer's (ingest table-commit) and the compactor's.
    registries = (Metrics("x").registry, TableMetrics("x").registry, CompactionMetrics("x").registry)
    for metric in (m for r in registries for m in r.collect()):
        for sample_suffix in ("", "_total", "_bucket", "_sum", "_count", "_created"):
            names.add(metric.name + sample_suffix)
    return names


def referenced_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(ingest_[a-z_]+)\b", expr))


def rendered_compose() -> dict[str, Any]:
    """docker-compose.yml as a compose implementation reads it (podman-compose from PyPI, which
    renders without a container engine): anchors merged, ``$$`` unescaped."""
    proc = subprocess.run(
        [sys.executable, "-m", "podman_compose", "--dry-run", "-f", str(REPO / "docker-compose.yml"), "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = yaml.safe_load(proc.stdout)
    return doc


def test_compose_file_structure() -> None:
    doc = rendered_compose()
    services = doc["services"]
    ours = {"migrate", "topic", "source", "producer", "spark-connect", "worker"}
    assert ours | {"kafka", "postgres", "prometheus", "grafana"} <= set(services)
    worker = services["worker"]
    assert worker["deploy"]["replicas"] >= 2
    assert "container_name" not in worker and "ports" not in worker  # `--scale worker=N` must work
    assert worker["environment"]["INGEST_SPARK_MASTER"].startswith("sc://spark-connect:")
    assert worker["restart"] == "unless-stopped" and "/healthz" in " ".join(worker["healthcheck"]["test"])
    # Started only once its topic exists, the schema is migrated and Spark answers.
    assert worker["depends_on"]["topic"]["condition"] == "service_completed_successfully"
    assert worker["depends_on"]["source"]["condition"] == "service_completed_successfully"
    assert worker["depends_on"]["spark-connect"]["condition"] == "service_healthy"
    assert "--if-not-exists" in services["topic"]["command"][0]
    assert "--wait" in services["migrate"]["command"]
    assert "-h 127.0.0.1" in services["postgres"]["healthcheck"]["test"][1]  # TCP, not the init server's socket
    assert any(v.endswith(":/var/lib/kafka/data") for v in services["kafka"]["volumes"])
    assert services["kafka"]["environment"]["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    for name in ("kafka", "postgres", "prometheus", "grafana"):
        image = services[name]["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image version ({image})"
    for name in ours - {"topic"}:  # one image of ours, built, never pulled
        assert services[name]["image"] == "ingest:latest" and services[name]["pull_policy"] == "never", name
        assert Path(services[name]["build"]["context"]) == REPO, name
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith(("/", ".")):
                assert (REPO / source).exists() or Path(source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in doc["volumes"], f"{name}: volume {source} is not declared"
    assert "segments:/data/segments" in services["spark-connect"]["volumes"]  # Spark writes where workers list
    # The Iceberg table: enabled once the source exists, a committer and a standby that read the store.
    committer = services["table-committer"]
    assert services["table-enable"]["command"] == ["table-enable", "clicks"]
    assert services["table-enable"]["depends_on"]["source"]["condition"] == "service_completed_successfully"
    assert committer["command"] == ["table-commit", "clicks"] and committer["deploy"]["replicas"] >= 2
    assert committer["depends_on"]["table-enable"]["condition"] == "service_completed_successfully"
    assert "segments:/data/segments" in committer["volumes"] and committer["restart"] == "unless-stopped"
    # The compactor: one active, a standby; Spark through the Connect server, the same store.
    compactor = services["compactor"]
    assert compactor["command"][:2] == ["compact", "clicks"] and "--every" in compactor["command"]
    assert compactor["deploy"]["replicas"] >= 2 and compactor["restart"] == "unless-stopped"
    assert compactor["depends_on"]["source"]["condition"] == "service_completed_successfully"
    assert compactor["depends_on"]["spark-connect"]["condition"] == "service_healthy"
    assert compactor["environment"]["INGEST_SPARK_MASTER"] == worker["environment"]["INGEST_SPARK_MASTER"]
    assert "segments:/data/segments" in compactor["volumes"]
    assert "/healthz" in " ".join(compactor["healthcheck"]["test"])
    scraped = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
    assert {"worker", "table-committer", "compactor"} <= {
        n for c in scraped for d in c["dns_sd_configs"] for n in d["names"]
    }


def shell_commands(services: dict[str, Any]) -> list[tuple[str, str]]:
    """(service, script) for every command a shell runs: ``bash -c`` entrypoints, CMD-SHELL checks."""
    out = []
    for name, service in services.items():
        if service.get("entrypoint") in (["bash", "-c"], ["sh", "-c"]):
            out.append((name, service["command"][0]))
        test = service.get("healthcheck", {}).get("test", [])
        if test[:1] == ["CMD-SHELL"]:
            out.append((f"{name} healthcheck", test[1]))
    return out


def test_every_shell_command_in_compose_parses() -> None:
    commands = shell_commands(rendered_compose()["services"])
    assert {"spark-connect", "topic", "worker healthcheck", "postgres healthcheck"} <= {n for n, _ in commands}
    for name, script in commands:
        proc = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True, timeout=10)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"


@pytest.mark.timeout(400)
def test_the_compose_spark_connect_command_starts_a_server(tmp_path: Path) -> None:
    """The service's command itself, run by bash on this machine: only the port (a free one) and
    the memory differ; ``python`` is this interpreter, as it is the image's."""
    (script,) = (s for n, s in shell_commands(rendered_compose()["services"]) if n == "spark-connect")
    assert "spark.connect.grpc.binding.port=15002" in script
    # Avro's length limits on the server's JVM (ingest.spark.session; tests/integration/test_avro_poison.py).
    assert all(f'--conf "{key}={value}"' in script for key, value in JVM_OPTIONS_CONF.items()), script
    port = free_port()
    script = script.replace("spark.connect.grpc.binding.port=15002", f"spark.connect.grpc.binding.port={port}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    # The image's S3 connector jars (INGEST_SPARK_JARS_DIR is set in the Dockerfile): here, the cache.
    env.update(
        {
            "PATH": f"{bin_dir}:{env['PATH']}",
            "SPARK_CONNECT_MEMORY": "768m",
            "INGEST_SPARK_JARS_DIR": str(spark_jars_dir()),
        }
    )
    proc = popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def listening() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
            return port_open(port)

        wait_until(listening, 300, "the Spark Connect server to listen", interval=1)
        # bash, spark-submit and spark-class exec: the process is the server's JVM, with the limits.
        jvm_args = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode().split("\0")
        assert set(AVRO_LIMIT_OPTIONS.split()) <= set(jvm_args), jvm_args
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def test_dockerfile_installs_what_setup_installs() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11\.\d+-slim-bookworm$", dockerfile, re.MULTILINE)
    assert "openjdk-17-jre-headless" in dockerfile and "pip install" in dockerfile
    assert 'ENTRYPOINT ["ingest"]' in dockerfile
    # The S3 connector from the same pom setup.sh fetches, where ingest.spark.jars looks for it.
    assert "scripts/spark-jars/pom.xml" in dockerfile
    assert "ENV INGEST_SPARK_JARS_DIR=/opt/ingest/spark-jars" in dockerfile
    assert not re.search(r"pip install .*-e ", dockerfile)  # not editable
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert {"!ingest/", "!metastore/", "!migrations/", "!scripts/spark-jars/pom.xml"} <= set(ignored)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: scripts/setup.sh installs Debian's prometheus package"
    return subprocess.run([binary, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)


def test_prometheus_config_and_rules_check_and_their_unit_tests_pass() -> None:
    for args in (
        ("check", "config", "prometheus.yml"),
        ("check", "rules", "rules.yml"),
        ("test", "rules", "rules_test.yml"),
    ):
        result = promtool(*args)
        assert result.returncode == 0, result.stdout + result.stderr


def test_rules_and_dashboard_name_only_exported_metrics() -> None:
    exported = exported_names()
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "ingest.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 10
    for expr in exprs:
        unknown = referenced_metrics(expr) - exported - recorded
        assert not unknown, f"{expr!r} names metrics no worker exports: {unknown}"


def test_the_dashboard_shows_every_metric_family_with_units_and_legends() -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "ingest.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    shown = {m for p in panels for t in p["targets"] for m in referenced_metrics(t["expr"])}
    families = {m.name for m in Metrics("x").registry.collect()}
    missing = {f for f in families if not any(s == f or s.startswith(f + "_") for s in shown)}
    assert not missing, f"metric families no panel shows: {sorted(missing)}"
    for panel in panels:
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        for target in panel["targets"]:
            assert target.get("legendFormat"), f"{panel['title']}: {target['expr']} has no legend"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_kafka_version_is_one_across_compose_tests_and_the_embedded_broker() -> None:
    pom = (REPO / "scripts" / "kafka" / "pom.xml").read_text()
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    assert match is not None
    compose: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{match.group(1)}"
    assert (REPO / "tests" / "fixtures" / "servers.py").read_text().count(f'"apache/kafka:{match.group(1)}"') == 1


def test_keda_scaled_object_targets_the_deployed_group_topic_and_partition_count() -> None:
    scaled: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "kubernetes" / "keda-scaledobject.yaml").read_text())
    compose: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    spec = tomllib.loads((REPO / "deploy" / "clicks.toml").read_text())
    assert scaled["kind"] == "ScaledObject"
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert meta["consumerGroup"] == spec.get("consumer_group", f"ingest-{spec['name']}")
    assert meta["topic"] in spec["topics"]
    assert meta["bootstrapServers"] == compose["x-ingest-env"]["INGEST_KAFKA_BOOTSTRAP"]
    # One partition is read by one worker at a time: replicas past the partition count stand by.
    assert scaled["spec"]["maxReplicaCount"] == int(compose["services"]["kafka"]["environment"]["KAFKA_NUM_PARTITIONS"])
    assert meta["allowIdleConsumers"] == "false"


KUBERNETES = REPO / "deploy" / "kubernetes"
# The validator bundles the API schemas (kubernetes-validate from PyPI): no cluster, no network.
KUBERNETES_VERSIONS = ("1.29", "1.31")


def kubernetes_documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(KUBERNETES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def test_kubernetes_manifests_validate_offline_against_the_api_schemas() -> None:
    import kubernetes_validate

    checked = set()
    for name, doc in kubernetes_documents():
        if doc["kind"] in ("Kustomization", "ScaledObject"):  # not core APIs (kustomize, KEDA's CRD)
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name} {doc['kind']} {doc['metadata']['name']} (Kubernetes {version}): {exc}")
        checked.add(doc["kind"])
    assert {
        "Deployment",
        "Job",
        "PodDisruptionBudget",
        "ConfigMap",
        "Service",
        "PersistentVolumeClaim",
        "NetworkPolicy",
    } <= checked


def test_kubernetes_manifests_fit_together() -> None:
    docs = {(d["kind"], d["metadata"]["name"] if "metadata" in d else name): d for name, d in kubernetes_documents()}
    kustomization = next(d for (kind, _), d in docs.items() if kind == "Kustomization")
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    deployment = docs[("Deployment", "ingest-worker-clicks")]
    scaled = docs[("ScaledObject", "ingest-clicks")]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    pdb = docs[("PodDisruptionBudget", "ingest-worker-clicks")]
    pod = deployment["spec"]["template"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["INGEST_METRICS_PORT"]["value"] == "9400" and env["INGEST_METRICS_HOST"]["value"] == "0.0.0.0"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "secretKeyRef" in env["INGEST_DATABASE_URL"]["valueFrom"]  # never a literal password
    # SIGTERM drains (publish or drop what is in flight) within the grace period.
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 60
    migrate = docs[("Job", "ingest-migrate")]["spec"]["template"]["spec"]["containers"][0]
    assert migrate["args"][:1] == ["migrate"] and "--wait" in migrate["args"]
    # The ConfigMap carries deploy/clicks.toml as it is, and the worker runs that source.
    spec_text = docs[("ConfigMap", "ingest-source-clicks")]["data"]["clicks.toml"]
    assert spec_text == (REPO / "deploy" / "clicks.toml").read_text()
    assert container["args"] == ["worker", tomllib.loads(spec_text)["name"]]
    # The table committers run the same source, read the same store and are scraped like workers.
    committers = docs[("Deployment", "ingest-table-committer-clicks")]
    assert committers["spec"]["replicas"] >= 2
    (committer,) = committers["spec"]["template"]["spec"]["containers"]
    assert committer["args"] == ["table-commit", tomllib.loads(spec_text)["name"]]
    assert docs[("Job", "ingest-table-enable-clicks")]["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "table-enable",
        tomllib.loads(spec_text)["name"],
    ]
    assert {m["mountPath"] for m in committer["volumeMounts"]} == {
        m["mountPath"] for m in container["volumeMounts"]
    } - {"/tmp"}
    service = docs[("Service", "ingest-table-committer-clicks")]
    assert service["spec"]["selector"].items() <= committers["spec"]["template"]["metadata"]["labels"].items()
    # The compactors: the same source and store, their own Spark, scraped like workers.
    compactors = docs[("Deployment", "ingest-compactor-clicks")]
    assert compactors["spec"]["replicas"] >= 2
    (compactor,) = compactors["spec"]["template"]["spec"]["containers"]
    assert compactor["args"][:2] == ["compact", tomllib.loads(spec_text)["name"]] and "--every" in compactor["args"]
    assert {m["mountPath"] for m in compactor["volumeMounts"]} == {m["mountPath"] for m in container["volumeMounts"]}
    compactor_env = {e["name"]: e for e in compactor["env"]}
    assert compactor_env["INGEST_METRICS_PORT"]["value"] == "9400"
    assert compactor_env["INGEST_SPARK_MASTER"]["value"].startswith("local")
    assert "secretKeyRef" in compactor_env["INGEST_DATABASE_URL"]["valueFrom"]
    assert compactor["livenessProbe"]["httpGet"]["path"] == "/healthz" and "readinessProbe" not in compactor
    assert compactors["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60
    service = docs[("Service", "ingest-compactor-clicks")]
    assert service["spec"]["selector"].items() <= compactors["spec"]["template"]["metadata"]["labels"].items()


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's matchLabels and its In / NotIn / Exists expressions, as the API applies them."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]:
            return False
    return True


def test_only_the_scraper_may_reach_the_metrics_port() -> None:
    """Anything that can open connections to the metrics port can keep probes busy; the pods
    that serve it admit only Prometheus, and only on that port (the kubelet's probes come from
    the node, which a NetworkPolicy always admits)."""
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in kubernetes_documents() if "metadata" in d}
    policies = [d for (kind, _), d in docs.items() if kind == "NetworkPolicy"]
    serving = [
        d["spec"]["template"]
        for (kind, _), d in docs.items()
        if kind == "Deployment"
        and any(p["name"] == "metrics" for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", []))
    ]
    assert len(serving) == 3  # the workers, the table committers and the compactors
    for pod in serving:
        applying = [p for p in policies if selects(p["spec"]["podSelector"], pod["metadata"]["labels"])]
        assert applying, f"no NetworkPolicy selects the pods {pod['metadata']['labels']}"
        for policy in applying:
            assert "Ingress" in policy["spec"]["policyTypes"]
            for rule in policy["spec"]["ingress"]:
                # Never an empty `from` (everyone) nor an empty port list (every port).
                assert rule.get("from") and rule.get("ports"), rule
                assert [p["port"] for p in rule["ports"]] == ["metrics"], rule
                for peer in rule["from"]:
                    assert "ipBlock" not in peer and peer.get("podSelector", {}).get("matchLabels"), peer
