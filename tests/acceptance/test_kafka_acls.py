"""Least-privilege Kafka ACLs: a broker of this module's own with an authorizer (KRaft's
StandardAuthorizer, nothing allowed without an ACL) and a SASL_SSL listener, its SCRAM user
allowed READ on the source's topic and READ on the source's consumer group, nothing else. The
worker runs on that (its group member, its validator, Spark's reader, its group-offset commits)
and so does ``ingest check``, which reads with the source's own group id without disturbing the
running member (no rebalance) and commits no offset; an ACL that is missing is "not authorized",
naming the topic or group and the ACL, never "does not exist". The tests' own clients use the
PLAINTEXT listener, whose principal (``User:ANONYMOUS``) is a super user."""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from ingest.cli.check import CheckResult, CheckStatus, run_checks
from ingest.errors import ExitCode
from ingest.spec.model import SourceSpec
from ingest.spec.parse import spec_from_dict
from ingest_dev import certs as test_certs
from ingest_dev.ingest_process import IngestProcess
from ingest_dev.kafka import BrokerSecurity, LocalKafka
from ingest_dev.kafka_clients import create_topic
from ingest_dev.process import run_process
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import (
    REPO,
    SCHEMA,
    Produced,
    apply_spec,
    assert_exactly_once,
    kafka_prop_env,
    process_env,
    settings,
    write_spec,
)

AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    # The PLAINTEXT listener's (the tests' own clients) and the controller's principal.
    "super.users": "User:ANONYMOUS",
}
USER, PASSWORD = "ingest", "acl-Pa55word"


