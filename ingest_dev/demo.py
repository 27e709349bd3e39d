"""The embedded demo: local PostgreSQL, Apache Kafka (one KRaft node), a schema registry, Spark in
local mode, sample data and several worker processes, with live progress, the exactly-once check and
where to look.

    python -m ingest_dev.demo [--format avro|json] [--workers 3] [--records 60000] [--keep]

The sample data is Avro in the Confluent wire format by default (values and keys, the schemas in a
local Apicurio Registry): the first two thirds written with one writer schema, the rest, produced
while the workers run, with its next version (a field added); ``--format json`` is plain JSON and
starts no registry. A table committer runs beside the workers: the demo ends with a query over the
source's Iceberg table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ingest.spec.parse import load_spec_file
from ingest_dev import avro_samples
from ingest_dev.ingest_process import IngestProcess, stop_all
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic, end_offsets, produce_records
from ingest_dev.postgres import LocalPostgres
from ingest_dev.process import run_process
from ingest_dev.registry import LocalSchemaRegistry
from ingest_dev.testkit import free_port, wait_until
from ingest_dev.verify import published_positions, store_shape, verify_exactly_once
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
{format}
[schema]
{columns}

[split]
max_records = 10000
max_age = "2s"
"""
# Avro values and keys in the Confluent wire format; the reader schema is [schema] (a writer
# version without `region` gives null), the key's field lands in the column _key_user.
AVRO_FORMAT = """\
format = "avro"
key_format = "avro"

[registry]
url = "{registry}"

[key_schema]
user = "string"
"""
# Every record is framed: key, value. Encoders give both for record i.
Encode = Callable[[int], tuple[bytes | None, bytes | None]]


def spec_text(store: Path, registry_url: str | None) -> str:
    """The demo's spec: JSON without a registry, else Avro values and keys through it."""
    columns = dict(avro_samples.CLICK_COLUMNS)
    if registry_url is None:
        del columns["region"]
    return SPEC.format(
        store=store,
        format="" if registry_url is None else "\n" + AVRO_FORMAT.format(registry=registry_url),
        columns="\n".join(f'{name} = "{ctype}"' for name, ctype in columns.items()),
    )


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


def json_encode(i: int) -> tuple[bytes | None, bytes | None]:
    return f"key-{i}".encode(), sample(i)


