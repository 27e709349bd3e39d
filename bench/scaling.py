"""The --scaling phase: throughput by worker count over one topic and by partition count with
one worker, each run on a fresh topic holding the data set and checked exactly once."""

from __future__ import annotations

import argparse
from typing import Any

from bench.data import TOPIC, Produced, produce_dataset
from bench.ingest_runs import Context, SplitConfig, run_throughput, verify
from ingest_dev.kafka_clients import create_topic


def _scaling_row(result: dict[str, Any], check: dict[str, Any], **key: int) -> dict[str, Any]:
    return {
        **key,
        **{
            k: result[k]
            for k in ("records_per_s", "mb_per_s", "cpu_s_per_million", "wall_s", "peak_rss_mb", "segments")
        },
        "exactly_once": check["ok"],
    }


def _scaling_topic(ctx: Context, args: argparse.Namespace, partitions: int, name: str) -> Produced:
    """A fresh topic with the data set (the main topic has the latency phase's records too)."""
    create_topic(ctx.bootstrap, name, partitions)
    return produce_dataset(ctx.bootstrap, name, args.records, partitions, timeout=max(120.0, args.records / 5000))


def run_scaling(
    ctx: Context, args: argparse.Namespace, split: SplitConfig, checks: dict[str, dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Throughput by worker count (one topic) and by partition count (one worker). A worker
    alone gets ``local[2]`` and two build threads; several share the cores with ``local[1]``
    and one each, as in the main runs."""
    by_workers: list[dict[str, Any]] = []
    topic = f"{TOPIC}-workers"
    data = _scaling_topic(ctx, args, args.partitions, topic)
    for n in args.scaling_workers:
        master, threads = ("local[2]", 2) if n == 1 else ("local[1]", 1)
        result, fleet = run_throughput(ctx, topic, data, n, master, threads, split, f"scale_w{n}")
        fleet.stop()
        check = checks[f"scale_w{n}"] = verify(ctx, result["source"], topic, data.ends)
        by_workers.append(_scaling_row(result, check, workers=n))
    by_partitions: list[dict[str, Any]] = []
    for parts in args.scaling_partitions:
        topic = f"{TOPIC}-p{parts}"
        produced = _scaling_topic(ctx, args, parts, topic)
        result, fleet = run_throughput(ctx, topic, produced, 1, "local[2]", 2, split, f"scale_p{parts}")
        fleet.stop()
        check = checks[f"scale_p{parts}"] = verify(ctx, result["source"], topic, produced.ends)
        by_partitions.append(_scaling_row(result, check, partitions=parts))
    return {"workers": by_workers, "partitions": by_partitions}
