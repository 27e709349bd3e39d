"""The bench's outputs: one table on stdout, results.json, chart.png."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SYSTEMS = ("ingest_1", "ingest_n", "raw", "peer", "spark")
# The systems each ingest run is compared with, in the table's ratio columns.
OTHERS = ("raw", "peer", "spark")


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def label(key: str, row: dict[str, Any]) -> str:
    if key.startswith("ingest"):
        return f"ingest ({row.get('workers', '?')} worker{'s' if row.get('workers') != 1 else ''})"
    return {
        "raw": "raw baseline",
        "peer": "peer: quixstreams",
        "spark": "peer: spark structured streaming",
    }.get(key, key)


def ratios(throughput: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """records/s of each ingest run over the raw baseline and over each peer (None where one is missing)."""
    out: dict[str, float | None] = {}
    for key in ("ingest_1", "ingest_n"):
        mine = throughput.get(key, {}).get("records_per_s")
        for other in OTHERS:
            theirs = throughput.get(other, {}).get("records_per_s")
            out[f"{key}/{other}"] = mine / theirs if mine and theirs else None
    return out


def table(results: dict[str, Any]) -> str:
    tp: dict[str, dict[str, Any]] = results["throughput"]
    r = results["ratios"]
    head = [
        "system",
        "records",
        "wall s",
        "records/s",
        "MB/s",
        "CPU s/M rec",
        "of it worker",
        "peak RSS MB",
        "/ raw",
        "/ quix",
        "/ spark",
    ]
    rows: list[list[str]] = []
    missing: list[str] = []
    for key in SYSTEMS:
        row = tp.get(key)
        if row is None:
            continue
        if row.get("status") == "n/a":
            rows.append([label(key, row), "n/a", *([""] * (len(head) - 2))])
            missing.append(f"{label(key, row)}: n/a, {row.get('reason', 'no reason given')}")
            continue
        rows.append(
            [
                label(key, row),
                _fmt(row["records"]),
                _fmt(row["wall_s"], 2),
                _fmt(row["records_per_s"], 0),
                _fmt(row["mb_per_s"], 2),
                _fmt(row["cpu_s_per_million"], 1),
                _fmt(row.get("worker_process_cpu_s_per_million"), 2) if key.startswith("ingest") else "",
                _fmt(row["peak_rss_mb"], 0),
                *(_fmt(r.get(f"{key}/{other}"), 3) if key.startswith("ingest") else "" for other in OTHERS),
            ]
        )
    widths = [max(len(head[i]), *(len(x[i]) for x in rows)) for i in range(len(head))]
    broker = results.get("broker")

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))

    out = [f"broker: {broker}"] if broker else []
    out += [line(head), line(["-" * w for w in widths]), *(line(x) for x in rows), *missing]
    repeated = [(key, tp[key]["runs_records_per_s"]) for key in SYSTEMS if "runs_records_per_s" in tp.get(key, {})]
    if repeated:
        out.append(
            "median of runs; records/s of each run: "
            + "; ".join(
                f"{label(key, tp[key])} " + " / ".join(_fmt(float(v), 0) for v in runs) for key, runs in repeated
            )
        )
    lat = results.get("latency", {})
    pub = lat.get("publish_transaction_ms", {})
    out.append("")
    out.append(
        f"publish transaction: p50 {_fmt(pub.get('p50'), 2)} ms, p99 {_fmt(pub.get('p99'), 2)} ms "
        f"({pub.get('n', 0)} publishes)"
    )
    for key in ("steady", "steady_n"):
        steady = lat.get(key)
        if not steady:
            continue
        vis = steady.get("produce_to_visible_s", {})
        pub_steady = steady.get("publish_ms_steady", {})
        out.append(
            f"produce-to-visible, {steady.get('workers', 1)} worker(s), {_fmt(steady.get('rate_per_s'), 0)} records/s "
            f"for {_fmt(steady.get('duration_s'), 0)} s: p50 {_fmt(vis.get('p50'), 2)} s, "
            f"p99 {_fmt(vis.get('p99'), 2)} s ({vis.get('n', 0)} segments; split max_age "
            f"{results['config']['split']['max_age']}); publish p50 {_fmt(pub_steady.get('p50'), 2)} ms, "
            f"p99 {_fmt(pub_steady.get('p99'), 2)} ms"
        )
    spark_lat = lat.get("spark")
    if spark_lat:
        sv = spark_lat["produce_to_visible_s"]
        out.append(
            f"spark structured streaming produce-to-visible, processingTime "
            f"{_fmt(spark_lat['trigger_processing_time_s'], 1)} s: p50 {_fmt(sv.get('p50'), 2)} s, "
            f"p99 {_fmt(sv.get('p99'), 2)} s ({sv.get('n', 0)} batches; exactly-once: {spark_lat['exactly_once']})"
        )
    if lat.get("saturated"):
        out.append(f"latency phases ran with {lat['saturated']} busy-loop processes saturating the cores")
    one = tp.get("ingest_1", {})
    if one.get("first_segment_after_start_s") is not None:
        out.append(
            f"cold start (one fresh worker): first segment published {_fmt(one['first_segment_after_start_s'], 2)} s "
            f"after the worker started; first {_fmt(one['first_million_records'], 0)} records at "
            f"{_fmt(one['first_million_records_per_s'], 0)} records/s"
            + (
                f" ({_fmt(one['first_million_records_per_s'] / tp['raw']['records_per_s'], 3)}x raw)"
                if tp.get("raw", {}).get("records_per_s")
                else ""
            )
        )
    checks = results.get("exactly_once", {})
    if checks:
        out.append(
            "exactly-once checks: " + ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'}" for k, v in checks.items())
        )
    return "\n".join(out)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")


def chart(results: dict[str, Any], path: Path) -> str | None:
    """Throughput per system and the latency distributions.  Returns why not, if matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed: no chart"
    matplotlib.use("Agg")  # no display here; must precede pyplot's import
    import matplotlib.pyplot as plt

    tp: dict[str, dict[str, Any]] = results["throughput"]
    keys = [k for k in SYSTEMS if k in tp and tp[k].get("status") != "n/a"]
    names = [label(k, tp[k]) for k in keys]
    values = [float(tp[k]["records_per_s"]) for k in keys]
    palette = {"raw": "#7f7f7f", "peer": "#ff7f0e", "spark": "#2ca02c"}
    colors = ["#1f77b4" if k.startswith("ingest") else palette.get(k, "#9467bd") for k in keys]

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    ax = axes[0]
    bars = ax.bar(range(len(keys)), values, color=colors)
    ax.set_xticks(range(len(keys)), names, rotation=15, ha="right")
    # A raw ceiling can be 10-100x the others at small sizes: a log axis keeps every bar readable.
    if values and min(values) > 0 and max(values) / min(values) > 20:
        ax.set_yscale("log")
    ax.set_ylabel("records / s")
    cfg = results["config"]
    ax.set_title(
        f"throughput: {cfg['records']:,} records x ~{cfg['avg_record_bytes']:.0f} B, {cfg['partitions']} partitions"
    )
    for bar, v in zip(bars, values, strict=True):
        ax.annotate(
            f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
        )

    lat = results.get("latency", {})
    for ax, samples, unit, title in (
        (axes[1], lat.get("publish_ms_samples", []), "ms", "publish transaction"),
        (
            axes[2],
            lat.get("steady", {}).get("produce_to_visible_samples_s", []),
            "s",
            f"produce-to-visible at {lat.get('steady', {}).get('rate_per_s', 0):.0f} records/s",
        ),
    ):
        if samples:
            ordered = sorted(samples)
            # Publish times have a long tail (a cold first publish, a busy PostgreSQL): log x.
            if unit == "ms" and ordered[0] > 0 and ordered[-1] / ordered[0] > 20:
                ax.set_xscale("log")
            n = len(ordered)
            ax.step(ordered, [(i + 1) / n for i in range(n)], where="post")
            stats = lat.get("publish_transaction_ms" if unit == "ms" else "produce_to_visible_s", {})
            for q, style in (("p50", "--"), ("p99", ":")):
                if stats.get(q) is not None:
                    ax.axvline(stats[q], linestyle=style, color="k", linewidth=0.8, label=f"{q} {stats[q]:.2f} {unit}")
            ax.legend(loc="lower right", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(unit)
        ax.set_ylabel("fraction <= x")
        ax.set_title(f"{title} (CDF, n={len(samples)})")
    fig.suptitle(
        f"python -m bench on {cfg['cpus']} CPUs (load average {cfg['load_at_start']:.2f} at start, "
        f"{cfg['load_at_end']:.2f} at end)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
