"""Secured brokers: one real Apache Kafka broker of this module's own with a SASL_SSL listener
(SCRAM-SHA-512, PLAIN, OAUTHBEARER) and a mutual TLS one, its certificates made at test time
(tests.fixtures.servers.secure_kafka). The worker's group member, its admin client, its
validator, its group-offset commits, ``ingest status`` and Spark's Kafka reader all connect
with the one set of settings; a refused credential stops the worker at start in one line
(exit 4); the secrets show nowhere."""

from __future__ import annotations

import base64
import json
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from ingest.builder.job import BuilderFactory, SparkSegmentBuilder
from ingest.builder.kafka_read import KafkaReader
from ingest.consume.log_offsets import AdminLogOffsets
from ingest.errors import KafkaUnavailable
from ingest.kafka_java import java_client_properties
from ingest.spec.parse import load_spec_file
from ingest.worker import Worker
from ingest_common.model import TopicPartition
from ingest_dev.ingest_process import IngestProcess
from ingest_dev.kafka_clients import create_topic, end_offsets
from ingest_dev.process import run_process
from ingest_dev.testkit import free_port, wait_until
from metastore import Metastore
from tests.acceptance.harness import (
    REPO,
    Produced,
    StartWorker,
    ThreadWorker,
    apply_spec,
    assert_exactly_once,
    kafka_prop_env,
    process_env,
    settings,
    showing,
    write_spec,
)
from tests.fakes import RecordingRegistrar
from tests.fixtures.servers import SecureKafka
from tests.kafka_splits import split_of


def _source(
    tmp_path: Path, database_url: str, kafka: SecureKafka, partitions: int, records: int
) -> tuple[str, Produced]:
    """A new topic on the secured broker (made and filled over its PLAINTEXT listener) and a
    JSON source over it."""
    topic = f"secure-{time.monotonic_ns()}"
    create_topic(kafka.bootstrap, topic, partitions)
    produced = Produced(kafka.bootstrap, topic, partitions)
    produced.produce(records)
    source, spec = write_spec(tmp_path, topic, max_age="200ms")
    apply_spec(database_url, spec)
    return source, produced


def _group_offsets(bootstrap: str, group: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=10)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.offset >= 0}


