"""``python -m bench.compaction``: what ``ingest compact`` does to the small segments a fresh
stream leaves, and what it costs (issue 30's figures).

    python -m bench.compaction [--records 3000000] [--partitions 6] [--split-records 10000]
                               [--max-age 2s] [--target-size 256MiB] [--quick] [--out DIR]
                               [--database-url URL --bootstrap HOST:PORT] [--keep]

Starts a private PostgreSQL and Apache Kafka (127.0.0.1 only) unless ``--database-url`` (a
migrated or empty database) and ``--bootstrap`` name running ones. Produces the bench's records
(``bench.data``) to a topic of its own, ingests them with one worker (``bench.ingest_runs``)
whose splits are the demo's (``max_records`` 10,000 per partition, ``max_age`` 2 s: what a
partition receiving 5,000 records/s seals), so 3M records leave about 300 small segments; then
runs ``ingest compact SOURCE --json`` as a process of its own and measures:

- before and after, from the metastore's current segments and the files they list: segments,
  data files, bytes, and the p10 / median / p90 data file size;
- the compaction's wall time and CPU seconds: user + system over the process tree (the command
  and its Spark JVM, ``bench.procs.TreeSampler``), or the command's rusage (``os.wait4``: it
  and the descendants it reaped) when that is larger; both only ever miss CPU, never add it;
- GB read (the replaced segments' bytes) and CPU seconds per GB.

Then ``ingest audit SOURCE --files`` must exit 0 and every produced offset must be in exactly
one current segment's file (``ingest_dev.verify``). Prints one table, writes
``DIR/compaction.json``; exit 1 when the audit, the exactly-once check or the compaction failed.
``--quick`` (60,000 records over 2 partitions, splits of 2,000) is the CI smoke test's size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.console import exit_on_sigterm, log
from bench.data import produce_dataset
from bench.ingest_runs import REPO, Context, SplitConfig, run_throughput, verify, worker_env
from bench.procs import TreeSampler, parse_log_time
from bench.stats import percentile
from ingest.spec.parse import parse_size
from ingest_dev.kafka import LocalKafka
from ingest_dev.kafka_clients import create_topic
from ingest_dev.postgres import LocalPostgres
from ingest_dev.process import popen, run_process
from ingest_dev.verify import store_shape as verify_store_shape
from metastore import Metastore, apply_migrations

GB = 1e9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compaction",
        description="Small segments from one worker, then one `ingest compact`: files, sizes and CPU per GB.",
    )
    parser.add_argument("--records", type=int, help="records to produce (default 3,000,000; --quick 60,000)")
    parser.add_argument("--partitions", type=int, help="topic partitions (default 6; --quick 2)")
    parser.add_argument(
        "--split-records", type=int, help="split max_records per partition (default 10,000 as the demo; --quick 2,000)"
    )
    parser.add_argument("--max-age", default="2s", help="split max_age (default 2s, as the demo)")
    parser.add_argument(
        "--target-size", help="ingest compact --target-size (default: the spec's, 256MiB)", default=None
    )
    parser.add_argument("--driver-memory", help="Spark driver memory of the worker and the compaction (default 2g)")
    parser.add_argument("--timeout", type=float, help="bound on each phase, seconds (default 1800; --quick 150)")
    parser.add_argument(
        "--quick", action="store_true", help="60,000 records, 2 partitions, splits of 2,000: the CI smoke test"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="gets compaction.json")
    parser.add_argument("--database-url", help="a running PostgreSQL database to use (migrated here)")
    parser.add_argument("--bootstrap", help="a running Kafka to use (a topic of its own is created)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, segments)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.records = args.records or (60_000 if quick else 3_000_000)
    # --quick: two partitions are two Spark jobs in the compaction, not six (a smoke test).
    args.partitions = args.partitions or (2 if quick else 6)
    args.split_records = args.split_records or (2_000 if quick else 10_000)
    args.driver_memory = args.driver_memory or ("1g" if quick else "2g")
    args.timeout = args.timeout or (150.0 if quick else 1800.0)
    if args.records <= 0 or args.partitions <= 0 or args.split_records <= 0:
        parser.error("--records, --partitions and --split-records must be positive")
    if args.target_size is not None:
        parse_size("--target-size", args.target_size)  # a bad size fails before anything starts
    if (args.database_url is None) != (args.bootstrap is None):
        parser.error("--database-url and --bootstrap go together")
    return args


# --------------------------------------------------------------------------- the store's shape


def store_shape(database_url: str, source: str) -> dict[str, Any]:
    """The source's current segments and their data files (``ingest_dev.verify.store_shape``)."""
    with Metastore(database_url) as store:
        shape = verify_store_shape(store, source)
    sizes = [float(n) for n in shape.file_sizes]
    return {
        "segments": shape.segments,
        "files": shape.files,
        "rejects_files": shape.rejects_files,
        "bytes": shape.bytes,
        "rows": shape.rows,
        "file_bytes_p10": percentile(sizes, 10),
        "file_bytes_p50": percentile(sizes, 50),
        "file_bytes_p90": percentile(sizes, 90),
    }


