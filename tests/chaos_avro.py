"""The chaos run's Avro records (``python -m tests.chaos --format avro``): a local schema
registry started beside PostgreSQL and Kafka, and the records' values in the Confluent wire
format, written with three writer schema versions in turn over the production (each adds a
field with a default; the spec's reader schema, the JSON run's columns, resolves them all)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ingest_dev import avro_samples
from ingest_dev.registry import LocalSchemaRegistry

#: The writer schema versions, in the order they are produced.
AVRO_VERSIONS = (avro_samples.CLICK_V1, avro_samples.CLICK_V2, avro_samples.CLICK_V3)


@contextlib.contextmanager
def registry_beside(wanted: bool, work: Path) -> Iterator[Callable[[], str] | None]:
    """A schema registry whose start runs while the other servers start (no wall time): yields
    the call that waits for it and gives its URL; None when not ``wanted``."""
    if not wanted:
        yield None
        return
    registry = LocalSchemaRegistry(base_dir=work / "registry")
    try:
        with ThreadPoolExecutor(1) as pool:
            started = pool.submit(registry.start)
            yield lambda: started.result().url
    finally:
        registry.stop()


def version_of(i: int, records: int) -> int:
    """Which writer version record ``i`` is written with: the first third with the first, ..."""
    return min(len(AVRO_VERSIONS) - 1, i * len(AVRO_VERSIONS) // max(1, records))


def versioned(fields: dict[str, Any], i: int, version: int) -> dict[str, Any]:
    """Record ``i``'s fields as writer version ``version`` has them (the added fields are not
    in the reader schema: resolution skips them)."""
    extra: dict[str, Any] = {"region": f"r{i % 5}"} if version >= 1 else {}
    if version >= 2:
        extra["score"] = i
    return {**fields, **extra}


def avro_values(
    registry_url: str, topic: str, records: int, fields: Callable[[int], dict[str, Any]]
) -> Callable[[int], bytes]:
    """Record ``i``'s value in Avro, its versions registered under ``<topic>-value`` first."""
    writers = avro_samples.writers(registry_url, topic, AVRO_VERSIONS)

    def value(i: int) -> bytes:
        version = version_of(i, records)
        return writers[version](versioned(fields(i), i, version))

    return value