def test_a_worker_on_scram_publishes_exactly_once_and_its_password_shows_nowhere(
    tmp_path: Path, database_url: str, secure_kafka: SecureKafka
) -> None:
    """``ingest worker`` on SASL_SSL + SCRAM-SHA-512, its password read from a file: the warm-up
    and the builds (Spark's reader), the group member, the admin client's log ends, the
    validator and the group-offset commits all authenticate, and everything is published once.
    The password is in none of: the worker's log, ``ingest status --json`` (whose own consumer
    authenticates too), ``/metrics``, Spark's event log (its configuration, every job's plan:
    what Spark's UI shows)."""
    source, produced = _source(tmp_path, database_url, secure_kafka, partitions=3, records=600)
    secret = tmp_path / "kafka-password"
    secret.write_text(secure_kafka.scram_password + "\n")  # as `echo` writes it: the line end is no part of it
    props = secure_kafka.scram()
    del props["sasl.password"]
    events = tmp_path / "spark-events"
    events.mkdir()
    spark_conf = tmp_path / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir file://{events}\nspark.eventLog.compress false\n"
    )
    port = free_port()
    env = process_env(
        database_url,
        secure_kafka.broker.sasl_ssl_bootstrap,
        **kafka_prop_env(props),
        INGEST_KAFKA_PROP_SASL_PASSWORD_FILE=str(secret),
        INGEST_METRICS_PORT=str(port),
        INGEST_WARM_UP_RECORDS="200",
        SPARK_CONF_DIR=str(spark_conf),
    )
    worker = IngestProcess.worker(env, source, tmp_path, "scram")
    try:
        with Metastore(database_url) as store:
            wait_until(lambda: produced.caught_up(store, source), 180, "the worker to publish every record")
        group = f"ingest-{source}"
        wait_until(lambda: _group_offsets(secure_kafka.bootstrap, group) == produced.ends, 30, "the group's offsets")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        status = run_process(
            [sys.executable, "-m", "ingest", "status", source, "--json"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        worker.stop()
    assert worker.poll() == 0, worker.log_tail()
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["kafka_reachable"] is True and document["total_lag"] == 0, document
    assert_exactly_once(database_url, source, produced)
    assert worker.has_event("spark_warmed_up"), worker.log_tail()  # Spark's reader read before the group was joined
    log = worker.log_path.read_text()
    spark_events = "".join(p.read_text() for p in events.rglob("*") if p.is_file())
    assert "SparkListenerEnvironmentUpdate" in spark_events and "SparkListenerSQLExecutionStart" in spark_events
    assert "ingest_segments_published_total" in metrics
    shown = {
        "log": log,
        "status": status.stdout + status.stderr,
        "metrics": metrics,
        "spark events": spark_events,
    }
    assert showing(secure_kafka.scram_password, shown) == []


def test_a_worker_on_mutual_tls_publishes_exactly_once(
    database_url: str,
    secure_kafka: SecureKafka,
    tmp_path: Path,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    """Mutual TLS with a client key encrypted under ``ssl.key.password``: librdkafka reads it as
    it is; Spark's reader gets it decrypted and inline (the Java client on Java 17 reads no
    PBES2-encrypted PEM key), so the builds read over the same certificate."""
    source, produced = _source(tmp_path, database_url, secure_kafka, partitions=2, records=400)
    worker = start_worker(
        settings(
            database_url,
            secure_kafka.broker.ssl_bootstrap,
            kafka_properties={**secure_kafka.mtls(encrypted_key=True), "session.timeout.ms": "6000"},
        ),
        source,
        spark_builder,
    )
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 90, "the worker to publish every record")
    wait_until(
        lambda: _group_offsets(secure_kafka.bootstrap, f"ingest-{source}") == produced.ends, 30, "the group's offsets"
    )
    worker.stop()
    assert worker.error is None, worker.error
    assert_exactly_once(database_url, source, produced)


def unsecured_token(config: str) -> tuple[str, float]:
    """``INGEST_KAFKA_OAUTH_CB`` for the tests: an unsigned JWT for the subject ``config`` names
    (``sub=NAME``), which the test broker's default OAUTHBEARER validator accepts; AWS MSK IAM's
    signer stands here in production (docs/configuration.md#aws-msk-iam-untested-here)."""
    subject = dict(pair.split("=", 1) for pair in config.split())["sub"]
    now = time.time()

    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    token = f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': int(now), 'exp': int(now) + 3600})}."
    return token, now + 3600


def test_a_worker_authenticates_with_tokens_from_its_oauth_callback(
    database_url: str,
    secure_kafka: SecureKafka,
    tmp_path: Path,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    """OAUTHBEARER as AWS MSK IAM is set up: every librdkafka client gets its tokens from the
    callback ``INGEST_KAFKA_OAUTH_CB`` names, Spark's reader logs in with a login module of its
    own (``INGEST_SPARK_KAFKA_PROP_SASL_JAAS_CONFIG``)."""
    source, produced = _source(tmp_path, database_url, secure_kafka, partitions=2, records=200)
    props = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.config": "sub=ingest",
        "ssl.ca.location": str(secure_kafka.certificates.ca),
        "session.timeout.ms": "6000",
    }
    login = (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required"
        ' unsecuredLoginStringClaim_sub="ingest";'
    )
    worker = start_worker(
        settings(
            database_url,
            secure_kafka.broker.sasl_ssl_bootstrap,
            kafka_properties=props,
            kafka_oauth_cb=f"{__name__}:unsecured_token",
            spark_reader_properties={"sasl.jaas.config": login},
        ),
        source,
        spark_builder,
    )
    with Metastore(database_url) as store:
        wait_until(lambda: produced.caught_up(store, source), 90, "the worker to publish every record")
    wait_until(
        lambda: _group_offsets(secure_kafka.bootstrap, f"ingest-{source}") == produced.ends, 30, "the group's offsets"
    )
    worker.stop()
    assert worker.error is None, worker.error
    assert_exactly_once(database_url, source, produced)


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("wrong password", "SASL authentication error"),
        ("untrusted broker certificate", "certificate verify failed"),
        ("client certificate the broker rejects", "bad certificate"),
    ],
)
def test_a_refused_credential_stops_the_worker_at_start_in_one_line(
    tmp_path: Path, database_url: str, secure_kafka: SecureKafka, case: str, says: str
) -> None:
    """Exit 4 (KafkaUnavailable) with librdkafka's reason, within seconds: not a retry loop that
    looks like an outage, and not before it ran out a 10 s metadata timeout either."""
    source, _produced = _source(tmp_path, database_url, secure_kafka, partitions=1, records=1)
    wrong = "wr0ng-Pa55word"
    if case == "wrong password":
        bootstrap, props = secure_kafka.broker.sasl_ssl_bootstrap, secure_kafka.scram(password=wrong)
    elif case == "untrusted broker certificate":
        bootstrap, props = secure_kafka.broker.ssl_bootstrap, secure_kafka.mtls(ca=secure_kafka.certificates.rogue_ca)
    else:
        bootstrap, props = secure_kafka.broker.ssl_bootstrap, secure_kafka.mtls(rogue=True)
    env = process_env(database_url, bootstrap, **kafka_prop_env(props))
    started = time.monotonic()
    result = run_process(
        [sys.executable, "-m", "ingest", "worker", source],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert result.returncode == 4, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ingest: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"Kafka at {bootstrap} refused the worker's credentials" in errors[0] and says in errors[0], errors[0]
    assert wrong not in result.stderr
    # The reason once in the error line, and librdkafka's own lines about it: a few, no loop.
    assert len(result.stderr.splitlines()) <= 6, result.stderr
    assert took < 9, f"{took:.1f} s: the metadata request's 10 s timeout was waited out"


def test_check_on_scram_reads_and_a_wrong_password_is_its_kafka_line(
    tmp_path: Path, database_url: str, secure_kafka: SecureKafka
) -> None:
    """``ingest check`` connects as the worker does: with the right SCRAM password it reads a
    record over SASL_SSL and derives Spark's reader's settings; with a wrong one its kafka line
    fails with the refusal (exit 4), what needs Kafka is skipped, and the password shows nowhere."""
    source, _produced = _source(tmp_path, database_url, secure_kafka, partitions=2, records=10)
    bootstrap = secure_kafka.broker.sasl_ssl_bootstrap

    def check(password: str) -> Any:
        env = process_env(database_url, bootstrap, **kafka_prop_env(secure_kafka.scram(password=password)))
        return run_process(
            [sys.executable, "-m", "ingest", "check", source],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=90,
        )

    good = check(secure_kafka.scram_password)
    assert good.returncode == 0, (good.stdout, good.stderr)
    assert "SASL_SSL, SCRAM-SHA-512" in good.stdout and "read offset 0" in good.stdout, good.stdout
    assert "security.protocol=SASL_SSL" in good.stdout
    wrong = "wr0ng-Pa55word"
    bad = check(wrong)
    assert bad.returncode == 4, (bad.stdout, bad.stderr)
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "refused the worker's credentials" in failed[0], bad.stdout
    assert "SASL authentication error" in failed[0], failed[0]
    assert [line.split()[1] for line in bad.stdout.splitlines() if line.startswith("skipped")] == ["kafka", "consumer"]
    assert wrong not in bad.stdout + bad.stderr and "Traceback" not in bad.stderr


def test_a_refusal_the_group_member_meets_stops_the_worker(
    database_url: str,
    secure_kafka: SecureKafka,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spark_builder: BuilderFactory,
) -> None:
    """Credentials refused only once the worker runs (the start's metadata answered: a broker
    that took them then, a password changed since): its group member's error raises out of
    its poll and the worker stops with KafkaUnavailable, instead of polling on and logging."""
    source, _produced = _source(tmp_path, database_url, secure_kafka, partitions=2, records=10)
    topic = load_spec_file(next(tmp_path.glob("*.toml")))[0].topics[0]
    monkeypatch.setattr("ingest.worker.fetch_source_topics", lambda _settings, _spec: {topic: 2})
    refused = settings(
        database_url,
        secure_kafka.broker.sasl_ssl_bootstrap,
        kafka_properties=secure_kafka.scram(password="wr0ng-Pa55word"),
    )
    worker = ThreadWorker(refused, source, spark_builder)
    worker.thread.start()
    worker.thread.join(30)
    polling = worker.thread.is_alive()
    if polling:
        worker.stop()
    assert not polling, "the worker kept polling a broker that refuses its credentials"
    assert isinstance(worker.error, KafkaUnavailable), worker.error
    assert re.search(r"refused the worker's (group member|validator)'s credentials", str(worker.error)), worker.error
    assert "SASL authentication error" in str(worker.error)


def test_spark_reader_reads_over_plain_with_a_password_a_jaas_line_must_escape(
    spark: Any, secure_kafka: SecureKafka
) -> None:
    """PLAIN (Confluent Cloud's API keys): the JAAS line derived for Spark's reader escapes the
    password's quote and backslash, as the broker's check of it proves."""
    assert '"' in secure_kafka.plain_password and "\\" in secure_kafka.plain_password
    topic = f"plain-{time.monotonic_ns()}"
    create_topic(secure_kafka.bootstrap, topic, 1)
    Produced(secure_kafka.bootstrap, topic, 1).produce(7)
    reader = KafkaReader.of(
        secure_kafka.broker.sasl_ssl_bootstrap, "plain-test", java_client_properties(secure_kafka.plain(), {})
    )
    assert reader.frame(spark, [split_of(TopicPartition(topic, 0), 0, 7)]).count() == 7


def test_a_warm_up_that_kafka_refuses_stops_the_start(spark: Any, secure_kafka: SecureKafka, tmp_path: Path) -> None:
    """Spark's reader refused by the broker (its own properties wrong, the worker's right) at the
    warm-up build: KafkaUnavailable, not a warning and then builds retried without end."""
    topic = f"warm-{time.monotonic_ns()}"
    create_topic(secure_kafka.bootstrap, topic, 1)
    Produced(secure_kafka.bootstrap, topic, 1).produce(20)
    _source_name, path = write_spec(tmp_path, topic)
    spec = load_spec_file(path)[0]
    java = java_client_properties(secure_kafka.scram(), {"sasl.jaas.config": _scram_jaas("wr0ng-Pa55word")})
    reader = KafkaReader.of(secure_kafka.broker.sasl_ssl_bootstrap, "warm-test", java)
    builder = SparkSegmentBuilder(spark, RecordingRegistrar(), reader)
    offsets = AdminLogOffsets(AdminClient({"bootstrap.servers": secure_kafka.bootstrap}))
    assert end_offsets(secure_kafka.bootstrap, topic) == {0: 20}
    with pytest.raises(KafkaUnavailable, match=r"Spark.s Kafka reader.*SaslAuthenticationException"):
        Worker._warm_up(builder, spec, offsets, [TopicPartition(topic, 0)], 10)


def _scram_jaas(password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="ingest" password="{password}";'
