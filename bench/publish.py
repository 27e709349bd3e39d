"""``python -m bench.publish``: what one publish transaction costs, against a local PostgreSQL.

Prints, for ``Metastore.publish`` of a one-partition segment:

1. round trips: publishes go through a loopback proxy that holds every reply of the server
   for ``--delay-ms``; a publish's time divided by the delay is its number of round trips;
2. latency (p50 / p99 / max) with the publishing thread alone, and with a busy Python thread
   beside it at the worker's GIL switch interval (the worker's consumer thread during a
   catch-up): every round trip makes the publishing thread win the GIL back.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid

from bench.stats import percentiles
from ingest.cli import GIL_SWITCH_INTERVAL_S
from ingest_common.model import (
    BuildRegistration,
    BuiltSegment,
    OffsetRange,
    PublishRange,
    SegmentToPublish,
    TopicPartition,
)
from ingest_dev.postgres import LocalPostgres
from ingest_dev.proxy import TcpProxy
from metastore import Metastore, apply_migrations

SOURCE = "bench_publish"
TOPIC = "events"
PARTITIONS = 6
TIME_BOUND_S = 120.0


class _Partitions:
    """Claimed partitions and their next offsets: each publish continues where the last ended."""

    def __init__(self, store: Metastore) -> None:
        self._store = store
        store.apply_source(SOURCE, {"name": SOURCE}, f"name = '{SOURCE}'")
        store.register_partitions(SOURCE, TOPIC, list(range(PARTITIONS)), "earliest")
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        self._claims = store.claim_partitions(SOURCE, "bench", tps)
        self._next = dict.fromkeys(tps, 0)
        self._tps = tps
        self._count = 0

    def next_item(self, records: int = 10_000) -> SegmentToPublish:
        tp = self._tps[self._count % len(self._tps)]
        self._count += 1
        start = self._next[tp]
        self._next[tp] = start + records
        split_id = uuid.uuid4()
        build = uuid.uuid4()
        # Registered as a worker's build thread does, before (and outside) the timed publish.
        self._store.register_build(
            "bench",
            BuildRegistration(
                build,
                SOURCE,
                f"file:///bench/_staging/{build}",
                f"file:///bench/segments/{build}",
                f"file:///bench/rejects/{build}",
                (split_id,),
            ),
        )
        segment = BuiltSegment(
            split_id=split_id,
            location=f"file:///bench/segments/{build}",
            files=(f"file:///bench/segments/{build}/part-0.zstd.parquet",),
            row_count=records,
            size_bytes=1_000_000,
        )
        return SegmentToPublish(
            source=SOURCE,
            spec_version=1,
            worker_id="bench",
            segment=segment,
            ranges=(PublishRange(OffsetRange(tp, start, start + records), self._claims[tp].serial),),
        )


def _timed(store: Metastore, partitions: _Partitions) -> float:
    item = partitions.next_item()
    started = time.perf_counter()
    store.publish(item)
    return time.perf_counter() - started


def _latencies_ms(store: Metastore, partitions: _Partitions, publishes: int, busy_threads: int) -> list[float]:
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(busy_threads)]
    for t in spinners:
        t.start()
    deadline = time.monotonic() + TIME_BOUND_S
    try:
        return [_timed(store, partitions) * 1000 for _ in range(publishes) if time.monotonic() < deadline]
    finally:
        stop.set()
        for t in spinners:
            t.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.publish", description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishes", type=int, default=1000, help="publishes per latency phase (default 1000)")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the proxy's hold per server reply")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    results: dict[str, object] = {}
    with LocalPostgres() as pg:
        url = pg.create_database("bench_publish")
        apply_migrations(url)
        with Metastore(url) as store:
            partitions = _Partitions(store)
            with (
                TcpProxy(pg.port, delay_s=args.delay_ms / 1000) as proxy,
                Metastore(url.replace(f":{pg.port}/", f":{proxy.port}/")) as slow,
            ):
                _timed(slow, partitions)  # connects
                times = sorted(_timed(slow, partitions) for _ in range(5))
            round_trips = times[len(times) // 2] * 1000 / args.delay_ms
            results["round_trips"] = round(round_trips, 2)
            print(
                f"publish round trips: {round_trips:.2f} (median of 5 through a proxy holding each reply "
                f"{args.delay_ms:g} ms)"
            )
            for busy, label in ((0, "alone"), (1, "beside a busy Python thread")):
                stats = percentiles(_latencies_ms(store, partitions, args.publishes, busy))
                results[f"latency_ms_busy_{busy}"] = stats
                print(
                    f"publish latency, {label}: p50 {stats['p50']:.2f} ms, p99 {stats['p99']:.2f} ms, "
                    f"max {stats['max']:.2f} ms (n={stats['n']}, GIL switch interval "
                    f"{GIL_SWITCH_INTERVAL_S * 1000:g} ms)"
                )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