def sample_record(i: int, version: int) -> dict[str, object]:
    """Record i as the demo's writer schema ``version`` (1 or 2) has it."""
    record: dict[str, object] = {
        "id": i,
        "user": f"user-{i % 1000}",
        "ts": 1_795_305_600_000 + ((i // 3600) % 24) * 3_600_000 + ((i // 60) % 60) * 60_000 + (i % 60) * 1000,
        "amount": round(i * 0.37, 2),
        "tags": ["demo", f"t{i % 5}"],
    }
    if version > 1:
        record["region"] = ("eu", "us", "ap")[i % 3]
    return record


def avro_encoder(value: avro_samples.AvroWriter, key: avro_samples.AvroWriter, version: int) -> Encode:
    """Records of one writer version, every 500th framed but undecodable (a reject)."""

    def encode(i: int) -> tuple[bytes | None, bytes | None]:
        user = {"user": f"user-{i % 1000}"}
        return key(user), value.undecodable() if i % 500 == 499 else value(sample_record(i, version))

    return encode


def produce(bootstrap: str, first: int, n: int, ends: dict[int, int], encode: Encode = json_encode) -> None:
    records = ((i % PARTITIONS, *encode(i)) for i in range(first, first + n))
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


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_process(
        [sys.executable, "-m", "ingest", *args], env=env, capture_output=True, text=True, check=False, timeout=timeout
    )


def compact(env: dict[str, str], store: Metastore, timeout: float) -> bool:
    """``ingest compact clicks`` beside the running workers: the small segments the 2 s splits
    left, rewritten into one per partition (and file_partition value); the shape before and after."""
    before = store_shape(store, "clicks")
    print("\ningest compact clicks")
    done = cli(env, "compact", "clicks", timeout=timeout)
    after = store_shape(store, "clicks")
    summary = done.stdout.splitlines()[:1] if done.returncode == 0 else [(done.stdout + done.stderr)[-2000:]]
    print("\n".join(summary))
    print(
        f"  segments {before.segments} -> {after.segments}, data files {before.files} -> {after.files}, "
        f"bytes {before.bytes:,} -> {after.bytes:,}, median file {_median(before.file_sizes):,.0f} -> "
        f"{_median(after.file_sizes):,.0f} bytes (rejects files as they were: {after.rejects_files})"
    )
    return done.returncode == 0 and after.files < before.files


def _median(values: list[int]) -> float:
    return statistics.median(values) if values else 0.0


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
    parser.add_argument(
        "--format",
        choices=("avro", "json"),
        default="avro",
        help="avro (default): Avro values and keys through a local schema registry; json: plain JSON, no registry",
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="ingest-demo-"))
    os.chmod(work, 0o755)
    print(f"demo directory: {work}")
    with contextlib.ExitStack() as servers:
        registry = None
        if args.format == "avro":
            # Started beside PostgreSQL and Kafka (a JVM of its own): its start costs no wall time.
            registry = LocalSchemaRegistry(base_dir=work / "registry")
            servers.callback(registry.stop)
            registry_started = servers.enter_context(ThreadPoolExecutor(1)).submit(registry.start)
        pg = servers.enter_context(LocalPostgres())
        broker = servers.enter_context(LocalKafka(base_dir=work / "kafka"))
        url = pg.url
        apply_migrations(url)
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        print(f"broker: {broker.describe()}, started in {broker.started_in_s:.1f} s")
        print(f"PostgreSQL {url}   topic {TOPIC} ({PARTITIONS} partitions)")
        encode_first: Encode = json_encode
        encode_rest: Encode = json_encode
        if registry is not None:
            registry_started.result()
            print(f"schema registry: {registry.describe()}, started in {registry.started_in_s or 0.0:.1f} s")
            v1, v2 = avro_samples.writers(registry.url, TOPIC, (avro_samples.CLICK_V1, avro_samples.CLICK_V2))
            key = avro_samples.key_writer(registry.url, TOPIC)
            encode_first, encode_rest = avro_encoder(v1, key, 1), avro_encoder(v2, key, 2)
            print(f"registered writer schemas v1 and v2 (adds region) under {TOPIC}-value, the key's under {TOPIC}-key")
        ends: dict[int, int] = {}
        first_batch = args.records * 2 // 3
        produce(broker.bootstrap, 0, first_batch, ends, encode_first)
        written = " in Avro with writer schema v1" if registry else " in JSON"
        print(f"produced {first_batch} records{written} (every 500th is unparseable on purpose)")

        spec_path = work / "clicks.toml"
        spec_path.write_text(spec_text(work / "segments", registry.url if registry else None))
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
                    produce(broker.bootstrap, first_batch, args.records - first_batch, ends, encode_rest)
                    print(
                        f"produced {args.records - first_batch} more records while the workers run"
                        + (" with writer schema v2" if registry else "")
                    )
                    produced_rest = True
                    return False
                return done and produced_rest

            try:
                ok = wait_until(caught_up, args.timeout, "the workers to catch up", interval=2)
            except TimeoutError:
                print("timed out before the workers caught up", file=sys.stderr)
            # Before the checks below: they then prove the compacted segments (and the table's
            # replacement snapshot) hold every record once.
            compacted = ok and compact(env, store, args.timeout)
            expected = {(TOPIC, p): list(range(end)) for p, end in ends.items()}
            result = verify_exactly_once(store, "clicks", expected)
            print(("EXACTLY ONCE: " if result.ok else "CHECK FAILED: ") + result.summary())
            owners = sorted({r["owner"] for r in store.partitions("clicks") if r["owner"]})
            print(f"partition owners: {', '.join(owners)}")

        run_process([sys.executable, "-m", "ingest", "status", "clicks"], env=env, check=False)
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
        return 0 if ok and compacted and result.ok and table_ok and audit_ok else 1


if __name__ == "__main__":
    sys.exit(main())
