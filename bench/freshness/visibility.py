"""Produce-to-visible per record: when a record became visible to readers minus its Kafka timestamp.

Every system of the freshness run makes rows visible in *units*: a published segment (ingest), a
committed micro-batch (Spark Structured Streaming's ``_spark_metadata`` entry), a complete file
(Quix Streams, the raw baseline). A unit has one moment of visibility and some Parquet files with
a ``_timestamp`` column (each record's Kafka timestamp, taken when the producer was handed it).
A probe's records are those whose timestamp lies in the probe's produce window, on a topic only
that system reads; each one's latency is its unit's moment minus its timestamp.

The p99 is the nearest-rank one over every record *produced*: a record not visible when the
probe's wait ended counts as infinitely late, so a system that kept 1 % of the records back
fails however fast the rest were.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_UNIT_TO_MS = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}


@dataclass(frozen=True)
class Unit:
    """Rows that became visible together: when, and the files holding them."""

    visible_at: float  # epoch seconds
    files: tuple[str, ...]


def timestamps_ms(column: pa.ChunkedArray | pa.Array) -> Any:
    """A ``_timestamp`` column as float milliseconds since the epoch (a numpy array): Spark and
    the workers write timestamps, the raw baseline timestamp[ms], Quix Streams int64 ms."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        factor = _UNIT_TO_MS[kind.unit]
        column = column.cast(pa.int64())
    elif pa.types.is_integer(kind):
        factor = 1.0
    else:
        raise TypeError(f"_timestamp of type {kind}: expected a timestamp or integer milliseconds")
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64) * factor


def read_timestamps_ms(path: str) -> Any:
    path = path.removeprefix("file://").removeprefix("file:")
    return timestamps_ms(pq.read_table(path, columns=["_timestamp"])["_timestamp"])


@dataclass
class Window:
    """One probe's records: those with a Kafka timestamp in ``[start_ms, end_ms]``, ``produced``
    of them; latencies collected as units are read."""

    start_ms: float
    end_ms: float
    produced: int
    chunks: list[Any]

    @classmethod
    def of(cls, started_at: float, ended_at: float, produced: int) -> Window:
        # A millisecond either side: Kafka timestamps are whole milliseconds.
        return cls(math.floor(started_at * 1000) - 1, math.ceil(ended_at * 1000) + 1, produced, [])

    def add(self, visible_at: float, ts_ms: Any) -> int:
        """The latencies of a unit's records that belong to this window; returns how many."""
        mine = ts_ms[(ts_ms >= self.start_ms) & (ts_ms <= self.end_ms)]
        if len(mine):
            self.chunks.append(visible_at - mine / 1000.0)
        return len(mine)

    @property
    def seen(self) -> int:
        return sum(len(c) for c in self.chunks)

    def latencies(self) -> Any:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0)


def nearest_rank(ordered: Sequence[float] | Any, q: float, n: int) -> float:
    """The nearest-rank ``q`` percentile of ``n`` values whose smallest are ``ordered`` (sorted);
    ranks past ``ordered`` are the values never seen: infinite."""
    if n <= 0:
        return math.nan
    rank = max(1, math.ceil(q / 100 * n))
    return float(ordered[rank - 1]) if rank <= len(ordered) else math.inf


def summary(window: Window, bound_s: float) -> dict[str, Any]:
    """The probe's verdict: every produced record visible (an at-least-once system may show some
    twice: more seen than produced passes) and the p99 within ``bound_s``."""
    ordered = np.sort(window.latencies())
    n = max(window.produced, len(ordered))
    p99 = nearest_rank(ordered, 99, n)
    complete = window.produced > 0 and len(ordered) >= window.produced
    return {
        "produced": window.produced,
        "seen": len(ordered),
        "missing": max(0, window.produced - len(ordered)),
        # None: beyond what was seen (records never visible), so not a number of seconds.
        "p50_s": _finite(nearest_rank(ordered, 50, n)),
        "p99_s": _finite(p99),
        "max_s": float(ordered[-1]) if complete else None,
        "passed": complete and p99 <= bound_s,
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
