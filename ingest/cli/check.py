"""``ingest check``: every dependency a worker of a source needs, asked the way the worker asks
it, one line each, before a fleet is rolled out (or a spec applied: ``ingest source apply
--check``). A worker finds the same problems at its start, one at a time and in its log; the
check lists them all at once and exits with the first failure's exit code (the worker's own
for that failure: 4 for Kafka, 5 for a missing topic, 11 for a catalog, ...).

The checks, in order:

- ``metastore``: reachable, its schema current (exit 7 or 8);
- ``kafka``: the brokers answer the worker's admin settings and accept its credentials, and the
  spec's topics exist (exit 4, 5; a topic Kafka's ACLs do not let the principal describe is
  "not authorized", exit 4: Kafka does not tell such a principal whether it exists);
- ``kafka read``: the worker's consumer settings read a record of each topic (the topic's READ
  permission, the TLS and SASL settings of a fetch) with the source's own group id, as the
  worker's group member has it (a least-privilege ACL allows READ on that group alone), without
  joining the group: partitions assigned, never subscribed, no offset committed
  (``enable.auto.commit`` is pinned off), so the running members see no rebalance;
- ``consumer group``: the source's group can be described (its permission; who is in it now);
- ``spark reader``: the Java client properties of Spark's Kafka reader can be derived from the
  worker's (exit 2 naming what cannot: ingest.kafka_java);
- ``spark master``: a Spark Connect server or standalone master (``sc://``, ``spark://``)
  accepts a connection (a local master is started by the worker itself);
- ``schema registry``: for a registry format, the registry answers with the credentials given;
- ``segment store``: a file can be written, read and deleted where the segments go;
- ``table catalog``: a spec's ``[table]`` catalog answers (exit 11);
- ``spark`` (``--spark`` only; it starts Spark): a build of a few of the newest records, read by
  Spark's executors from Kafka with the derived properties, parsed and written as the worker
  would, then deleted (what Kafka refusing the reader's credentials looks like: exit 4).

A check that cannot run because an earlier one failed (no topic to read) is skipped, and says
which. Kafka's ACL refusals (TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED) are "not
authorized" lines naming the topic or group and the ACL missing (ingest.kafka_auth).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from ingest.config import Settings, admin_config, kafka_client, kafka_error, validator_config
from ingest.errors import ConfigError, ExitCode, IngestError, KafkaUnavailable
from ingest.kafka_auth import cluster_metadata, describe_refused, not_authorized, refuses_topic, topic_not_authorized
from ingest.spec.model import SourceSpec
from ingest.topics import fetch_source_topics, source_topics
from ingest_common.errors import first_line

#: How long the read check waits for a record (or an error) of each topic.
READ_WAIT_S = 10.0
#: How many of the newest records the ``--spark`` check builds.
SPARK_CHECK_RECORDS = 10
#: A describe of the group answered by a coordinator that is not ready yet: asked again.
_COORDINATOR_MOVING = frozenset(
    {KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR}
)


class CheckStatus(Enum):
    OK = "ok"
    FAILED = "FAILED"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    status: CheckStatus
    detail: str
    exit_code: ExitCode = ExitCode.OK

    def line(self, width: int) -> str:
        return f"{self.status.value:<7} {self.name:<{width}}  {self.detail}"

    def to_json(self) -> dict[str, object]:
        return {"check": self.name, "status": self.status.value, "detail": self.detail, "exit_code": self.exit_code}


class Checks:
    """The results so far; each check runs through :meth:`run`, which turns the project's
    errors (and any other, named) into a failed line instead of the end of the command."""

    def __init__(self) -> None:
        self.results: list[CheckResult] = []

    def run(self, name: str, check: Callable[[], str]) -> bool:
        try:
            detail = check()
        except IngestError as exc:
            self.results.append(CheckResult(name, CheckStatus.FAILED, first_line(exc), exc.exit_code))
            return False
        except Exception as exc:  # a client's own error: still one line, never a traceback
            detail = f"{type(exc).__name__}: {first_line(exc)}"
            self.results.append(CheckResult(name, CheckStatus.FAILED, detail, ExitCode.FAILED))
            return False
        self.results.append(CheckResult(name, CheckStatus.OK, detail))
        return True

    def skip(self, name: str, why: str) -> None:
        self.results.append(CheckResult(name, CheckStatus.SKIPPED, why))

    @property
    def exit_code(self) -> ExitCode:
        failed = [r.exit_code for r in self.results if r.status is CheckStatus.FAILED]
        return failed[0] if failed else ExitCode.OK

    def lines(self) -> list[str]:
        width = max((len(r.name) for r in self.results), default=0)
        return [r.line(width) for r in self.results]


def run_checks(settings: Settings, spec: SourceSpec, *, spark: bool = False) -> Checks:
    checks = Checks()
    checks.run("metastore", lambda: check_metastore(settings))
    kafka_ok = checks.run("kafka", lambda: check_kafka(settings, spec))
    if kafka_ok:
        checks.run("kafka read", lambda: check_read(settings, spec))
        checks.run("consumer group", lambda: check_group(settings, spec))
    else:
        checks.skip("kafka read", "the kafka check failed")
        checks.skip("consumer group", "the kafka check failed")
    checks.run("spark reader", lambda: check_reader_properties(settings))
    checks.run("spark master", lambda: check_master(settings))
    if spec.registry is not None:
        checks.run("schema registry", lambda: check_registry(spec))
    checks.run("segment store", lambda: check_store(spec))
    if spec.table.external:
        checks.run("table catalog", lambda: check_catalog(settings, spec))
    if spark:
        if kafka_ok:
            checks.run("spark", lambda: check_spark(settings, spec))
        else:
            checks.skip("spark", "the kafka check failed")
    return checks


def check_metastore(settings: Settings) -> str:
    from metastore import redact_url
    from metastore.migrations import require_current_schema

    require_current_schema(settings.database_url)
    return f"{redact_url(settings.database_url)}: schema current"


def _security(settings: Settings) -> str:
    props = settings.kafka_properties
    protocol = str(props.get("security.protocol", "PLAINTEXT")).upper()
    mechanism = props.get("sasl.mechanism") or props.get("sasl.mechanisms")
    return f"{protocol}, {mechanism}" if mechanism and protocol.startswith("SASL") else protocol


def check_kafka(settings: Settings, spec: SourceSpec) -> str:
    metadata = cluster_metadata(settings)
    counts = source_topics(spec, metadata, settings.kafka_bootstrap, lambda topic: describe_refused(settings, topic))
    found = ", ".join(f"{topic} ({n} partitions)" for topic, n in counts.items())
    if spec.topic_pattern:
        # A pattern may match no topic yet: the workers take each one as it appears.
        found = f"{spec.topic_pattern!r} matches {len(counts)} topic(s)" + (f": {found}" if found else "")
    brokers = len(metadata.brokers)
    return f"{settings.kafka_bootstrap} ({_security(settings)}, {brokers} broker(s)): {found}"


@contextlib.contextmanager
def _consumer(settings: Settings, group_id: str) -> Iterator[Consumer]:
    errors: list[KafkaError] = []
    consumer = kafka_client(Consumer, {**validator_config(settings, group_id), "error_cb": errors.append})
    try:
        yield consumer
    finally:
        consumer.close()


def check_read(settings: Settings, spec: SourceSpec) -> str:
    """A record of each topic (its fullest partition's earliest), read committed: what the
    validator's and Spark's consumers need of the brokers. With the source's group id (a
    least-privilege ACL allows that group alone: librdkafka looks its coordinator up as soon as
    a consumer has a group id, and a group the principal may not use is an error of every
    poll), but outside the group: assign() only, so no JoinGroup or heartbeat, and no offset is
    committed (PROTOCOL_PROPERTIES pins auto commit off) or fetched (every position is given)."""
    done = []
    with _consumer(settings, spec.group_id) as consumer:
        for topic in fetch_source_topics(settings, spec):
            done.append(_read_one(consumer, topic, spec.group_id, settings.kafka_bootstrap))
    return "; ".join(done)


def _read_one(consumer: Consumer, topic: str, group: str, bootstrap: str) -> str:
    meta = consumer.list_topics(topic, timeout=READ_WAIT_S).topics[topic]
    if refuses_topic(meta.error):
        raise topic_not_authorized(topic, bootstrap)
    best: tuple[int, int, int] | None = None
    for partition in meta.partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=READ_WAIT_S)
        if high > low and (best is None or high - low > best[2] - best[1]):
            best = (partition, low, high)
    if best is None:
        # Nothing to read: a fetch at the end still asks for the topic, so a refusal shows.
        tp = TopicPartition(topic, (meta.partitions and min(meta.partitions)) or 0, -1)  # OFFSET_END
    else:
        tp = TopicPartition(topic, best[0], best[1])
    consumer.assign([tp])
    deadline = time.monotonic() + (READ_WAIT_S if best is not None else 2.0)
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                refusal = not_authorized(error, bootstrap, group=group, topic=message.topic() or topic)
                if refusal is not None:
                    raise refusal
                raise KafkaUnavailable(f"reading {topic}[{tp.partition}] failed: {error.str()}")
            if error is None:
                return f"{topic}: read offset {message.offset()} of partition {message.partition()}"
        if best is None:
            return f"{topic}: empty, asked without refusal"
        raise KafkaUnavailable(
            f"reading {topic}[{tp.partition}] from offset {tp.offset} gave no record within {READ_WAIT_S:g} s"
            " (an open transaction holds the last stable offset, or fetches fail: see the broker's log)"
        )
    finally:
        consumer.unassign()


def check_group(settings: Settings, spec: SourceSpec) -> str:
    admin = kafka_client(AdminClient, admin_config(settings))
    group = spec.group_id
    deadline = time.monotonic() + READ_WAIT_S
    while True:
        try:
            description = admin.describe_consumer_groups([group], request_timeout=READ_WAIT_S)[group].result()
            break
        except KafkaException as exc:
            error = kafka_error(exc)
            if error is not None and (refusal := not_authorized(error, settings.kafka_bootstrap, group=group)):
                raise refusal from exc
            if error is not None and error.code() in _COORDINATOR_MOVING and time.monotonic() < deadline:
                time.sleep(0.5)  # a coordinator still loading the group log (a broker just started)
                continue
            text = error.str() if error is not None else str(exc)
            raise KafkaUnavailable(f"consumer group {group!r}: {text}") from exc
    state = str(description.state).rsplit(".", 1)[-1].lower()
    return f"{group}: {state}, {len(description.members)} member(s)"


def check_reader_properties(settings: Settings) -> str:
    from ingest.kafka_java import java_client_properties

    java = java_client_properties(settings.kafka_properties, settings.spark_reader_properties)
    protocol = java.get("security.protocol", "PLAINTEXT")
    return f"{len(java)} Java client properties derived (security.protocol={protocol})"


def check_master(settings: Settings) -> str:
    import socket
    from urllib.parse import urlsplit

    from ingest.errors import SparkUnavailable

    master = settings.spark_master
    if not master.startswith(("sc://", "spark://")):
        return f"{master}: started in the worker's own process (--spark starts it)"
    where = urlsplit(master.split(",")[0].split(";")[0])
    host, port = where.hostname or "", where.port or (15002 if master.startswith("sc://") else 7077)
    try:
        socket.create_connection((host, port), timeout=READ_WAIT_S / 2).close()
    except OSError as exc:
        raise SparkUnavailable(master, exc) from exc
    return f"{master}: accepts connections"


def check_registry(spec: SourceSpec) -> str:
    from ingest.formats.registry import registry_client

    registry = spec.registry
    assert registry is not None
    try:
        subjects = set(registry_client(registry).get_subjects())
    except Exception as exc:  # the client's transport and HTTP errors alike
        raise ConfigError(f"schema registry at {registry.url}: {first_line(exc)}") from exc
    named = sorted({registry.subject(t) for t in spec.topics or (spec.topic_pattern,)})
    missing = [s for s in named if s not in subjects]
    where = f"{registry.url}: {len(subjects)} subject(s)"
    if not missing:
        return where
    # Writers register a subject with their first record: none yet is no failure.
    return where + f"; no {', '.join(missing)} yet (registered by the first writer)"


def check_store(spec: SourceSpec) -> str:
    from ingest.segments import store as segment_store

    probe = f"{spec.segment_store.rstrip('/')}/{spec.name}/_check/{uuid.uuid4()}"
    fs, path = segment_store.filesystem(probe)
    payload = b"ingest check\n"
    segment_store.ensure_parent(probe)
    with fs.open_output_stream(path) as out:
        out.write(payload)
    try:
        with fs.open_input_stream(path) as src:
            if src.read() != payload:
                raise ConfigError(f"segment store {spec.segment_store}: a file written there read back changed")
    finally:
        segment_store.delete(probe)
    return f"{spec.segment_store}: written, read and deleted a file"


def check_catalog(settings: Settings, spec: SourceSpec) -> str:
    from ingest.table.catalog import close_catalog, open_catalog

    catalog = open_catalog(settings.database_url, spec.table)
    try:
        return f"{spec.table.describe()}: answers"
    finally:
        close_catalog(catalog)


def check_spark(settings: Settings, spec: SourceSpec) -> str:
    from ingest.cli.check_spark import build_newest

    return build_newest(settings, spec, SPARK_CHECK_RECORDS)
