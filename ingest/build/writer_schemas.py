"""The writer schemas of a batch of framed splits (Avro, Protobuf), fetched from the schema
registry on the worker before the Spark job (which then needs no registry): every distinct
schema id among the batch's framed records, each fetched once per registry and kept for the
worker's life, so a schema fetched once keeps decoding through a registry outage.

An id the registry answers 404 for is unknown: its records are rejects (``unknown_schema_id``),
and the id is asked again in a later batch (it may be registered by then). Any other failure
(no answer, a 5xx, a timeout) is not bad input: :class:`RegistryUnavailable` fails the build,
which the pipeline retries; no record is rejected or skipped for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import structlog

from ingest.build.protobuf_decode import ProtoFiles
from ingest.build.protobuf_writers import schema_files
from ingest.build.split import SealedSplit
from ingest.errors import BuildError, first_line
from ingest.formats import RegistrySettings, registry_client, schema_id

log = structlog.get_logger(__name__)

_NOT_FOUND = 404
_T = TypeVar("_T")


class RegistryUnavailable(BuildError):
    """The schema registry did not answer (or answered with an error other than 404)."""


def batch_ids(splits: Sequence[SealedSplit]) -> list[int]:
    """The distinct schema ids of the splits' framed records, in order."""
    return sorted({sid for split in splits for r in split.records if (sid := schema_id(r.value())) is not None})


class WriterSchemas:
    """Writer schemas by (registry URL, id); safe from several build threads."""

    def __init__(self) -> None:
        # Per registry: the client of the plain form, and one for ?format=serialized (a
        # client caches by id whatever the format asked, so the two forms need two).
        self._clients: dict[RegistrySettings, tuple[Any, Any]] = {}
        self._schemas: dict[tuple[str, int], str] = {}
        self._protobuf: dict[tuple[str, int], ProtoFiles] = {}
        self._lock = threading.Lock()

    def for_batch(self, splits: Sequence[SealedSplit], registry: RegistrySettings) -> dict[int, str]:
        """The Avro writer schema of every id among the splits' framed records that the
        registry knows (ids it does not know are left out)."""
        return {sid: schema for sid in batch_ids(splits) if (schema := self.get(registry, sid)) is not None}

    def protobuf_for_batch(self, splits: Sequence[SealedSplit], registry: RegistrySettings) -> dict[int, ProtoFiles]:
        """The Protobuf writer files of every id among the splits' framed records that the
        registry knows (``()`` for one it holds in a form this worker cannot read)."""
        found = {sid: self.get_protobuf(registry, sid) for sid in batch_ids(splits)}
        return {sid: files for sid, files in found.items() if files is not None}

    def get(self, registry: RegistrySettings, sid: int) -> str | None:
        def fetch(plain: Any, _serialized: Any) -> str | None:
            schema = plain.get_schema(sid)
            if schema.schema_type not in (None, "AVRO"):
                # Not an Avro schema: its records cannot decode as Avro.
                log.warning("schema_id_not_avro", registry=registry.url, schema_id=sid, type=schema.schema_type)
                return None
            return str(schema.schema_str)

        return self._cached(self._schemas, registry, sid, fetch)

    def get_protobuf(self, registry: RegistrySettings, sid: int) -> ProtoFiles | None:
        return self._cached(
            self._protobuf, registry, sid, lambda plain, ser: schema_files(plain, ser, sid, registry.url)
        )

    def _cached(
        self,
        cache: dict[tuple[str, int], _T],
        registry: RegistrySettings,
        sid: int,
        fetch: Callable[[Any, Any], _T | None],
    ) -> _T | None:
        key = (registry.url, sid)
        with self._lock:
            cached = cache.get(key)
            clients = self._clients.get(registry)
            if clients is None:
                clients = self._clients[registry] = (registry_client(registry), registry_client(registry))
        if cached is not None:
            return cached
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            found = fetch(*clients)
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                log.warning("unknown_schema_id", registry=registry.url, schema_id=sid)
                return None
            raise RegistryUnavailable(f"schema registry {registry.url}, schema id {sid}: {first_line(exc)}") from exc
        except Exception as exc:  # transport errors (httpx) are not part of the client's API
            raise RegistryUnavailable(
                f"schema registry {registry.url} did not answer for schema id {sid}: {first_line(exc)}"
            ) from exc
        if found is not None:
            with self._lock:
                cache[key] = found
        return found
