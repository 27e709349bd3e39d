"""The worker profile's arithmetic and table (bench/profiling/report.py), and the agent's sampler."""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench.profiling.agent import ThreadProfiler, thread_cpu_clock
from bench.profiling.report import JVM_OTHER, jvm_group, profile_table, span_profile


def snapshot(at: float, scale: float) -> dict[str, Any]:
    return {
        "at": at,
        "samples": int(100 * scale),
        "process_cpu_s": 10.0 * scale,
        "tree_cpu_s": 30.0 * scale,
        "threads": {"MainThread": 4.0 * scale, "ingest-build-0": 3.0 * scale, "bench-profiler": 0.5 * scale},
        "gc": {"MainThread": 0.4 * scale},
        "stack": {"ingest-build-0": {"py4j": 1.0 * scale}},
        "self": {"MainThread": {"ingest/consume/loop.py:Loop.step": 2.0 * scale}, "ingest-build-0": {"x.py:f": 1.0}},
        "inclusive": {},
        "profiler_thread": "bench-profiler",
        "jvm_threads": {
            "9/10": {"name": "Executor task l", "cpu_s": 12.0 * scale},
            "9/11": {"name": "C2 CompilerThre", "cpu_s": 5.0 * scale},
            "9/12": {"name": "Thread-3", "cpu_s": 3.0 * scale},
        },
    }


def test_the_span_is_the_difference_of_two_snapshots_split_by_thread_and_side() -> None:
    result = span_profile(snapshot(100.0, 1.0), snapshot(110.0, 2.0), records=1_000_000)
    assert result["wall_s"] == 10.0 and result["tree_cpu_s"] == 30.0 and result["process_cpu_s"] == 10.0
    assert result["python_threads"] == {"MainThread": 4.0, "ingest-build-0": 3.0}
    assert result["profiler_cpu_s"] == 0.5
    # The process's CPU that no Python thread used: librdkafka's threads.
    assert result["native_threads_cpu_s"] == 10.0 - 7.5
    assert result["jvm_cpu_s"] == 20.0
    assert result["jvm_by_group"] == {"executor tasks (parse, write)": 12.0, "JIT compilers": 5.0, JVM_OTHER: 3.0}
    assert result["gc_by_thread"] == {"MainThread": 0.4}
    assert result["stack_by_thread"] == {"ingest-build-0": {"py4j": 1.0}}
    # A function that used nothing in the span is not listed.
    assert result["functions"] == [
        {"thread": "MainThread", "function": "ingest/consume/loop.py:Loop.step", "cpu_s": 2.0}
    ]
    assert result["cpu_s_per_million"] == 30.0


def test_jvm_threads_are_grouped_by_their_proc_names() -> None:
    assert jvm_group("Executor task l") == "executor tasks (parse, write)"
    assert jvm_group("C1 CompilerThre") == "JIT compilers"
    assert jvm_group("G1 Conc#0") == "GC" and jvm_group("GC Thread#1") == "GC"
    assert jvm_group("Thread-7") == JVM_OTHER


def test_the_table_lists_threads_with_their_parts_then_the_jvm_then_functions() -> None:
    result = span_profile(snapshot(100.0, 1.0), snapshot(110.0, 2.0), records=1_000_000)
    result.update(records=1_000_000, segments=7, interval_ms=10.0)
    text = profile_table(result, top=5)
    lines = text.splitlines()
    assert "1,000,000 records, 7 segments" in lines[0] and "30.0 CPU s (30.0 per million records)" in lines[0]
    names = [line.rsplit(None, 3)[0].strip() for line in lines[3:] if line.strip()]
    assert names.index("python: MainThread") < names.index("of which Python GC") < names.index("python: ingest-build-0")
    assert "of which in py4j (Python side)" in names
    assert names.index("native threads of the Python process (librdkafka)") < names.index(
        "JVM: executor tasks (parse, write)"
    )
    assert "MainThread: ingest/consume/loop.py:Loop.step" in text


def test_the_sampler_charges_a_busy_threads_cpu_to_the_function_it_runs(tmp_path: Path) -> None:
    def spin_here(until: float) -> None:
        while time.monotonic() < until:
            pass

    profiler = ThreadProfiler(0.005, tmp_path)
    busy = threading.Thread(target=spin_here, args=(time.monotonic() + 0.5,), name="busy")
    idle = threading.Thread(target=time.sleep, args=(0.5,), name="idle")
    busy.start()
    idle.start()
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        profiler.sample()
        time.sleep(0.005)
    busy.join()
    idle.join()
    snap = profiler.snapshot()
    assert snap["threads"]["busy"] > 0.05
    # Sleeping costs no CPU: nothing charged to the idle thread beyond noise.
    assert snap["threads"].get("idle", 0.0) < 0.02
    spin = [
        f
        for f in snap["self"]["busy"]
        if f.endswith(":test_the_sampler_charges_a_busy_threads_cpu_to_the_function_it_runs.<locals>.spin_here")
    ]
    assert spin and snap["self"]["busy"][spin[0]] > 0.05


def test_collections_during_a_sample_do_not_stop_the_sampler(tmp_path: Path) -> None:
    # The sampler allocates while it holds its lock; with a collection every few allocations one
    # runs inside sample() on its own thread, and its GC callback must not wait for that lock.
    old = gc.get_threshold()
    gc.set_threshold(5)
    try:
        profiler = ThreadProfiler(0.001, tmp_path)
        profiler.start()
        try:
            (tmp_path / "mark-a").touch()
            deadline = time.monotonic() + 10
            while not (tmp_path / "snap-a.json").exists() and time.monotonic() < deadline:
                _ = [object() for _ in range(100)]
                time.sleep(0.01)
        finally:
            # Stopped, not left sampling every thread of the test session every millisecond
            # (it once did, for the rest of the run, and crashed it walking another thread's frames).
            profiler.stop()
    finally:
        gc.set_threshold(*old)
    assert not any(t.name == "bench-profiler" for t in threading.enumerate())
    assert profiler._on_gc not in gc.callbacks
    snap = json.loads((tmp_path / "snap-a.json").read_text())
    assert snap["samples"] > 0 and snap["errors"] == 0
    assert sum(snap["gc"].values()) > 0


def test_a_threads_cpu_clock_is_the_kernels_and_an_ended_threads_only_fails() -> None:
    clock = thread_cpu_clock(threading.get_native_id())
    assert clock == time.pthread_getcpuclockid(threading.get_ident())
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    assert ended.native_id is not None
    # Unless the kernel already gave the id to another thread of this process (many threads
    # come and go in a test run), the ended thread's clock fails.
    if str(ended.native_id) not in os.listdir("/proc/self/task"):
        with pytest.raises(OSError):
            time.clock_gettime(thread_cpu_clock(ended.native_id))
