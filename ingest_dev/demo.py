"""The embedded demo: local PostgreSQL, Apache Kafka (one KRaft node), Spark in local mode, sample data
and several worker processes, with live progress, the exactly-once check and where to look.

    python -m ingest_dev.demo [--workers 3] [--records 60000] [--keep]

A table committer runs beside the workers: the demo ends with a query over the source's Iceberg
table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ingest.spec import load_spec_file
from ingest_dev.ingest_process import IngestProcess, stop_all
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic, end_offsets, produce_records
from ingest_dev.postgres import LocalPostgres
from ingest_dev.testkit import free_port, wait_until
from ingest_dev.verify import published_positions, verify_exactly_once
from metastore import Metastore, apply_migrations
from metastore.tables import TableStore

TOPIC = "clicks"
PARTITIONS = 6
SPEC = """\
name = "clicks"
topics = ["clicks"]
start_from = "earliest"
event_time = "ts"
segment_store = "{store}"
on_parse_error = "reject"
# Data files cut by day of `ts`: the Iceberg table is partitioned by day.
file_partition = "day"

[schema]
id = "long"
user = "string"
ts = "timestamp"
amount = "double"
tags = "array<string>"

[split]
max_records = 10000
max_age = "2s"
"""


def sample(i: int) -> bytes:
    if i % 500 == 499:  # a few unparseable records, to show the rejects segments
        return b'{"id": "oops", "user": '
    return json.dumps(
        {
            "id": i,
            "user": f"user-{i % 1000}",
            "ts": f"2026-11-22T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}Z",
            "amount": round(i * 0.37, 2),
            "tags": ["demo", f"t{i % 5}"],
        }
    ).encode()


def produce(bootstrap: str, first: int, n: int, ends: dict[int, int]) -> None:
    records = ((i % PARTITIONS, f"key-{i}".encode(), sample(i)) for i in range(first, first + n))
    for p, end in produce_records(bootstrap, TOPIC, records).items():
        ends[p] = max(ends.get(p, 0), end)


def progress_line(store: Metastore, bootstrap: str) -> tuple[str, bool]:
    """Published offsets against Kafka's own log end offsets; done when every partition is caught up."""
    positions = published_positions(store, TOPIC)
    ends = end_offsets(bootstrap, TOPIC)
    cells = []
    done = True
    for p in range(PARTITIONS):
        pub = positions.get((TOPIC, p)) or 0
        done &= pub == ends.get(p, 0)
        cells.append(f"p{p} {pub}/{ends.get(p, 0)}")
    total = sum(positions.get((TOPIC, p)) or 0 for p in range(PARTITIONS))
    return f"published {total:>7}/{sum(ends.values())}  " + "  ".join(cells), done


def waiting_for(store: Metastore, workers: Sequence[IngestProcess], published: int) -> str:
    """What the demo waits for, in words: the first minute is Spark starting, not a hang.
    A worker registers (heartbeats) once its Spark session is up and warmed, before it joins
    the consumer group."""
    exited = [
        f"worker-{n} exited with code {code} (see worker-{n}.log)"
        for n, proc in enumerate(workers)
        if (code := proc.poll()) is not None
    ]
    live = store.live_workers("clicks")
    states = Counter(str(w["state"]) for w in live)
    parts = exited[:]
    unregistered = len(workers) - len(exited) - len(live)
    if unregistered > 0:
        parts.append(f"{unregistered} worker(s) starting Spark and warming it up (30-90 s on 2 cores)")
    if states.get("starting"):
        parts.append(f"{states['starting']} worker(s) joining the consumer group")
    if states.get("running") and not published:
        owned = {p for w in live for p in w["partitions"]}
        parts.append(
            f"{states['running']} worker(s) own {len(owned)}/{PARTITIONS} partitions: building the first segments"
        )
    return "; ".join(parts)


QUERY = (
    "SELECT _partition, count(*) AS records, count(DISTINCT _offset) AS offsets, "
    "min(_offset) AS first, max(_offset) AS last FROM clicks GROUP BY _partition ORDER BY _partition"
)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", *args], env=env, capture_output=True, text=True, check=False, timeout=120
    )


def table_caught_up(url: str, deadline: float) -> bool:
    """Whether the committer appended every published segment (data and rejects) before ``deadline``."""
    with TableStore(url) as tables:

        def behind() -> int:
            return sum(tables.behind("clicks", row.kind)[0] for row in tables.tables("clicks"))

        try:
            return wait_until(lambda: behind() == 0, deadline - time.monotonic(), "the table", interval=1)
        except TimeoutError:
            print(f"the table is still {behind()} segment(s) behind", file=sys.stderr)
            return False


