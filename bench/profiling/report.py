"""The profile of one worker over a span: two agent snapshots in, one table out (bench/profiling/worker.py).

Pure except :func:`jvm_threads`, which reads ``/proc``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.procs import ProcStat

_CLK_TCK = os.sysconf("SC_CLK_TCK")

# JVM thread names as /proc shows them (15 characters at most), by what they do.
JVM_GROUPS = (
    ("executor tasks (parse, write)", ("Executor task l",)),
    ("JIT compilers", ("C1 CompilerThre", "C2 CompilerThre")),
    ("GC", ("GC Thread", "G1 ", "VM Periodic Tas")),
)
JVM_OTHER = "other (Py4J connection threads, scheduler, listeners, ...)"


def jvm_threads(tree: dict[int, ProcStat], root: int) -> dict[str, dict[str, Any]]:
    """Every thread of the Java processes under ``root``: ``"pid/tid" -> {name, cpu_s}``."""
    threads: dict[str, dict[str, Any]] = {}
    for pid, st in tree.items():
        if pid == root or st.comm != "java":
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rfind(")") + 2 :].split()
            name = raw[raw.find("(") + 1 : raw.rfind(")")]
            threads[f"{pid}/{tid}"] = {"name": name, "cpu_s": (int(fields[11]) + int(fields[12])) / _CLK_TCK}
    return threads


def jvm_group(name: str) -> str:
    for group, prefixes in JVM_GROUPS:
        if name.startswith(prefixes):
            return group
    return JVM_OTHER


def _diff(end: dict[str, float], start: dict[str, float]) -> dict[str, float]:
    return {k: v - start.get(k, 0.0) for k, v in end.items() if v - start.get(k, 0.0) > 0}


def span_profile(start: dict[str, Any], end: dict[str, Any], records: int) -> dict[str, Any]:
    """The span between two snapshots: CPU per Python thread (its GC and Py4J parts), the native
    threads of the Python process, the JVM by thread group, the Python functions by self CPU."""
    threads = _diff(end["threads"], start["threads"])
    profiler = end.get("profiler_thread", "bench-profiler")
    process = end["process_cpu_s"] - start["process_cpu_s"]
    tree = end["tree_cpu_s"] - start["tree_cpu_s"]
    jvm: dict[str, float] = {}
    for key, thread in end["jvm_threads"].items():
        used = thread["cpu_s"] - start["jvm_threads"].get(key, {}).get("cpu_s", 0.0)
        if used > 0:
            group = jvm_group(thread["name"])
            jvm[group] = jvm.get(group, 0.0) + used
    functions = [
        {"thread": t, "function": f, "cpu_s": used}
        for t, funcs in end["self"].items()
        for f, used in _diff(funcs, start["self"].get(t, {})).items()
    ]
    functions.sort(key=lambda row: -row["cpu_s"])
    stack = {t: _diff(c, start.get("stack", {}).get(t, {})) for t, c in end.get("stack", {}).items()}
    return {
        "wall_s": end["at"] - start["at"],
        "samples": end["samples"] - start["samples"],
        "tree_cpu_s": tree,
        "process_cpu_s": process,
        "python_threads": {t: v for t, v in threads.items() if t != profiler},
        "profiler_cpu_s": threads.get(profiler, 0.0),
        "gc_by_thread": _diff(end["gc"], start["gc"]),
        "stack_by_thread": {t: c for t, c in stack.items() if c},
        "native_threads_cpu_s": max(0.0, process - sum(threads.values())),
        # The JVM: the process tree minus the Python process, and by its threads' names.
        "jvm_cpu_s": tree - process,
        "jvm_by_group": jvm,
        "functions": functions,
        "cpu_s_per_million": tree / max(records, 1) * 1e6,
    }


def profile_table(result: dict[str, Any], top: int = 25) -> str:
    per_m = 1e6 / max(result["records"], 1)
    tree = result["tree_cpu_s"] or 1e-9
    rows: list[tuple[str, float]] = []
    for name, used in sorted(result["python_threads"].items(), key=lambda kv: -kv[1]):
        rows.append((f"python: {name}", used))
        gc_used = result["gc_by_thread"].get(name)
        if gc_used:
            rows.append(("    of which Python GC", gc_used))
        for category, inside in sorted(result["stack_by_thread"].get(name, {}).items()):
            rows.append((f"    of which in {category} (Python side)", inside))
    rows.append(("python: the profiler's sampler (overhead)", result["profiler_cpu_s"]))
    rows.append(("native threads of the Python process (librdkafka)", result["native_threads_cpu_s"]))
    for group, used in sorted(result["jvm_by_group"].items(), key=lambda kv: -kv[1]):
        rows.append((f"JVM: {group}", used))
    rows.append(("JVM in all (process tree minus the Python process)", result["jvm_cpu_s"]))
    rows.append(("total (worker process tree)", result["tree_cpu_s"]))
    width = max(len(name) for name, _ in rows)
    out = [
        f"where one worker's CPU goes: {result['records']:,} records, {result['segments']} segments, "
        f"{result['wall_s']:.1f} s from its first assignment to the last publish; "
        f"{result['tree_cpu_s']:.1f} CPU s ({result['cpu_s_per_million']:.1f} per million records)",
        f"{'part':<{width}}  {'CPU s':>8}  {'per M rec':>9}  {'share':>6}",
        f"{'-' * width}  {'-' * 8}  {'-' * 9}  {'-' * 6}",
    ]
    for name, used in rows:
        out.append(f"{name:<{width}}  {used:8.2f}  {used * per_m:9.2f}  {used / tree:6.1%}")
    out.append("")
    out.append(f"Python functions by self CPU (top {top}; sampled every {result['interval_ms']:g} ms):")
    for row in result["functions"][:top]:
        out.append(f"  {row['cpu_s']:8.2f} s  {row['cpu_s'] * per_m:7.2f}/M  {row['thread']}: {row['function']}")
    return "\n".join(out)
