"""Registering a build in the metastore before it writes anything (migrations/0008).

The registration names the build's directories and its splits; the publish of a split
moves it from building to published, and gc deletes only under registered directories of
builds none of whose splits is still building. So a file exists in the store only where a
registration says it may, and gc can never delete what may still be published.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from ingest.errors import SplitKilled
from ingest.splits.split import SealedSplit
from ingest_common.backoff import METASTORE_BACKOFF, Backoff
from ingest_common.model import BuildRegistration
from metastore.errors import MetastoreUnavailable

log = structlog.get_logger(__name__)


class RegistrationStore(Protocol):
    """The part of ``metastore.Metastore`` registration needs."""

    def register_build(self, worker: str, build: BuildRegistration) -> None: ...


class BuildRegistrar(Protocol):
    def register(self, build: BuildRegistration, splits: Sequence[SealedSplit]) -> None:
        """Return once the build is registered; raise SplitKilled if every split of it was
        killed first (nothing is written then)."""
        ...


class Registrar:
    """Safe to call from several build threads: calls to the store (one connection) are
    serialized. While the metastore is unreachable it retries with capped backoff, as the
    publisher does, until it succeeds or every split of the build is killed; registering
    again after a lost reply is harmless (the registration is idempotent)."""

    def __init__(
        self,
        store: RegistrationStore,
        worker_id: str,
        *,
        backoff: Backoff = METASTORE_BACKOFF,
        on_store_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._backoff = backoff
        self._on_store_error = on_store_error
        self._lock = threading.Lock()

    def register(self, build: BuildRegistration, splits: Sequence[SealedSplit]) -> None:
        for delay in self._backoff.delays():
            try:
                with self._lock:
                    self._store.register_build(self._worker_id, build)
                return
            except MetastoreUnavailable as exc:
                log.warning(
                    "register_retry",
                    build=str(build.build_id),
                    splits=len(splits),
                    error=str(exc),
                    retry_in_s=round(delay, 2),
                )
                if self._on_store_error is not None:
                    self._on_store_error(exc)
            if all(split.kill_switch.tripped for split in splits):
                raise SplitKilled(splits[0].kill_switch.reason or "killed")
            self._backoff.sleep(delay)
