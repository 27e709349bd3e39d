"""Where a Spark JVM's CPU goes: the hottest frames of a Java Flight Recorder recording.

    SPARK_SUBMIT_OPTS="-XX:StartFlightRecording=filename=run.jfr,settings=profile,dumponexit=true" \\
        python -m bench.worker_profile --records 1000000
    python -m bench.profiling.jfr_top run.jfr [--top 30] [--match parquet,Json,UTF8String]

Reads the recording's execution samples with the JDK's own ``jfr`` tool (``jfr print --json
--events jdk.ExecutionSample``) and prints each thread's share of the samples, the innermost
frames with the largest share (self), and, for frames whose ``Class.method`` contains one of
``--match``, their share anywhere on the stack (inclusive: a frame counted once per sample).
A sample is one running Java thread caught every 10-20 ms (``settings=profile``); threads in
native code or waiting are not sampled, so shares are of the JVM's Java CPU, not of its GC or
JIT threads (``python -m bench.worker_profile`` has those, per thread, from /proc). Stacks are
read to ``STACK_DEPTH`` frames (``jfr print`` keeps only 5 unless told, which hides every outer
frame); one deeper than that, or than the recording's own ``stackdepth`` (64 by default), loses
its outermost frames, so an outer frame's inclusive share is a lower bound.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest_dev.java import find_java


@dataclass(frozen=True)
class Sample:
    thread: str
    # Innermost first, each "package/Class.method".
    frames: tuple[str, ...]


@dataclass(frozen=True)
class Summary:
    samples: int
    threads: list[tuple[str, int]]
    self_frames: list[tuple[str, int]]
    inclusive: list[tuple[str, int]]


def parse(recording: dict[str, Any]) -> list[Sample]:
    """The samples of ``jfr print --json``'s output."""
    out = []
    for event in recording["recording"]["events"]:
        values = event["values"]
        thread = values.get("sampledThread") or {}
        name = thread.get("javaName") or thread.get("osName") or "?"
        stack = values.get("stackTrace") or {}
        frames = tuple(
            f"{frame['method']['type']['name']}.{frame['method']['name']}" for frame in stack.get("frames") or ()
        )
        # Spark names its task threads "Executor task launch worker for task 12.0 in stage 3.0":
        # one name per pool thread, not per task.
        out.append(Sample(name.split(" for task")[0].split(" (")[0], frames))
    return out


def summarize(samples: Sequence[Sample], top: int = 30, match: Iterable[str] = ()) -> Summary:
    keys = tuple(match)
    threads: Counter[str] = Counter()
    self_frames: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for sample in samples:
        threads[sample.thread] += 1
        if sample.frames:
            self_frames[sample.frames[0]] += 1
        for frame in set(sample.frames):
            if any(key in frame for key in keys):
                inclusive[frame] += 1
    return Summary(len(samples), threads.most_common(10), self_frames.most_common(top), inclusive.most_common(top))


def report(summary: Summary) -> str:
    n = max(summary.samples, 1)
    lines = [f"{summary.samples:,} execution samples"]
    for title, rows in (
        ("threads", summary.threads),
        ("self (innermost frame)", summary.self_frames),
        ("inclusive (frames matching --match)", summary.inclusive),
    ):
        if rows:
            lines.append(f"-- {title}")
            lines += [f"{100 * count / n:5.1f} %  {name}" for name, count in rows]
    return "\n".join(lines)


# Frames read per sample: the recording's own default ``stackdepth``.
STACK_DEPTH = 64


def jfr_print_command(tool: Path, recording: Path, stack_depth: int = STACK_DEPTH) -> list[str]:
    """The JDK's ``jfr print`` of a recording's execution samples, ``stack_depth`` frames each."""
    return [
        *(str(tool), "print", "--json", "--stack-depth", str(stack_depth)),
        *("--events", "jdk.ExecutionSample", str(recording)),
    ]


def read_recording(path: Path) -> dict[str, Any]:
    java = find_java(11)
    if java is None:
        raise SystemExit("bench.profiling.jfr_top: no JDK found (the jfr tool sits beside java)")
    tool = java.parent / "jfr"
    if not tool.exists():
        raise SystemExit(f"bench.profiling.jfr_top: {java.parent} has no jfr tool (a JRE, not a JDK)")
    printed = subprocess.run(
        jfr_print_command(tool, path),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    recording: dict[str, Any] = json.loads(printed.stdout)
    return recording


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiling.jfr_top", description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path, help="a .jfr file")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--match",
        default="parquet,Json,json,UTF8String,zstd,Zstd",
        help="comma-separated substrings of Class.method for the inclusive table",
    )
    args = parser.parse_args(argv)
    samples = parse(read_recording(args.recording))
    print(report(summarize(samples, args.top, [m for m in args.match.split(",") if m])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
