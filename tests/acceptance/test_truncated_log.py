"""A stored offset above the partition's log end, as an unclean leader election leaves it (the
new leader's log ends below what was consumed from the old one) or a re-created topic: against
the real broker, the worker neither reads from another offset nor skips, under either policy;
it stops the partition with one error line, and ``ingest status`` shows it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.ops.status import source_status
from ingest.ops.status_text import render
from ingest_common.model import TopicPartition
from ingest_dev.kafka_clients import produce_records
from ingest_dev.testkit import wait_until
from metastore import Metastore
from tests.acceptance.harness import StartWorker, apply_spec, sample_value, settings, write_spec
from tests.fakes import FakeBuilder

STORED = 50
LOG_END = 10


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
    worker = start_worker(settings(url, bootstrap), source, lambda _registrar: builder)
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
    out = capsys.readouterr().out

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
    assert all(f"{k}={v}" in lines[0] for k, v in (("stored", STORED), ("high_watermark", LOG_END))), lines[0]
