"""The equal-freshness table and its ratios (pure: a results document in, text out)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Rows in this order; the ratio columns are the ingest worker's rate over each other system's.
ORDER = ("ingest", "raw", "quix", "spark")
LABELS = {
    "ingest": "ingest, 1 worker (exactly-once)",
    "raw": "raw baseline (no guarantees)",
    "quix": "Quix Streams (at-least-once)",
    "spark": "Spark Structured Streaming, processingTime (exactly-once)",
}
OTHERS = ("raw", "quix", "spark")


def _rate(row: dict[str, Any] | None) -> float | None:
    if not row or row.get("status") == "n/a":
        return None
    rate = row.get("rate")
    return float(rate) if rate else None


def ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """``ingest/raw``, ``ingest/quix``, ``ingest/spark``: the ingest worker's highest sustained rate
    over the other's (None where either has none)."""
    systems: dict[str, dict[str, Any]] = results["systems"]
    mine = _rate(systems.get("ingest"))
    out: dict[str, float | None] = {}
    for other in OTHERS:
        theirs = _rate(systems.get(other))
        out[f"ingest/{other}"] = mine / theirs if mine and theirs else None
    return out


def _num(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def _probes(row: dict[str, Any]) -> str:
    marks = {"passed": "ok", "failed": "x", "limited": "ok*"}
    return " ".join(f"{p['rate_asked']:,.0f}{marks.get(p['outcome'], '?')}" for p in row.get("probes", []))


def table(results: dict[str, Any]) -> str:
    cfg = results["config"]
    systems: dict[str, dict[str, Any]] = results["systems"]
    r = results.get("ratios") or ratios(results)
    head = ["system", "records/s", "p99 s", "CPU s/M", "/ raw", "/ quix", "/ spark", "probes"]
    rows: list[list[str]] = []
    notes: list[str] = []
    for key in ORDER:
        row = systems.get(key)
        if row is None:
            continue
        name = LABELS.get(key, key)
        if row.get("status") == "n/a" or not row.get("rate"):
            rows.append([name, "n/a", "", "", "", "", "", _probes(row)])
            notes.append(f"{name}: n/a, {row.get('reason', 'no probe held the bound')}")
            continue
        rate = ("≥ " if row.get("lower_bound") else "") + _num(row["rate"])
        cells = [_num(r.get(f"ingest/{o}"), 2) if key == "ingest" else "" for o in OTHERS]
        rows.append([name, rate, _num(row.get("p99_s"), 2), _num(row.get("cpu_s_per_million"), 1), *cells])
        rows[-1].append(_probes(row))
    widths = [max(len(head[i]), *(len(x[i]) for x in rows)) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(widths[i]) if i in (0, len(head) - 1) else c.rjust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    out = [
        f"equal freshness: the highest sustained rate with produce-to-visible p99 <= {cfg['bound_s']:g} s "
        f"(interval {cfg['interval_s']:g} s for every system; probes of {cfg['probe_s']:g} s, "
        f"ramp x{cfg['factor']:g} from {cfg['start_rate']:,.0f}/s, then bisection to {cfg['tolerance']:.0%})",
        line(head),
        line(["-" * w for w in widths]),
        *(line(x) for x in rows),
        "probes: rate asked and verdict in the order run (x failed; ok* the producer fell short of "
        "the rate: the answer is a lower bound)",
        *notes,
    ]
    return "\n".join(out)
