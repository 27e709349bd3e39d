"""The peer: Quix Streams reading the benchmark topic into local Parquet files (at-least-once).

Runs as a plain script under the Python that has ``quixstreams`` installed, which is *not*
the project's environment: quixstreams 3.28 requires ``confluent-kafka<2.13`` and the
project pins 2.16.1, so the peer lives in its own virtualenv (``python -m bench
--setup-peer``).  This file therefore imports nothing from ``bench`` or ``ingest``.

    <quix-python> bench/peers/quix_app.py --bootstrap H:P --topic T --group G --expected N
        --directory DIR --commit-interval S --result FILE

    <quix-python> bench/peers/quix_app.py ... --follow --stop STOP --visible LOG

``--follow`` (the freshness run, bench/freshness/phase.py) reads until ``STOP`` exists instead of
until ``N`` rows, and appends one JSON line per file written (when it was complete, its path)
to ``LOG``, so the bench knows when each file's rows became visible.

``DIR`` must be relative (the sink refuses ``-`` and other characters in its directory, and
temp paths often contain them): run with the working directory set where the files belong.

Writes one JSON object to ``FILE``: first-message and last-write wall times, rows written,
files, CPU seconds and peak RSS of this process over the measured span.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _cpu_seconds() -> float:
    # User + system time of every thread of this process (librdkafka's threads included).
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quix_app")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--expected", type=int, help="records in the topic (without --follow)")
    parser.add_argument("--follow", action="store_true", help="read until --stop exists")
    parser.add_argument("--stop", help="(--follow) stop once this file exists")
    parser.add_argument("--visible", help="(--follow) one JSON line per file written: at, path")
    parser.add_argument("--directory", required=True, help="relative output directory")
    parser.add_argument("--commit-interval", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    if args.follow != bool(args.stop and args.visible) or args.follow == (args.expected is not None):
        parser.error("either --expected N, or --follow with --stop and --visible")

    from quixstreams import Application  # type: ignore[import-not-found,unused-ignore]
    from quixstreams.sinks.community.file.formats.parquet import (  # type: ignore[import-not-found,unused-ignore]
        ParquetFormat,
    )
    from quixstreams.sinks.community.file.local import (  # type: ignore[import-not-found,unused-ignore]
        LocalFileSink,
    )

    state: dict[str, Any] = {
        "first_record_at": None,
        "first_cpu": None,
        "last_write_at": None,
        "last_cpu": None,
        "rows": 0,
        "files": 0,
        "bytes": 0,
    }
    done = threading.Event()

    class CountingSink(LocalFileSink):  # type: ignore[misc,unused-ignore]
        """LocalFileSink that records when the last expected row reached disk and then stops the app."""

        def write(self, batch: Any) -> None:
            super().write(batch)
            state["rows"] += batch.size
            state["files"] += 1
            state["last_write_at"] = time.time()
            state["last_cpu"] = _cpu_seconds()
            if args.expected is not None and state["rows"] >= args.expected:
                done.set()
                app.stop()

        def _write(self, data: bytes, batch: Any) -> None:
            super()._write(data, batch)
            if args.visible:
                # The file the parent just wrote (its name follows from the batch), now complete.
                path = self._directory(batch) / self._filename(batch)
                with open(args.visible, "a") as log:
                    log.write(json.dumps({"at": time.time(), "path": str(path.resolve())}) + "\n")

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        # Sinks are flushed on checkpoint commit: the commit interval plays the role of the
        # ingest split's max_age, so the bench sets both to the same value.
        commit_interval=args.commit_interval,
        processing_guarantee="at-least-once",
        # The topic exists (the bench created it); nothing stateful, so no changelog topics.
        auto_create_topics=False,
        use_changelog_topics=False,
        state_dir=str(Path.cwd() / "quix-state"),
        loglevel="WARNING",
        # The same group timings as the workers get in the bench (the default 45 s session
        # timeout makes the first join wait ~20 s on this broker).
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )
    topic = app.topic(args.topic, value_deserializer="json", key_deserializer="bytes")
    sdf = app.dataframe(topic)

    def mark_first(value: Any) -> None:
        # The measured span starts at the first record handed to the pipeline, as for the others.
        if state["first_record_at"] is None:
            state["first_record_at"] = time.time()
            state["first_cpu"] = _cpu_seconds()

    sdf = sdf.update(mark_first)
    sdf.sink(CountingSink(directory=args.directory, format=ParquetFormat(compression="zstd")))

    # Backstop: never run past the timeout even if the expected count is never reached.
    watchdog = threading.Timer(args.timeout, app.stop)
    watchdog.daemon = True
    watchdog.start()
    if args.follow:

        def watch_stop() -> None:
            while not Path(args.stop).exists() and not done.is_set():
                time.sleep(0.2)
            done.set()
            app.stop()

        threading.Thread(target=watch_stop, daemon=True).start()
    try:
        app.run()
    finally:
        watchdog.cancel()

    out_dir = Path(args.directory)
    file_bytes = sum(p.stat().st_size for p in out_dir.rglob("*.parquet")) if out_dir.exists() else 0
    end_cpu = state["last_cpu"] if state["last_cpu"] is not None else _cpu_seconds()
    result = {
        "ok": done.is_set(),
        "first_record_at": state["first_record_at"],
        "last_write_at": state["last_write_at"],
        "rows": state["rows"],
        "files": state["files"],
        "file_bytes": file_bytes,
        # Both taken in this process: the measured span only (startup and imports excluded).
        "cpu_s": end_cpu - (state["first_cpu"] if state["first_cpu"] is not None else end_cpu),
        # ru_maxrss is in KiB on Linux.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(args.result).write_text(json.dumps(result))
    return 0 if done.is_set() else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