@dataclass(frozen=True)
class AclKafka:
    broker: LocalKafka
    certificates: test_certs.TestCertificates

    @property
    def bootstrap(self) -> str:
        """The PLAINTEXT listener: a super user's."""
        return self.broker.bootstrap

    @property
    def sasl_bootstrap(self) -> str:
        return self.broker.sasl_ssl_bootstrap

    def scram(self) -> dict[str, str]:
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": USER,
            "sasl.password": PASSWORD,
            "ssl.ca.location": str(self.certificates.ca),
        }

    def allow(
        self,
        kind: ResourceType,
        name: str,
        operation: AclOperation,
        pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    ) -> None:
        """An ACL allowing the SCRAM user ``operation`` on ``name``, in force when this returns."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        binding = AclBinding(kind, name, pattern, f"User:{USER}", "*", operation, AclPermissionType.ALLOW)
        for future in admin.create_acls([binding]).values():
            future.result()
        query = AclBindingFilter(
            kind, name, pattern, f"User:{USER}", "*", operation, AclPermissionType.ALLOW
        )  # the broker's authorizer answers it: once it lists the ACL, it applies it
        wait_until(lambda: admin.describe_acls(query).result(), 10, f"the ACL on {name} to apply")

    def committed(self, group: str) -> dict[tuple[str, int], int]:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=10)
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0}


@pytest.fixture(scope="module")
def acl_kafka() -> Iterator[AclKafka]:
    """A broker with an authorizer and a SASL_SSL listener (SCRAM-SHA-512 for ``USER``), its
    certificates made now."""
    with tempfile.TemporaryDirectory(prefix="ingest-acl-certs-") as certs_dir:
        certs = test_certs.make_certificates(Path(certs_dir))
        security = BrokerSecurity(certs, {USER: PASSWORD})
        with LocalKafka(security=security, overrides=AUTHORIZER) as broker:
            yield AclKafka(broker, certs)


def _topic(kafka: AclKafka, prefix: str, records: int, partitions: int = 2) -> Produced:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, partitions)
    produced = Produced(kafka.bootstrap, topic, partitions)
    if records:
        produced.produce(records)
    return produced


def _spec(tmp_path: Path, topic: str, group: str | None = None) -> SourceSpec:
    doc: dict[str, Any] = {
        "name": "s" + uuid.uuid4().hex[:8],
        "topics": [topic],
        "schema": dict(SCHEMA),
        "event_time": "ts",
        "segment_store": str(tmp_path / "store"),
    }
    if group is not None:
        doc["consumer_group"] = group
    return spec_from_dict(doc)


def _checks(database_url: str, kafka: AclKafka, spec: SourceSpec) -> tuple[dict[str, CheckResult], ExitCode]:
    checks = run_checks(settings(database_url, kafka.sasl_bootstrap, kafka_properties=kafka.scram()), spec)
    return {r.name: r for r in checks.results}, checks.exit_code


def _events(worker: IngestProcess, *names: str) -> int:
    return sum(1 for name in names for _ in worker.events(name))


def test_a_worker_and_its_check_run_on_read_acls_for_the_topic_and_the_group_alone(
    tmp_path: Path, database_url: str, acl_kafka: AclKafka
) -> None:
    """READ on the topic and READ on group ``ingest-<source>`` (literal ACLs), nothing else:
    the worker publishes every record once; ``ingest check`` passes beside it (its read uses the
    source's group id, as the member does, without joining: the member is not revoked, no
    rebalance), and the worker goes on publishing what comes after."""
    produced = _topic(acl_kafka, "acl", records=40)
    source, path = write_spec(tmp_path, produced.topic, max_age="200ms")
    apply_spec(database_url, path)
    group = f"ingest-{source}"
    acl_kafka.allow(ResourceType.TOPIC, produced.topic, AclOperation.READ)
    acl_kafka.allow(ResourceType.GROUP, group, AclOperation.READ)
    env = process_env(database_url, acl_kafka.sasl_bootstrap, **kafka_prop_env(acl_kafka.scram()))
    worker = IngestProcess.worker(env, source, tmp_path, "acl")
    try:
        with Metastore(database_url) as store:
            wait_until(lambda: produced.caught_up(store, source), 180, "the worker to publish every record")
        rebalances = _events(worker, "partitions_assigned", "partitions_revoked", "partitions_lost")
        assert rebalances == 1, worker.log_tail()

        check = run_process(
            [sys.executable, "-m", "ingest", "check", source],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert check.returncode == 0, (check.stdout, check.stderr)
        assert all(line.startswith("ok ") for line in check.stdout.splitlines() if line.strip()), check.stdout
        assert f"{produced.topic}: read offset 0" in check.stdout, check.stdout
        assert f"{group}: stable, 1 member(s)" in check.stdout, check.stdout

        produced.produce(40)
        with Metastore(database_url) as store:
            wait_until(lambda: produced.caught_up(store, source), 120, "the worker to publish what came after")
        # Still the one assignment: the check's consumer never joined the group.
        time.sleep(1)
        assert _events(worker, "partitions_assigned", "partitions_revoked", "partitions_lost") == 1, worker.log_tail()
    finally:
        worker.stop()
    assert worker.poll() == 0, worker.log_tail()
    assert_exactly_once(database_url, source, produced)


def test_a_missing_acl_is_not_authorized_naming_it_and_a_missing_topic_does_not_exist(
    tmp_path: Path, database_url: str, acl_kafka: AclKafka
) -> None:
    """Each ACL the worker needs, missing in turn, is one ``not authorized`` line naming the
    topic or group and the ACL (exit 4); a topic that does not exist, asked by a principal
    allowed to describe it, is ``does not exist`` (exit 5). The check's reads commit nothing."""
    readable = _topic(acl_kafka, "acl-read", records=5)
    hidden = _topic(acl_kafka, "acl-hidden", records=5)
    described = _topic(acl_kafka, "acl-described", records=5)
    open_prefix = f"acl-open-{uuid.uuid4().hex[:8]}-"
    group = f"acl-group-{uuid.uuid4().hex[:8]}"
    acl_kafka.allow(ResourceType.TOPIC, readable.topic, AclOperation.READ)
    acl_kafka.allow(ResourceType.TOPIC, described.topic, AclOperation.DESCRIBE)
    acl_kafka.allow(ResourceType.TOPIC, open_prefix, AclOperation.DESCRIBE, ResourcePatternType.PREFIXED)
    acl_kafka.allow(ResourceType.GROUP, group, AclOperation.READ)

    # Everything allowed: every Kafka line ok, and no offset committed for the group.
    lines, code = _checks(database_url, acl_kafka, _spec(tmp_path, readable.topic, group))
    assert code is ExitCode.OK, lines
    assert "read offset 0" in lines["kafka read"].detail
    assert lines["consumer group"].detail.startswith(f"{group}: ")
    assert acl_kafka.committed(group) == {}

    # A topic the principal may not describe, existing or not: Kafka does not say which.
    for topic in (hidden.topic, f"acl-none-{uuid.uuid4().hex[:8]}"):
        lines, code = _checks(database_url, acl_kafka, _spec(tmp_path, topic, group))
        kafka = lines["kafka"]
        assert kafka.status is CheckStatus.FAILED and kafka.exit_code == code == ExitCode.KAFKA_UNAVAILABLE, kafka
        assert f"topic {topic!r}: not authorized (TOPIC_AUTHORIZATION_FAILED" in kafka.detail, kafka.detail
        assert f"no ACL allowing DESCRIBE on topic {topic!r}" in kafka.detail, kafka.detail
        assert "does not exist" not in kafka.detail
        assert lines["kafka read"].status is CheckStatus.SKIPPED

    # A topic that does not exist, asked by a principal that may describe it.
    missing = f"{open_prefix}missing"
    lines, code = _checks(database_url, acl_kafka, _spec(tmp_path, missing, group))
    assert code is ExitCode.TOPIC_NOT_FOUND, lines
    assert lines["kafka"].detail == f"topic {missing!r} does not exist on {acl_kafka.sasl_bootstrap}"

    # DESCRIBE without READ: its metadata answers, its fetch is refused.
    lines, code = _checks(database_url, acl_kafka, _spec(tmp_path, described.topic, group))
    assert lines["kafka"].status is CheckStatus.OK, lines["kafka"]
    read = lines["kafka read"]
    assert (read.status, code) == (CheckStatus.FAILED, ExitCode.KAFKA_UNAVAILABLE), read
    assert f"no ACL allowing READ on topic {described.topic!r}" in read.detail, read.detail

    # A group without an ACL: the read (its coordinator's lookup) and the describe both say so.
    other = f"acl-other-{uuid.uuid4().hex[:8]}"
    lines, code = _checks(database_url, acl_kafka, _spec(tmp_path, readable.topic, other))
    assert code is ExitCode.KAFKA_UNAVAILABLE, lines
    for name in ("kafka read", "consumer group"):
        line = lines[name]
        assert line.status is CheckStatus.FAILED, line
        assert f"consumer group {other!r}: not authorized (GROUP_AUTHORIZATION_FAILED" in line.detail, line.detail
        assert f"no ACL allowing READ on group {other!r}" in line.detail, line.detail
    assert acl_kafka.committed(group) == {}
