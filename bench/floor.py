"""What a segment built by Spark costs at least, next to what pyarrow pays for the same file.

No broker and no metastore: the benchmark's records are made in memory and built three ways
in one process, each timed and its CPU counted per million records:

- ``pyarrow``: the raw baseline's build (``pyarrow.json`` with the explicit schema, zstd
  Parquet), in this process;
- ``worker build``: the worker's own ``SparkSegmentBuilder.build_batch`` on one batch of
  ``--splits`` splits (staging in this process, ``from_json`` and the zstd write in the JVM),
  after the same warm-up a worker does before it joins its group;
- ``spark copy``: Spark reading columns pyarrow has already parsed (staged uncompressed) and
  writing them as zstd Parquet: the least any segment written by Spark costs, whoever parses.

With ``--dictionary-page-bytes A,B,...`` the worker build runs once per Parquet dictionary
limit in every round (the first is the ``worker build`` row), on the same session and batch.
Rounds alternate between the Spark jobs so that drift of the machine, and the JIT still
compiling, hit each alike.
The JVM's CPU is read from ``/proc`` (the Spark JVM is a child of this process).

    python -m bench.floor [--records 1000000] [--splits 6] [--rounds 4] [--out floor.json]
        [--dictionary-page-bytes 32768,1048576]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.data import EVENT_TIME, SCHEMA, record_value
from bench.procs import process_tree
from bench.raw import cpu_seconds, parse_values
from ingest.builder.job import DICTIONARY_PAGE_BYTES, SparkSegmentBuilder
from ingest.builder.plan import META_COLUMNS
from ingest.config import WARM_UP_RECORDS
from ingest.logs import configure_logging
from ingest.spark.session import create_session
from ingest.spec import SourceSpec, spec_from_dict
from ingest.splits.chunks import chunks_of
from ingest.splits.split import KillSwitch, SealedSplit, SyntheticRecord
from ingest_common.model import BuildRegistration, BuiltSegment, TopicPartition


def _children_cpu_s() -> float:
    """CPU of every live descendant of this process (the Spark JVM and its launcher)."""
    me = os.getpid()
    return sum(st.cpu_s for pid, st in process_tree([me]).items() if pid != me)


def _measure(records: int, run: Callable[[], None]) -> dict[str, float]:
    wall, own, jvm = time.monotonic(), cpu_seconds(), _children_cpu_s()
    run()
    wall, own, jvm = time.monotonic() - wall, cpu_seconds() - own, _children_cpu_s() - jvm
    per_m = 1_000_000 / records
    return {
        "wall_s": wall,
        "records_per_s": records / wall,
        "python_cpu_s_per_million": own * per_m,
        "jvm_cpu_s_per_million": jvm * per_m,
        "cpu_s_per_million": (own + jvm) * per_m,
    }


def _spec(store: Path) -> SourceSpec:
    return spec_from_dict(
        {
            "name": "floor",
            "topics": ["floor"],
            "event_time": EVENT_TIME,
            "segment_store": "file://" + str(store),
            "on_parse_error": "reject",
            "schema": dict(SCHEMA),
        }
    )


def _splits(values: list[bytes], count: int) -> list[SealedSplit]:
    """``values`` dealt into ``count`` splits, as a worker's partitions would hold them."""
    now = time.monotonic()
    out = []
    for n in range(count):
        part = values[n::count]
        out.append(
            SealedSplit(
                id=uuid.uuid4(),
                tp=TopicPartition("floor", n),
                serial=1,
                start=0,
                end=len(part),
                chunks=chunks_of([SyntheticRecord(i, v) for i, v in enumerate(part)]),
                size_bytes=sum(map(len, part)),
                first_record_at=now,
                sealed_at=now,
                seal_reason="records",
                kill_switch=KillSwitch(),
            )
        )
    return out


