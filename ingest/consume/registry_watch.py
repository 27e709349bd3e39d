"""Partitions waiting for the schema registry (ingest.builder.registry_wait): a split whose
writer schema the registry did not serve yet waits in the build queue, and no split of its
partition is cut until it is built, so nothing more of it is read meanwhile; nothing is
rejected, skipped or rewound, and the worker stays healthy (a registry outage is no reason to
restart it). This says why: ``/readyz`` answers 503 with :attr:`RegistryWatch.reason`, the
heartbeat carries the partitions and the error (``ingest status``), an error report marks the
wait's start, and the gauges ``ingest_schema_registry_up`` and
``ingest_schema_registry_waiting_partitions`` follow it. The partitions resume by themselves
once their splits build.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from ingest.builder.registry_wait import RegistryWait
from ingest.consume.context import LoopContext
from ingest.consume.heartbeats import WorkerRegistry
from ingest_common.model import TopicPartition

log = structlog.get_logger(__name__)

# The error report's kind (``ingest status`` lists recent errors by it).
ERROR_KIND = "SCHEMA_REGISTRY_UNAVAILABLE"


class RegistryWaiting(Protocol):
    @property
    def registry_wait(self) -> RegistryWait | None: ...


class RegistryWatch:
    def __init__(self, ctx: LoopContext, builds: RegistryWaiting, registry: WorkerRegistry) -> None:
        self._ctx = ctx
        self._builds = builds
        self._registry = registry
        self._wait: RegistryWait | None = None
        # Read by the /readyz thread: a reference store is atomic.
        self.reason: str | None = None

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        """The partitions to cut nothing from (those still owned are the loop's concern)."""
        return frozenset(self._wait.partitions) if self._wait is not None else frozenset()

    def reported(self) -> list[str]:
        """The waiting partitions as the heartbeat reports them (``topic[partition]``, in order)."""
        return [str(tp) for tp in self._wait.partitions] if self._wait is not None else []

    @property
    def error(self) -> str | None:
        return self._wait.error if self._wait is not None else None

    def check(self) -> None:
        """Read the build queue's wait; log and report its start and end, set the gauges (each step)."""
        wait = self._builds.registry_wait
        source, fields = self._ctx.source, {"source": self._ctx.source, "worker": self._ctx.worker_id}
        if wait is not None and self._wait is None:
            partitions = ", ".join(str(tp) for tp in wait.partitions)
            log.warning("schema_registry_wait_started", partitions=partitions, error=wait.error, **fields)
            self._registry.error(ERROR_KIND, f"{partitions} wait for the schema registry: {wait.error}")
        elif wait is None and self._wait is not None:
            log.info("schema_registry_wait_ended", waited_s=round(self._wait.waited_s, 1), **fields)
        # Set for sources with a registry, and for the end of any wait (a spec changed meanwhile).
        gauges = wait is not None or self._wait is not None or self._ctx.specs.spec.registry is not None
        self._wait = wait
        self.reason = None if wait is None else _reason(wait)
        metrics = self._ctx.metrics
        if gauges:
            metrics.schema_registry_up.labels(source).set(0 if wait is not None else 1)
            metrics.schema_registry_waiting_partitions.labels(source).set(len(wait.partitions) if wait else 0)


def _reason(wait: RegistryWait) -> str:
    partitions = ", ".join(str(tp) for tp in wait.partitions)
    return (
        f"waiting {wait.waited_s:.0f}s for the schema registry ({wait.retries} retries): {partitions} paused,"
        f" nothing rejected or skipped; they resume once it answers. Last error: {wait.error}"
    )
