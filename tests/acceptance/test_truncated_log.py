"""A stored offset above the partition's log end, as an unclean leader election leaves it (the
new leader's log ends below what was consumed from the old one) or a re-created topic: against
the real broker, the worker neither reads from another offset nor skips, under either policy;
it stops the partition with one error line, and ``ingest status`` shows it. The same log once
it has grown past the stored offset again: detected by the leader epoch stored with the
offset (KIP-320), with the same outcome."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.ops.status import source_status
from ingest.ops.status_text import render
from ingest_common.model import TopicPartition
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic, produce_records, record_leader_epochs
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import StartWorker, apply_spec, sample_value, settings, write_spec
from tests.fakes import FakeBuilder

STORED = 50
LOG_END = 10


def logged(line: str, key: str, value: object) -> bool:
    """``key`` logged with ``value`` in the console format or in JSON (once a CLI command in
    this process configured logging)."""
    return f"{key}={value}" in line or f'"{key}": {value}' in line


def test_a_stored_offset_past_the_log_end_stops_the_partition_with_one_error_line_and_status_shows_it(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    start_worker: StartWorker,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, bootstrap = database_url, kafka_bootstrap
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    assert produce_records(bootstrap, topic, ((0, str(i).encode(), sample_value(i)) for i in range(LOG_END))) == {
        0: LOG_END
    }
    # "earliest" would skip a retention gap: a log that ends below the stored offset is no such gap.
    source, spec_path = write_spec(
        tmp_path, topic, max_records=5, max_age="200ms", extra='on_offset_out_of_range = "earliest"'
    )
    apply_spec(url, spec_path)
    with Metastore(url) as store:
        store.register_partitions(source, topic, [0], "earliest")
        store.reset_offsets(
            source,
            {tp: STORED},
            actor="test",
            reason="consumed from the old leader",
            target=str(STORED),
            confirmed=True,
        )

    builder = FakeBuilder()  # records every split it is given: none may come
    capsys.readouterr()
    worker = start_worker(settings(url, bootstrap), source, lambda _registrar, _reader: builder)
    with Metastore(url) as store:
        wait_until(
            lambda: any(e["kind"] == "OFFSET_OUT_OF_RANGE" for e in store.recent_errors(source)),
            120,
            "the worker's error report",
        )
        status = source_status(store, settings(url, bootstrap), source)
        assert store.gaps(source) == [] and store.segments(source) == []
        assert [r["next_offset"] for r in store.partitions(source)] == [STORED]
    assert worker.error is None and worker.thread.is_alive()
    assert worker.consumed() == 0 and builder.built == []
    worker.stop()
    # The log lines: on stderr once any CLI command of this process configured logging.
    out = "".join(capsys.readouterr())

    # ingest status: the partition is stopped, not caught up (its lag reads 0).
    p0 = status["partitions"][0]
    assert (p0["state"], p0["past_log_end"], p0["next_offset"], p0["high_watermark"]) == (
        "OFFSET_OUT_OF_RANGE",
        True,
        STORED,
        LOG_END,
    )
    assert (status["state"], status["detailed_state"]) == ("UNHEALTHY", "OFFSET_OUT_OF_RANGE")
    assert [e["message"] for e in status["recent_errors"]] == [
        f"{tp}: stored offset {STORED} is past the log end {LOG_END} (an unclean leader election truncated"
        " the log, or the topic was re-created); partition stopped, nothing skipped; `ingest reset` resumes it"
    ]
    text = "\n".join(render(status))
    assert f"next offset {STORED} is past the log end {LOG_END}" in text

    # One error line, with the numbers an operator needs.
    lines = [line for line in out.splitlines() if "offset_out_of_range" in line]
    assert len(lines) == 1, out
    assert all(logged(lines[0], k, v) for k, v in (("stored", STORED), ("high_watermark", LOG_END))), lines[0]


PUBLISHED = 20  # records published from the first leader's log
AFTER = 30  # records produced after the log was lost: the log end passes PUBLISHED again


def test_a_log_truncated_below_the_stored_offset_and_grown_past_it_again_stops_the_partition(
    tmp_path: Path,
    database_url: str,
    private_kafka: LocalKafka,
    start_worker: StartWorker,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """KIP-320 against the real broker: a worker publishes [0, 20) under leader epoch E and
    stops; the broker loses the partition's log (stopped, its directory deleted, started: the
    leader epoch goes up) and 30 new records take offsets 0..29. The next worker is assigned
    the partition at the stored offset 20 with epoch E: it must neither resume at 20 (which
    would skip the new records at [0, 20) and mix two logs in one partition) nor re-read. The
    partition stops under either policy, the lost range is recorded as a gap with its reason,
    one error line, and ``ingest status`` shows LOG_TRUNCATED."""
    url, bootstrap = database_url, private_kafka.bootstrap
    topic = f"lost-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    tp = TopicPartition(topic, 0)
    produce_records(bootstrap, topic, ((0, str(i).encode(), sample_value(i)) for i in range(PUBLISHED)))
    # "earliest" would skip a retention gap: a truncated log is no such gap.
    source, spec_path = write_spec(
        tmp_path, topic, max_records=5, max_age="200ms", extra='on_offset_out_of_range = "earliest"'
    )
    apply_spec(url, spec_path)
    fast = settings(url, bootstrap, kafka_properties={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"})

    first = start_worker(fast, source, FakeBuilder)
    with Metastore(url) as store:
        wait_until(lambda: [r["next_offset"] for r in store.partitions(source)] == [PUBLISHED], 120, "20 published")
        [row] = store.partitions(source)
        segments = len(store.segments(source))
    first.stop()
    [epoch] = record_leader_epochs(bootstrap, topic, 0)
    assert row["leader_epoch"] == epoch  # the epoch of the record at 19, stored with 20

    private_kafka.lose_partition_log(topic, 0)
    produce_records(bootstrap, topic, ((0, str(i).encode(), sample_value(1000 + i)) for i in range(AFTER)))
    [new_epoch] = record_leader_epochs(bootstrap, topic, 0)
    assert new_epoch > epoch

    builder = FakeBuilder()  # records every split it is given: none may come
    capsys.readouterr()
    second = start_worker(fast, source, lambda _registrar, _reader: builder)
    with Metastore(url) as store:
        wait_until(
            lambda: any(e["kind"] == "LOG_TRUNCATED" for e in store.recent_errors(source)),
            120,
            "the worker's error report",
        )
        status = source_status(store, fast, source)
        gaps = [
            (g["partition"], g["from_offset"], g["to_offset"], g["skipped"], g["reason"]) for g in store.gaps(source)
        ]
        assert gaps == [(0, 0, PUBLISHED, False, "log_truncated")]
        assert [r["next_offset"] for r in store.partitions(source)] == [PUBLISHED]
        assert len(store.segments(source)) == segments
    assert second.error is None and second.thread.is_alive()
    assert second.consumed() == 0 and builder.built == []
    second.stop()
    # The log lines: on stderr once any CLI command of this process configured logging.
    out = "".join(capsys.readouterr())

    p0 = status["partitions"][0]
    assert (p0["state"], p0["truncated_range"], p0["next_offset"], p0["high_watermark"]) == (
        "LOG_TRUNCATED",
        [0, PUBLISHED],
        PUBLISHED,
        AFTER,
    )
    assert (status["state"], status["detailed_state"]) == ("UNHEALTHY", "LOG_TRUNCATED")
    [message] = [e["message"] for e in status["recent_errors"]]
    assert f"{tp}: the log was truncated below the stored offset {PUBLISHED} (leader epoch {epoch})" in message
    assert f"[0, {PUBLISHED})" in message
    assert "LOG_TRUNCATED" in "\n".join(render(status))

    lines = [line for line in out.splitlines() if "log_truncated" in line]
    assert len(lines) == 1, out
    assert all(logged(lines[0], k, v) for k, v in (("from_offset", 0), ("to_offset", PUBLISHED))), lines[0]