# --------------------------------------------------------------------------- the commands


def _ingest_env(ctx: Context) -> dict[str, str]:
    # The workers' settings (metastore, Kafka, Spark master and memory, JSON logs).
    return worker_env(ctx, "local[2]", 2)


def _ingest_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ingest", *args]


def _json_document(text: str) -> dict[str, Any]:
    """The command's ``--json`` document: the first object on stdout (the JVM may print lines before it)."""
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON document in the output: {text[-500:]!r}")
    doc, _end = json.JSONDecoder().raw_decode(text, start)
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object: {doc!r}")
    return doc


@contextlib.contextmanager
def _group_stopped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Kill what is left of the command's process group on the way out: the command itself
    after a timeout, or a JVM it left behind."""
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            with contextlib.suppress(ChildProcessError):
                os.wait4(proc.pid, 0)
            proc.returncode = -signal.SIGKILL


@dataclass(frozen=True)
class TimedRun:
    """One ``ingest`` command run as a process: its wall time, its CPU (the process tree with
    its JVM, or its rusage when larger: both only ever miss CPU), its stdout and log."""

    wall_s: float
    cpu_s: float
    cpu_s_process_tree: float
    cpu_s_rusage: float
    stdout: str
    log_path: Path
    sampler: TreeSampler


def run_timed(ctx: Context, label: str, *args: str) -> TimedRun:
    """``ingest ARGS`` as a process of its own, timed; RuntimeError unless it exits 0."""
    logs = ctx.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = logs / f"{label}.out", logs / f"{label}.log"
    sampler = TreeSampler(interval=0.1)
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        started = time.monotonic()
        proc = popen(
            _ingest_command(*args), env=_ingest_env(ctx), cwd=REPO, stdout=out, stderr=err, start_new_session=True
        )
        with _group_stopped(proc):
            sampler.add_root(proc.pid)
            sampler.start()
            deadline = started + ctx.timeout
            while True:
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    wall = time.monotonic() - started
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() > deadline:
                    sampler.stop()
                    raise TimeoutError(f"ingest {label} did not finish in {ctx.timeout:.0f} s; log: {stderr_path}")
                time.sleep(0.05)
    sampler.stop()
    tree_cpu = sampler.samples[-1].cpu_s if sampler.samples else 0.0
    rusage_cpu = rusage.ru_utime + rusage.ru_stime
    text = stdout_path.read_text(errors="replace")
    if proc.returncode != 0:
        tail = stderr_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"ingest {label} exited with {proc.returncode}\nstdout:\n{text[-2000:]}\nstderr:\n{tail}")
    return TimedRun(wall, max(tree_cpu, rusage_cpu), tree_cpu, rusage_cpu, text, stderr_path, sampler)


def run_compact(ctx: Context, source: str, target_size: str | None) -> dict[str, Any]:
    """``ingest compact SOURCE --json`` as a process; its figures and the document it printed."""
    args = ["compact", source, "--json", *(["--target-size", target_size] if target_size else [])]
    timed = run_timed(ctx, "compact", *args)
    text, wall, tree_cpu, rusage_cpu = timed.stdout, timed.wall_s, timed.cpu_s_process_tree, timed.cpu_s_rusage
    sampler, stderr_path = timed.sampler, timed.log_path
    doc = _json_document(text)
    replaced = doc["replaced"]
    read_bytes = sum(int(r["bytes_before"]) for r in replaced)
    cpu = timed.cpu_s
    return {
        "exit_code": 0,
        "target_bytes": doc["target_bytes"],
        "runs": len(replaced),
        "refused": len(doc["refused"]),
        "segments_replaced": sum(len(r["replaced"]) for r in replaced),
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_s_process_tree": tree_cpu,
        "cpu_s_rusage": rusage_cpu,
        "peak_rss_mb": sampler.peak_rss_bytes() / 2**20,
        "bytes_read": read_bytes,
        "gb_read": read_bytes / GB,
        "bytes_written": sum(int(r["bytes_after"]) for r in replaced),
        "cpu_s_per_gb": cpu / (read_bytes / GB) if read_bytes else None,
        "seconds_per_run": [float(r["seconds"]) for r in replaced],
        **_after_first_run(sampler, stderr_path, replaced),
    }


def _after_first_run(sampler: TreeSampler, log_path: Path, replaced: list[dict[str, Any]]) -> dict[str, Any]:
    """The cost of the runs after the first one, which started the Spark session: the process
    tree's CPU from the first ``compaction_replaced`` event to the end (the sampler and the log
    share the wall clock), and what those runs read. Without a second run: None."""
    done = [e for e in _log_events(log_path) if e.get("event") == "compaction_replaced"]
    if len(replaced) < 2 or len(done) != len(replaced):
        return {"cpu_s_after_first_run": None, "gb_read_after_first_run": None, "cpu_s_per_gb_after_first_run": None}
    cpu = sampler.samples[-1].cpu_s - sampler.cpu_at(parse_log_time(done[0]["timestamp"]))
    read = sum(int(r["bytes_before"]) for r in replaced[1:]) / GB
    return {"cpu_s_after_first_run": cpu, "gb_read_after_first_run": read, "cpu_s_per_gb_after_first_run": cpu / read}


def _log_events(path: Path) -> list[dict[str, Any]]:
    """The command's JSON log events (the JVM's plain lines skipped)."""
    events = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    return events


def run_audit(ctx: Context, source: str) -> dict[str, Any]:
    """``ingest audit SOURCE --files --json``: its exit code and findings."""
    proc = run_process(
        _ingest_command("audit", source, "--files", "--json"),
        env=_ingest_env(ctx),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=ctx.timeout,
        check=False,
    )
    try:
        doc = _json_document(proc.stdout)
    except ValueError:
        doc = {}
    findings = doc.get("findings", [])
    return {
        "exit_code": proc.returncode,
        "ok": proc.returncode == 0,
        "findings": len(findings) if isinstance(findings, list) else findings,
        "first_findings": findings[:10] if isinstance(findings, list) else [],
        "stderr_tail": "" if proc.returncode == 0 else proc.stderr[-2000:],
    }


# --------------------------------------------------------------------------- the run


def run(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    topic = f"compaction-{uuid.uuid4().hex[:8]}"
    create_topic(ctx.bootstrap, topic, args.partitions)
    data = produce_dataset(ctx.bootstrap, topic, args.records, args.partitions, timeout=max(120.0, args.records / 5000))
    log(f"produced {data.records:,} records to {topic} in {data.seconds:.1f} s")
    split = SplitConfig(max_records=args.split_records, max_age=args.max_age)
    ingest, fleet = run_throughput(ctx, topic, data, 1, "local[2]", 2, split, "compaction")
    fleet.stop()
    source = ingest["source"]
    log(f"ingested by one worker in {ingest['wall_s']:.1f} s; {ingest['segments']} segments published")
    before = store_shape(ctx.database_url, source)
    log(f"before: {before['segments']} segments, {before['files']} files, {before['bytes']:,} bytes; compacting")
    compaction = run_compact(ctx, source, args.target_size)
    after = store_shape(ctx.database_url, source)
    log(f"compacted {compaction['runs']} run(s) in {compaction['wall_s']:.1f} s; auditing")
    audit = run_audit(ctx, source)
    exactly_once = verify(ctx, source, topic, data.ends)
    return {
        "source": source,
        "topic": topic,
        "records": data.records,
        "value_bytes": data.value_bytes,
        "ingest": {k: ingest[k] for k in ("wall_s", "records_per_s", "cpu_s", "segments")},
        "before": before,
        "after": after,
        "compaction": compaction,
        "audit": audit,
        "exactly_once": exactly_once,
    }


def _size(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def table(result: dict[str, Any]) -> str:
    head = ["", "segments", "files", "total", "p10 file", "median file", "p90 file"]
    lines = [head]
    for label in ("before", "after"):
        s = result[label]
        lines.append(
            [
                label,
                f"{s['segments']:,}",
                f"{s['files']:,}",
                _size(s["bytes"]),
                _size(s["file_bytes_p10"]),
                _size(s["file_bytes_p50"]),
                _size(s["file_bytes_p90"]),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    rows = "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in lines
    )
    c = result["compaction"]
    per_gb = f"{c['cpu_s_per_gb']:,.0f}" if c["cpu_s_per_gb"] is not None else "n/a"
    marginal = ""
    if c["cpu_s_per_gb_after_first_run"] is not None:
        marginal = (
            f"; after the first run (Spark started): {c['cpu_s_after_first_run']:.1f} CPU s for "
            f"{c['gb_read_after_first_run']:.3f} GB -> {c['cpu_s_per_gb_after_first_run']:,.0f} CPU s per GB"
        )
    return (
        f"{rows}\n"
        f"ingest compact: {c['runs']} run(s), {c['segments_replaced']} segments replaced, "
        f"target {c['target_bytes'] / 2**20:g} MiB; wall {c['wall_s']:.1f} s, CPU {c['cpu_s']:.1f} s "
        f"(process tree with its JVM), read {c['gb_read']:.3f} GB -> {per_gb} CPU s per GB{marginal}\n"
        f"ingest audit --files: {'passed' if result['audit']['ok'] else 'FAILED'} "
        f"(exit {result['audit']['exit_code']}, {result['audit']['findings']} finding(s))\n"
        f"exactly once: {'ok' if result['exactly_once']['ok'] else 'FAILED'}, {result['exactly_once']['summary']}"
    )


def run_on_servers(
    args: argparse.Namespace,
    name: str,
    run: Callable[[Context, argparse.Namespace], dict[str, Any]],
    settings: Mapping[str, Any],
    report: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """``run`` on a private PostgreSQL and Kafka (or ``--database-url`` and ``--bootstrap``'s), in
    a working directory of its own (kept with ``--keep``). Its result, with ``config`` holding
    the run's ``settings``, the machine's load and the run's times, is written to
    ``--out``/``name``.json and printed by ``report``; returned for the caller's verdict."""
    exit_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"ingest_bench_{name}_"))
    log(f"working directory {work}")
    load_start = os.getloadavg()[0]
    started = time.time()
    try:
        with contextlib.ExitStack() as servers:
            if args.database_url is not None:
                database_url, bootstrap = args.database_url, args.bootstrap
            else:
                database_url = servers.enter_context(LocalPostgres()).url
                broker = servers.enter_context(LocalKafka(base_dir=work / "broker"))
                bootstrap = broker.bootstrap
                log(f"broker: {broker.describe()}")
            apply_migrations(database_url)
            ctx = Context(database_url, bootstrap, work, args.driver_memory, args.timeout, log)
            result = run(ctx, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()[0]
    result["config"] = {
        **settings,
        "cpus": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": time.time() - started,
    }
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(report(result))
    print(f"load average {load_start:.1f} at start, {load_end:.1f} at end")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = {
        "records": args.records,
        "partitions": args.partitions,
        "split_records": args.split_records,
        "max_age": args.max_age,
        "target_size": args.target_size or "the spec's default",
        "driver_memory": args.driver_memory,
        "spark_master": "local[2]",
        "quick": args.quick,
    }
    result = run_on_servers(args, "compaction", run, settings, table)
    ok = result["audit"]["ok"] and result["exactly_once"]["ok"] and result["compaction"]["refused"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
