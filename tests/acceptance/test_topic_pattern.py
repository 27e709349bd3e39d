"""A pattern source (spec ``topic_pattern``) as its topics come and go, on worker processes."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from ingest.ops.audit import audit_source
from ingest.ops.status import RETIRED, source_status
from ingest_dev.ingest_process import IngestProcess
from ingest_dev.kafka_clients import delete_topics
from ingest_dev.testkit import wait_until
from ingest_dev.verify import verify_exactly_once
from metastore import Metastore
from tests.acceptance.harness import GROUP_PROTOCOLS, SCHEMA, Produced, apply_spec, process_env, settings
from tests.fixtures.servers import MakeTopic

pytestmark = pytest.mark.process

# Errors a worker logs while a deleted topic's partitions are still assigned to it.
_ERROR_EVENTS = (
    "log_end_query_failed",
    "partition_topic_unknown",
    "topic_watch_failed",
    "assign_failed",
    "split_failed",
    "worker_failed",
)


def _errors(workers: list[IngestProcess]) -> int:
    return sum(1 for w in workers for e in w.events() if e.get("event") in _ERROR_EVENTS)


# The classic member matches the pattern itself (librdkafka, from its metadata); a KIP-848
# member has the broker match it: each matches the whole name (ingest.topics).
@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_a_pattern_source_takes_new_topics_and_retires_deleted_ones(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: MakeTopic, group_protocol: str
) -> None:
    run = uuid.uuid4().hex[:8]
    first, second = (Produced(kafka_bootstrap, make_topic(2, prefix=f"orders.{run}"), 2) for _ in range(2))
    other = Produced(kafka_bootstrap, make_topic(2, prefix=f"payments.{run}"), 2)
    name = "pat" + run
    spec = tmp_path / f"{name}.toml"
    columns = "\n".join(f'{k} = "{v}"' for k, v in SCHEMA.items())
    spec.write_text(
        f'name = "{name}"\ntopic_pattern = "^orders\\\\.{run}-.*"\nevent_time = "ts"\n'
        f'segment_store = "{tmp_path / "store"}"\n[schema]\n{columns}\n[split]\nmax_records = 500\nmax_age = "1s"\n'
    )
    apply_spec(database_url, spec)
    for produced in (first, second, other):
        produced.produce(300)
    env = process_env(
        database_url, kafka_bootstrap, group_protocol, INGEST_TOPIC_REFRESH_S="2", INGEST_WARM_UP_RECORDS="0"
    )
    workers = [IngestProcess.worker(env, name, tmp_path, f"w{i}") for i in range(2)]
    try:
        with Metastore(database_url) as store:

            def caught_up(*topics: Produced) -> bool:
                return all(p.caught_up(store, name) for p in topics)

            wait_until(lambda: caught_up(first, second), 120, "the two matching topics published")
            # A matching topic created while the workers run is taken within the refresh and a rebalance.
            third = Produced(kafka_bootstrap, make_topic(2, prefix=f"orders.{run}"), 2)
            third.produce(300)
            wait_until(lambda: caught_up(third), 60, "the new matching topic published")
            delete_topics(kafka_bootstrap, [first.topic])
            for produced in (second, third, other):
                produced.produce(200)

            def retired() -> bool:
                return all(r["retired_at"] is not None for r in store.partitions(name) if r["topic"] == first.topic)

            wait_until(retired, 60, "the deleted topic's partitions retired")
            wait_until(lambda: caught_up(second, third), 60, "the remaining topics published")
            errors = _errors(workers)
            time.sleep(3)
            # No error loop: nothing more is logged once the deleted topic is gone, both alive.
            assert _errors(workers) == errors
            assert [w.poll() for w in workers] == [None, None]
            status = source_status(store, settings(database_url, kafka_bootstrap), name)
            states = {(p["topic"], p["partition"]): p["state"] for p in status["partitions"]}
            assert {tp: s for tp, s in states.items() if tp[0] == first.topic} == {
                (first.topic, 0): RETIRED,
                (first.topic, 1): RETIRED,
            }
            assert all(s == "OK" for tp, s in states.items() if tp[0] != first.topic), states
            assert other.topic not in {t for t, _ in states}
            assert status["state"] in ("IDLE", "RUNNING"), status["detailed_state"]
    finally:
        for w in workers:
            w.stop(timeout=60)
    assert [w.poll() for w in workers] == [0, 0]
    expected = first.expected() | second.expected() | third.expected()
    with Metastore(database_url) as store:
        result = verify_exactly_once(store, name, expected)
    assert result.ok, result.summary() + f" {result.range_errors[:5]} {result.offset_errors[:5]}"
    assert result.rows == 300 + 500 + 500
    with Metastore(database_url) as store:
        # ``ingest audit``: every partition's published ranges tile, the retired ones' too.
        audit, _snapshot = audit_source(store, name, files=True)
    assert audit.ok and audit.partitions == 6, audit.summary() + str(audit.findings[:3])
