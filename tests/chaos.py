"""The chaos run: real PostgreSQL, a real broker, a fleet of worker processes, a producer
of unique records and faults on a seeded random schedule; at the end every produced
record must be in exactly one published segment, with its payload intact.

    python -m tests.chaos [--records 500000] [--duration 300] [--workers 3] [--seed 1] [--quick]
                          [--group-protocol classic|consumer] [--format json|avro] [--spark local|connect]
                          [--kafka-security plaintext|sasl_ssl]

Faults (``--faults`` picks a subset): ``kill`` (SIGKILL a worker, start a replacement),
``stop`` (SIGSTOP past the session timeout, then SIGCONT: a zombie), ``add`` (one more
worker), ``term`` (SIGTERM: a graceful stop, then a replacement), ``pg_restart``,
``pg_outage`` (PostgreSQL unreachable for 20 s), ``spark`` (SIGKILL a worker's Spark JVM:
its builds fail until its /healthz reports it unhealthy and the supervisor restarts it).
With ``--spark connect`` the workers are thin clients of one Spark Connect server the run
starts (ingest_dev/spark_connect.py), and ``spark`` SIGKILLs that server and starts a new one
on the same port: every worker's session is gone with it, so every worker's builds fail until
the new server listens and the worker replaces its session (ingest.spark.connect).
With ``--table`` (tests/chaos_table.py) two ``ingest table-commit`` processes run beside the
workers, ``table_kill`` SIGKILLs one of them, and the Iceberg table must hold every record
exactly once too. Unless ``--no-compact`` (tests/chaos_compact.py) an ``ingest compact --every``
process replaces small segments all through the run, ``compact_kill`` SIGKILLs it inside a job
and starts another, and every check reads only the current segments. With ``--format avro``
the records are Avro in the Confluent wire format through a local schema registry, written
with three writer schema versions in turn while the run goes on (each adds a field with a
default; the spec's reader schema reads them all). With ``--kafka-security sasl_ssl``
(tests/chaos_kafka.py) every Kafka client of the run is on the broker's SASL_SSL listener with
SCRAM-SHA-512, and the password must show in no process's log.

A supervisor plays the orchestrator: it restarts workers that exit on their own or whose
``/healthz`` keeps failing, and counts both. Recovery after a fault is the time from the
end of the fault until every partition's published offset moved past where it stood then
(or reached the end of what was produced). The run ends with ``ingest audit SOURCE --files`` (a
CLI process). Exit status: 0 when exactly-once holds, the fleet caught up and the audit passed,
1 otherwise.

This module is the run itself (the fault schedule, the injections, the final checks) and its
command line; its parts: tests/chaos_config.py (ChaosConfig, the bounds), tests/chaos_records.py
(the records and their producer), tests/chaos_fleet.py (the workers and their supervisor),
tests/chaos_watch.py (recovery and ownership), tests/chaos_result.py (the verdict and summary).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ingest.ops.gc import collect_garbage
from ingest_dev.ingest_process import IngestProcess
from ingest_dev.kafka_clients import create_topic, end_offsets, produce_records
from ingest_dev.postgres import LocalPostgres
from ingest_dev.s3 import LocalS3
from ingest_dev.spark_connect import LocalConnectServer
from ingest_dev.testkit import wait_until
from ingest_dev.verify import verify_exactly_once, verify_payloads
from metastore import Metastore, apply_migrations
from tests.acceptance.harness import apply_spec, process_env, write_spec
from tests.chaos_avro import AVRO_VERSIONS, avro_values, registry_beside
from tests.chaos_compact import Compactor, audit_files, replaced_segments, unlisted_files
from tests.chaos_config import FAULT_KINDS, SESSION_TIMEOUT_S, ChaosConfig
from tests.chaos_fleet import Fleet, log_since, stop_worker
from tests.chaos_kafka import KAFKA_SECURITY, chaos_broker, secret_shown
from tests.chaos_records import ChaosProducer, expected_row, record_fields, record_value
from tests.chaos_result import ChaosResult, Fault
from tests.chaos_table import Committers, verify_table
from tests.chaos_table import enable as enable_table
from tests.chaos_watch import Monitor, OwnershipWatch, caught_up_to, fleet_ready, published_any

PG_OUTAGE_S = 20.0
# The "gc" fault runs gc with no grace at all: it abandons every split
# in flight (their publish is refused, the records read again) and sweeps what it may.
GC_FAULT_GRACE_S = 0.0
TOPIC = "chaos"


def _fault_plan(config: ChaosConfig, rng: random.Random) -> list[str]:
    kinds = list(config.faults)
    plan: list[str] = []
    while len(plan) < config.fault_count:
        rng.shuffle(kinds)
        plan.extend(kinds)
    return plan[: config.fault_count]


def _inject(
    kind: str,
    fleet: Fleet,
    pg: LocalPostgres,
    rng: random.Random,
    max_workers: int,
    t0: float,
    connect: LocalConnectServer | None = None,
) -> tuple[str, str]:
    """Inject one fault; returns what it hit and the kind actually injected."""
    if kind == "spark" and connect is not None:
        down_s = connect.crash_and_restart()
        log_since(t0, f"the Spark Connect server was killed and listens again after {down_s:.1f}s")
        return "connect", kind
    if kind == "pg_restart":
        pg.restart()
        return "postgres", kind
    if kind == "pg_outage":
        pg.outage(PG_OUTAGE_S)
        return "postgres", kind
    if kind == "gc":
        with Metastore(pg.url) as store:
            swept = collect_garbage(store, fleet.source_name, grace_s=GC_FAULT_GRACE_S)
        log_since(
            t0,
            f"gc abandoned {swept.abandoned} split(s), deleted {len(swept.deleted)} file(s) of {swept.swept} build(s)",
        )
        return "store", kind
    if kind == "add":
        if len(fleet.live) >= max_workers:
            kind = "kill"
        else:
            return fleet.add(), "add"
    name = fleet.pick(rng)
    if name is None:
        return fleet.add(), "add"
    if kind == "kill":
        fleet.remove(name).kill()
        fleet.add()
    elif kind == "term":
        worker = fleet.remove(name)
        stop_worker(worker, 90.0)
        fleet.add()
    elif kind == "stop":
        worker = fleet.worker(name)
        fleet.frozen.add(name)
        worker.signal(signal.SIGSTOP)
        time.sleep(SESSION_TIMEOUT_S + rng.uniform(2.0, 5.0))
        worker.signal(signal.SIGCONT)
        fleet.frozen.discard(name)
    elif kind == "spark":
        pid = fleet.spark_jvm(name)
        if pid is None:
            log_since(t0, f"{name} has no Spark JVM yet; killing the worker instead")
            fleet.remove(name).kill()
            fleet.add()
            return name, "kill"
        os.kill(pid, signal.SIGKILL)
    return name, kind


def _count_kills(workers: list[IngestProcess]) -> Counter[str]:
    kills: Counter[str] = Counter()
    for worker in workers:
        for event in worker.events():
            if event.get("event") == "split_killed":
                kills[str(event.get("reason"))] += 1
    return kills


@contextlib.contextmanager
def _connect_server(config: ChaosConfig) -> Iterator[LocalConnectServer | None]:
    if config.spark != "connect":
        yield None
        return
    with LocalConnectServer(driver_memory="1g", master="local[2]") as server:
        yield server


@contextlib.contextmanager
def _store(config: ChaosConfig, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The segment store's URI and what a process needs to reach it. For S3 the variables are
    also set in this process for the run (the final gc and the verification read the files)."""
    if config.store == "file":
        yield str(work / "store"), {}
        return
    saved = dict(os.environ)
    with LocalS3() as s3:
        os.environ.update(s3.env)
        try:
            yield s3.uri("chaos-store"), s3.env
        finally:
            os.environ.clear()
            os.environ.update(saved)


