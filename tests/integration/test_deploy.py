"""The deployment files: compose structure, Prometheus config and rules (promtool), and the
dashboard and rules only naming metrics the workers export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from ingest.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"


def exported_names() -> set[str]:
    names: set[str] = set()
    for metric in Metrics("x").registry.collect():
        for sample_suffix in ("", "_total", "_bucket", "_sum", "_count", "_created"):
            names.add(metric.name + sample_suffix)
    return names


def referenced_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(ingest_[a-z_]+)\b", expr))


def test_compose_file_structure() -> None:
    doc: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = doc["services"]
    assert {"kafka", "postgres", "migrate", "source", "producer", "spark-connect", "worker", "prometheus",
            "grafana"} <= set(services)
    worker = services["worker"]
    assert worker["deploy"]["replicas"] >= 2
    assert "container_name" not in worker and "ports" not in worker  # `--scale worker=N` must work
    assert worker["environment"]["INGEST_SPARK_MASTER"].startswith("sc://spark-connect:")
    for name, service in services.items():
        image = service.get("image")
        if image is not None:
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image version ({image})"
        else:
            assert service.get("build") == ".", name
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith("."):
                assert source in doc["volumes"], f"{name}: volume {source} is not declared"
            else:
                assert (REPO / source).exists(), f"{name}: {source} does not exist"
    assert "segments:/data/segments" in services["spark-connect"]["volumes"]  # Spark writes where workers list


def test_dockerfile_installs_what_setup_installs() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11\.\d+-slim-bookworm$", dockerfile, re.MULTILINE)
    assert "openjdk-17-jre-headless" in dockerfile and "pip install" in dockerfile
    assert 'ENTRYPOINT ["ingest"]' in dockerfile


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: scripts/setup.sh installs Debian's prometheus package"
    return subprocess.run([binary, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)


def test_prometheus_config_and_rules_check_and_their_unit_tests_pass() -> None:
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", "rules.yml"),
                 ("test", "rules", "rules_test.yml")):
        result = promtool(*args)
        assert result.returncode == 0, result.stdout + result.stderr


def test_rules_and_dashboard_name_only_exported_metrics() -> None:
    exported = exported_names()
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "ingest.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) > 10
    for expr in exprs:
        unknown = referenced_metrics(expr) - exported - recorded
        assert not unknown, f"{expr!r} names metrics no worker exports: {unknown}"


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