def table_matches(query_output: str, ends: dict[int, int]) -> bool:
    """The query's rows (partition, records, offsets, ...) against what was produced: every record
    but the unparseable ones (every 500th, in the rejects table), each offset once."""
    produced = dict.fromkeys(ends, 0)
    for i in range(sum(ends.values())):
        if i % 500 != 499:
            produced[i % PARTITIONS] += 1
    seen = {}
    for line in query_output.splitlines()[1:]:
        cells = line.split()
        if len(cells) == 5 and cells[0].isdigit():
            seen[int(cells[0])] = (int(cells[1]), int(cells[2]))
    return seen == {p: (n, n) for p, n in produced.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ingest_dev.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="ingest-demo-"))
    os.chmod(work, 0o755)
    print(f"demo directory: {work}")
    with LocalPostgres() as pg, LocalKafka(base_dir=work / "kafka") as broker:
        url = pg.url
        apply_migrations(url)
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        print(f"broker: {broker.describe()}, started in {broker.started_in_s:.1f} s")
        print(f"PostgreSQL {url}   topic {TOPIC} ({PARTITIONS} partitions)")
        ends: dict[int, int] = {}
        first_batch = args.records * 2 // 3
        produce(broker.bootstrap, 0, first_batch, ends)
        print(f"produced {first_batch} records (every 500th is unparseable on purpose)")

        spec_path = work / "clicks.toml"
        spec_path.write_text(SPEC.format(store=work / "segments"))
        spec, text = load_spec_file(spec_path)
        with Metastore(url) as store:
            store.apply_source(spec.name, spec.to_json(), text)

        env = {
            **os.environ,
            "INGEST_DATABASE_URL": url,
            "INGEST_KAFKA_BOOTSTRAP": broker.bootstrap,
            "INGEST_SPARK_MASTER": os.environ.get("INGEST_SPARK_MASTER", "local[1]"),
            "INGEST_SPARK_DRIVER_MEMORY": "1g",
            "INGEST_BUILD_THREADS": "1",
            "INGEST_LOG_FORMAT": "json",
            "INGEST_KAFKA_PROP_SESSION_TIMEOUT_MS": "6000",
        }
        enabled = cli(env, "table-enable", "clicks")
        print(enabled.stdout.strip())
        committer_port = free_port()
        committer = IngestProcess(
            ["table-commit", "clicks", "--interval", "2"],
            {**env, "INGEST_METRICS_PORT": str(committer_port)},
            work,
            "committer",
        ).start()
        print(
            f"started the Iceberg table committer; log: {work}/committer.log; metrics: "
            f"http://127.0.0.1:{committer_port}/metrics"
        )
        ports = [free_port() for _ in range(args.workers)]
        workers = [
            IngestProcess.worker(
                {**env, "INGEST_METRICS_PORT": str(port), "INGEST_WORKER_ID": f"demo-worker-{n}"},
                "clicks",
                work,
                f"worker-{n}",
            )
            for n, port in enumerate(ports)
        ]
        print(
            f"started {args.workers} workers; logs: {work}/worker-N.log; metrics: "
            + ", ".join(f"http://127.0.0.1:{p}/metrics" for p in ports)
        )

        produced_rest = False
        ok = False
        with Metastore(url) as store:

            def caught_up() -> bool:
                nonlocal produced_rest
                line, done = progress_line(store, broker.bootstrap)
                published = sum((published_positions(store, TOPIC).get((TOPIC, p)) or 0) for p in range(PARTITIONS))
                waiting = "" if done else waiting_for(store, workers, published)
                print(line + (f"  [{waiting}]" if waiting else ""), flush=True)
                if not produced_rest and published > 0:
                    produce(broker.bootstrap, first_batch, args.records - first_batch, ends)
                    print(f"produced {args.records - first_batch} more records while the workers run")
                    produced_rest = True
                    return False
                return done and produced_rest

            try:
                ok = wait_until(caught_up, args.timeout, "the workers to catch up", interval=2)
            except TimeoutError:
                print("timed out before the workers caught up", file=sys.stderr)
            expected = {(TOPIC, p): list(range(end)) for p, end in ends.items()}
            result = verify_exactly_once(store, "clicks", expected)
            print(("EXACTLY ONCE: " if result.ok else "CHECK FAILED: ") + result.summary())
            owners = sorted({r["owner"] for r in store.partitions("clicks") if r["owner"]})
            print(f"partition owners: {', '.join(owners)}")

        subprocess.run([sys.executable, "-m", "ingest", "status", "clicks"], env=env, check=False)
        table_ok = table_caught_up(url, time.monotonic() + 120)
        print(cli(env, "table", "clicks").stdout.rstrip())
        print(f"ingest query clicks '{QUERY}'")
        queried = cli(env, "query", "clicks", QUERY)
        print(queried.stdout.rstrip())
        table_ok = table_ok and queried.returncode == 0 and table_matches(queried.stdout, ends)
        print(
            ("TABLE EXACTLY ONCE: " if table_ok else "TABLE CHECK FAILED: ") + "every produced record that parsed, once"
        )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/metrics", timeout=5) as resp:
                lines = [
                    ln
                    for ln in resp.read().decode().splitlines()
                    if ln.startswith(
                        (
                            "ingest_records_published_total",
                            "ingest_segments_published_total",
                            "ingest_assigned_partitions",
                            "ingest_records_rejected_total",
                        )
                    )
                ]
            print("worker 0 metrics:\n  " + "\n  ".join(lines))
        except OSError as exc:
            print(f"(metrics of worker 0 unavailable: {exc})")
        # The production proof, last: every offset in one segment, every file as listed, the table.
        print("\ningest audit clicks --files")
        audited = cli(env, "audit", "clicks", "--files")
        print((audited.stdout + audited.stderr).rstrip())
        audit_ok = audited.returncode == 0
        print(
            f"\nlook around:\n  psql '{url}' -c 'SELECT * FROM ingest_partition_status ORDER BY partition'"
            f"\n  psql '{url}' -c 'SELECT id, row_count, rejects_count, files FROM ingest_segments LIMIT 5'"
            f"\n  INGEST_DATABASE_URL='{url}' INGEST_KAFKA_BOOTSTRAP={broker.bootstrap} "
            "python -m ingest segments clicks"
        )
        if args.keep:
            print("\neverything keeps running; Ctrl-C to stop")
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
        stop_all([*workers, committer], timeout=60)
        return 0 if ok and result.ok and table_ok and audit_ok else 1


if __name__ == "__main__":
    sys.exit(main())