def run(config: ChaosConfig, log: Callable[[str], None] | None = None) -> ChaosResult:
    t0 = time.monotonic()
    say = log or (lambda message: log_since(t0, message))
    rng = random.Random(config.seed)
    work = config.workdir or Path(tempfile.mkdtemp(prefix="ingest-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    say(
        f"seed {config.seed}; workdir {work}; {config.records} records over {config.duration_s:.0f}s, "
        f"{config.workers} workers, {config.partitions} partitions, group protocol {config.group_protocol}, "
        f"{config.store} store, {config.format} records, Spark {config.spark}"
    )
    with (
        registry_beside(config.format == "avro", work) as registry,
        LocalPostgres() as pg,
        chaos_broker(config.kafka_security, work) as (broker, kafka),
        _store(config, work) as (store, s3env),
        _connect_server(config) as connect,
    ):
        say(f"broker: {broker.describe()}, started in {broker.started_in_s:.1f} s; {kafka.describe()}")
        url = pg.url
        apply_migrations(url)
        create_topic(kafka.bootstrap, TOPIC, config.partitions, config=kafka.props)
        extra = f'start_from = "{config.start_from}"'
        value = record_value
        if registry is not None:
            registry_url = registry()
            say(f"schema registry at {registry_url}; {len(AVRO_VERSIONS)} writer schema versions to produce")
            value = avro_values(registry_url, TOPIC, config.records, record_fields)
            extra += f'\nformat = "avro"\n\n[registry]\nurl = "{registry_url}"\n'
        source, spec_path = write_spec(
            work,
            TOPIC,
            name="chaos",
            max_records=config.max_records_per_split,
            max_age="2s",
            store=store,
            extra=extra,
        )
        if config.start_from == "latest":
            # Before the source reads: none of these may ever be published (verify's "unexpected").
            early = ((p % config.partitions, None, b'{"before": true}') for p in range(500))
            before = produce_records(kafka.bootstrap, TOPIC, early, config=kafka.props)
            say(f"start_from latest: {sum(before.values())} records produced before the fleet starts")
        apply_spec(url, spec_path)
        # A one-minute rebalance timeout (max.poll.interval.ms; the loop never blocks poll()
        # that long).
        spark = {} if connect is None else {"INGEST_SPARK_MASTER": connect.url}
        if connect is not None:
            say(f"Spark Connect server {connect.url}, listening after {connect.start_seconds:.1f} s")
        env = process_env(
            url,
            kafka.bootstrap,
            config.group_protocol,
            INGEST_KAFKA_PROP_MAX_POLL_INTERVAL_MS="60000",
            **kafka.worker_env,
            **s3env,
            **spark,
        )
        fleet = Fleet(env, source, work, t0)
        committers = Committers(env, source, work) if config.table else None
        if committers is not None:
            enable_table(url, source)
            committers.start()
        compactor = Compactor(env, source, work, t0) if config.compact else None
        compact_problems: list[str] = []
        producer = ChaosProducer(kafka.config(), TOPIC, config.partitions, config.records, config.duration_s, value)
        monitor = Monitor(url, source, producer, t0)
        ownership = OwnershipWatch(kafka, f"ingest-{source}", TOPIC, fleet, monitor, t0)
        try:
            fleet.start(config.workers)
            if compactor is not None:
                compactor.start()
            # Workers start Spark before they join the group (tens of seconds on a loaded
            # machine): produce only once the fleet consumes, so the faults hit production.
            say("waiting for the fleet to own every partition")
            wait_until(
                lambda: fleet_ready(url, source, config.workers, config.partitions),
                300,
                "chaos: the workers to join and own every partition",
                interval=1.0,
            )
            producer.start()
            monitor.start()
            ownership.start()
            say("fleet ready; producing; waiting for the first segment before injecting faults")
            wait_until(lambda: published_any(url, source), 180, "chaos: the first worker to publish", interval=1.0)
            plan = _fault_plan(config, rng)
            say(f"fault plan: {', '.join(plan)}")
            for kind in plan:
                time.sleep(rng.uniform(*config.gap_s))
                # Each fault hits a fleet that owns every partition again (a kill of a worker
                # still starting Spark tests nothing of the group); bounded, then injected anyway.
                waited = time.monotonic()
                while not ownership.settled(waited) and time.monotonic() - waited < config.settle_timeout_s:
                    time.sleep(0.5)
                if not ownership.settled(waited):
                    say(
                        f"the fleet did not own every partition within {config.settle_timeout_s:.0f}s; "
                        f"injecting {kind} anyway"
                    )
                started = time.monotonic()
                if kind == "table_kill" and committers is not None:
                    target, injected = committers.kill_one(), kind
                elif kind == "compact_kill" and compactor is not None:
                    target, injected = compactor.kill_in_job(rng), kind
                else:
                    target, injected = _inject(kind, fleet, pg, rng, config.workers + 2, t0, connect)
                fault = Fault(injected, target, started - t0, time.monotonic() - t0)
                if injected == "gc":
                    with Metastore(url) as store:
                        compact_problems += unlisted_files(store, source)
                monitor.ended(fault)
                say(
                    f"fault {injected} on {target} ({fault.ended - fault.started:.1f}s); "
                    f"delivered {producer.delivered_count()}/{config.records}"
                )
            producer.join(config.duration_s * 2 + 200)
            say(
                f"producer done: {producer.delivered_count()} delivered, {len(producer.errors)} errors; "
                "waiting for the fleet to catch up"
            )
            # Caught up means at Kafka's end offsets; with a single, non-transactional producer
            # they must equal what the delivery reports say was written.
            ends = end_offsets(kafka.bootstrap, TOPIC, config=kafka.props)
            if {p: e for p, e in ends.items() if e} != {p: e for p, e in producer.ends().items() if e}:
                producer.errors.append(f"Kafka's end offsets {ends} differ from the delivery reports {producer.ends()}")
            try:
                caught_up = wait_until(
                    lambda: caught_up_to(url, source, ends), config.catchup_timeout_s, "the catch-up", interval=1.0
                )
            except TimeoutError:
                caught_up = False  # reported with the verification below
            # Let the monitor see the final positions before it stops.
            time.sleep(1.5)
        finally:
            ownership.stop()
            monitor.stop()
            fleet.shutdown()
            committer_exits = committers.exited() if committers is not None else []
            if committers is not None:
                committers.stop()
            if compactor is not None:
                compactor.stop()
                compact_problems += compactor.problems()
        expected = {(TOPIC, p): sorted(d) for p, d in producer.delivered.items()}
        ids = producer.delivered
        with Metastore(url) as store:
            # Every split is settled now: gc with no grace at all must leave every published file.
            final_gc = collect_garbage(store, source, grace_s=0.0)
            say(
                f"caught up: {caught_up}; gc deleted {len(final_gc.deleted)} unpublished file(s) of "
                f"{final_gc.swept} build(s); verifying every published file"
            )
            compact_problems += unlisted_files(store, source)
            # Reads the current segments only (replaced_by IS NULL) and the files they list.
            verification = verify_exactly_once(store, source, expected)
            replaced = replaced_segments(store, source)
            conflicts = store.conflict_counts(source)

            def want(topic: str, partition: int, offset: int) -> dict[str, Any] | None:
                i = ids.get(partition, {}).get(offset) if topic == TOPIC else None
                return None if i is None else expected_row(i)

            payload_rows, payload_errors = verify_payloads(
                store, source, want, ["_key", "id", "user", "ts", "amount", "tags"]
            )
        table_rows, table_errors = verify_table(url, source, expected) if config.table else (0, [])
        table_errors += [f"a committer exited on its own (exit {rc})" for rc in committer_exits]
        if config.table:
            say(f"iceberg table: {table_rows} rows; {'; '.join(table_errors) or 'exactly once'}")
        # The operator's proof, after everything settled (the table committed up to date too).
        audit_code, audit_lines = audit_files(env, source)
        say(f"{replaced} segments replaced by compaction; ingest audit --files exited {audit_code}")
        secret_checked, shown = secret_shown(kafka, work, {"ingest audit": "\n".join(audit_lines)})
        return ChaosResult(
            config=config,
            produced=producer.delivered_count(),
            verification=verification,
            payload_rows=payload_rows,
            payload_errors=payload_errors,
            caught_up=caught_up,
            faults=monitor.faults,
            conflicts=conflicts,
            splits_killed=_count_kills(fleet.all),
            final_gc_problems=final_gc.unsafe,
            table_rows=table_rows,
            table_errors=table_errors,
            unplanned_exits=fleet.unplanned_exits,
            health_restarts=fleet.health_restarts,
            producer_errors=producer.errors,
            elapsed_s=time.monotonic() - t0,
            broker=f"{broker.describe()}; {kafka.describe()}",
            unowned_worst=ownership.worst,
            ownership_samples=ownership.samples,
            replaced=replaced,
            compact_problems=compact_problems,
            audit_code=audit_code,
            audit_lines=audit_lines,
            secret_checked=secret_checked,
            secret_shown=shown,
        )


def _iter_kinds(text: str) -> Iterator[str]:
    for kind in text.split(","):
        kind = kind.strip()
        if kind not in FAULT_KINDS:
            raise argparse.ArgumentTypeError(f"unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
        yield kind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the CI variant (~20k records, 5 faults)")
    parser.add_argument("--records", type=int, help="unique records to produce (default 500000)")
    parser.add_argument("--duration", type=float, help="seconds to spread the production over (default 300)")
    parser.add_argument("--workers", type=int, help="initial fleet size (default 3)")
    parser.add_argument("--partitions", type=int, help="topic partitions (default 6)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=lambda t: tuple(_iter_kinds(t)), help="comma-separated fault kinds")
    parser.add_argument("--fault-count", type=int, help="faults to inject (default 14)")
    parser.add_argument("--workdir", type=Path, help="keep logs, broker log and segments here")
    parser.add_argument(
        "--store",
        choices=("file", "s3"),
        help="segment store: a local directory (default) or an S3 API the run starts (moto)",
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="run table committers beside the workers (fault table_kill) and check the Iceberg table",
    )
    parser.add_argument(
        "--no-compact",
        action="store_true",
        help="no compactor beside the workers (and no compact_kill fault)",
    )
    parser.add_argument(
        "--start-from",
        choices=("earliest", "latest"),
        help="the source's start_from (latest: records produced before the fleet starts must stay out)",
    )
    parser.add_argument(
        "--format",
        choices=("json", "avro"),
        help="the records: JSON (default), or Avro through a local schema registry, three writer schema versions",
    )
    parser.add_argument(
        "--spark",
        choices=("local", "connect"),
        help="the workers' Spark: a JVM in each (default), or one Spark Connect server the run starts",
    )
    parser.add_argument(
        "--kafka-security",
        choices=KAFKA_SECURITY,
        help="every client on the broker's PLAINTEXT listener (default), or on SASL_SSL (SCRAM-SHA-512, a CA made now)",
    )
    parser.add_argument(
        "--group-protocol",
        choices=("classic", "consumer"),
        help="consumer group protocol: classic cooperative-sticky (default) or KIP-848's consumer",
    )
    args = parser.parse_args(argv)
    config = (
        ChaosConfig.quick(args.seed, args.workdir, table=args.table)
        if args.quick
        else ChaosConfig(seed=args.seed, workdir=args.workdir, table=args.table)
    )
    overrides = {
        "records": args.records,
        "duration_s": args.duration,
        "workers": args.workers,
        "partitions": args.partitions,
        "faults": args.faults,
        "fault_count": args.fault_count,
        "group_protocol": args.group_protocol,
        "store": args.store,
        "start_from": args.start_from,
        "format": args.format,
        "spark": args.spark,
        "kafka_security": args.kafka_security,
        "compact": False if args.no_compact else None,
    }
    from dataclasses import replace

    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    if config.records <= 0 or config.workers <= 0 or config.duration_s <= 0:
        parser.error("--records, --workers and --duration must be positive")
    result = run(config)
    print(result.summary(), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