def _typed_staging(values: list[bytes], splits: list[SealedSplit], work: Path) -> list[str]:
    """Each split's values (dealt as ``_splits`` deals them) parsed by pyarrow, with the
    worker's metadata columns, staged uncompressed."""
    files = []
    for split in splits:
        n = len(split)
        table = parse_values(b"\n".join(values[split.tp.partition :: len(splits)]))
        meta = [
            pa.array([split.tp.topic] * n, pa.string()),
            pa.array([split.tp.partition] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.nulls(n, pa.timestamp("ms", tz="UTC")),
            pa.nulls(n, pa.binary()),
        ]
        for name, column in zip(reversed(META_COLUMNS), reversed(meta), strict=True):
            table = table.add_column(0, name, column)
        path = work / f"typed-{split.tp.partition}.parquet"
        pq.write_table(table, path, compression="none")
        files.append(str(path))
    return files


class _TempDirBuilds:
    """The floor builds into a temporary directory it removes itself: no metastore, so
    there is nothing to register (a worker registers every build; see ingest.builder.registration)."""

    def register(self, build: BuildRegistration, splits: Sequence[SealedSplit]) -> None:
        return None


def run(
    records: int,
    splits: int,
    rounds: int,
    master: str,
    warm_up: tuple[int, int] = (WARM_UP_RECORDS, 2),
    dictionary_page_bytes: Sequence[int] = (DICTIONARY_PAGE_BYTES,),
) -> dict[str, Any]:
    values = [record_value(i) for i in range(records)]
    work = Path(tempfile.mkdtemp(prefix="ingest_floor_"))
    try:

        def pyarrow_build(i: int) -> None:
            pq.write_table(parse_values(b"\n".join(values)), work / f"pyarrow-{i}.parquet", compression="zstd")

        pyarrow_runs = [_measure(records, partial(pyarrow_build, i)) for i in range(rounds)]

        spec = _spec(work / "segments")
        batch = _splits(values, splits)
        typed = _typed_staging(values, batch, work)
        spark = create_session(master)
        try:
            builders = [SparkSegmentBuilder(spark, _TempDirBuilds(), limit) for limit in dictionary_page_bytes]
            warm_up_s = builders[0].warm_up(spec, records=warm_up[0], splits=warm_up[1])

            def worker_build(builder: SparkSegmentBuilder) -> None:
                built = 0
                for result in builder.build_batch(batch, spec):
                    if not isinstance(result, BuiltSegment):
                        raise result
                    built += result.row_count
                    builder.discard(result)
                if built != records:
                    raise RuntimeError(f"the batch built {built} rows of {records}")

            def spark_copy(i: int) -> None:
                out = work / f"copy-{i}"
                spark.read.parquet(*typed).write.option("compression", "zstd").parquet(str(out))
                shutil.rmtree(out)

            build_runs: list[list[dict[str, float]]] = [[] for _ in builders]
            copy_runs = []
            for i in range(rounds):
                for runs, builder in zip(build_runs, builders, strict=True):
                    runs.append(_measure(records, partial(worker_build, builder)))
                copy_runs.append(_measure(records, partial(spark_copy, i)))
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "config": {
            "records": records,
            "splits": splits,
            "rounds": rounds,
            "master": master,
            "warm_up_records": warm_up[0],
            "warm_up_splits": warm_up[1],
            "warm_up_s": warm_up_s,
            "dictionary_page_bytes": list(dictionary_page_bytes),
        },
        "pyarrow": pyarrow_runs,
        "worker_build": build_runs[0],
        # Every limit's runs, the first's included (the same list as worker_build).
        "worker_build_by_dictionary": {
            str(limit): runs for limit, runs in zip(dictionary_page_bytes, build_runs, strict=True)
        },
        "spark_copy": copy_runs,
    }


def _median(runs: list[dict[str, float]], key: str) -> float:
    # The first round of a Spark job still carries the JVM's warm-up: the median is of the rest.
    return statistics.median(r[key] for r in (runs[1:] or runs))


def report(result: dict[str, Any]) -> str:
    rows = [
        ("pyarrow parse + zstd write", "pyarrow"),
        ("worker build (from_json)", "worker_build"),
        ("spark copy of parsed columns", "spark_copy"),
    ]
    limits = result["config"]["dictionary_page_bytes"]
    if len(limits) > 1:
        rows[1:2] = [(f"worker build, dictionary {int(b):,} B", b) for b in limits]
    lines = [f"{'build':<35} {'first s':>8} {'rec/s (median)':>15} {'CPU s/M':>8} {'JVM':>6} {'Python':>7}"]
    for label, key in rows:
        runs = result[key] if key in result else result["worker_build_by_dictionary"][str(key)]
        lines.append(
            f"{label:<35} {runs[0]['wall_s']:>8.2f} {_median(runs, 'records_per_s'):>15,.0f} "
            f"{_median(runs, 'cpu_s_per_million'):>8.1f} {_median(runs, 'jvm_cpu_s_per_million'):>6.1f} "
            f"{_median(runs, 'python_cpu_s_per_million'):>7.1f}"
        )
    cfg = result["config"]
    lines.append(
        f"{cfg['records']:,} records in {cfg['splits']} splits, {cfg['rounds']} rounds, {cfg['master']}; "
        f"medians exclude the first round; worker warm-up took {cfg['warm_up_s']:.1f} s"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--splits", type=int, default=6, help="splits of the batch (the benchmark's partitions)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--warm-up",
        type=int,
        nargs=2,
        default=(WARM_UP_RECORDS, 2),
        metavar=("RECORDS", "SPLITS"),
        help=f"the Spark warm-up before the first round: records in all, splits "
        f"(default: the worker's, {WARM_UP_RECORDS} records in 2 splits)",
    )
    parser.add_argument(
        "--dictionary-page-bytes",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[DICTIONARY_PAGE_BYTES],
        help=f"comma-separated Parquet dictionary limits to build with, interleaved (default {DICTIONARY_PAGE_BYTES}, "
        "the worker's; Parquet's own is 1048576)",
    )
    parser.add_argument("--out", type=Path, help="write the runs as JSON here")
    args = parser.parse_args(argv)
    configure_logging(level=logging.WARNING)
    if args.records < args.splits or args.rounds < 1:
        parser.error("need --records >= --splits and --rounds >= 1")
    result = run(args.records, args.splits, args.rounds, args.master, tuple(args.warm_up), args.dictionary_page_bytes)
    print(report(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
