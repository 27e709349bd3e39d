"""The writer schemas of a batch of Avro splits, fetched from the schema registry on the worker
before the Spark job (which then needs no registry): every distinct schema id among the
batch's framed records, each fetched once per registry and kept for the worker's life, so a
schema fetched once keeps decoding through a registry outage.

An id the registry answers 404 for is unknown: its records are rejects (``unknown_schema_id``),
and the id is asked again in a later batch (it may be registered by then). Any other failure
(no answer, a 5xx, a timeout) is not bad input: :class:`RegistryUnavailable` fails the build,
which the pipeline retries; no record is rejected or skipped for it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import structlog

from ingest.build.split import SealedSplit
from ingest.errors import BuildError, first_line
from ingest.formats import RegistrySettings, registry_client, schema_id

log = structlog.get_logger(__name__)

_NOT_FOUND = 404


class RegistryUnavailable(BuildError):
    """The schema registry did not answer (or answered with an error other than 404)."""


class WriterSchemas:
    """Writer schemas by (registry URL, id); safe from several build threads."""

    def __init__(self) -> None:
        self._clients: dict[RegistrySettings, Any] = {}
        self._schemas: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def for_batch(
        self, splits: Sequence[SealedSplit], registry: RegistrySettings, keys: bool = False
    ) -> dict[int, str]:
        """The writer schema of every id among the splits' framed values (``keys``: keys) that
        the registry knows (ids it does not know are left out)."""
        ids = {
            sid
            for split in splits
            for r in split.records
            if (sid := schema_id(r.key() if keys else r.value())) is not None
        }
        return {sid: schema for sid in sorted(ids) if (schema := self.get(registry, sid)) is not None}

    def get(self, registry: RegistrySettings, sid: int) -> str | None:
        key = (registry.url, sid)
        with self._lock:
            cached = self._schemas.get(key)
            client = self._clients.get(registry)
            if client is None:
                client = self._clients[registry] = registry_client(registry)
        if cached is not None:
            return cached
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = client.get_schema(sid)
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                log.warning("unknown_schema_id", registry=registry.url, schema_id=sid)
                return None
            raise RegistryUnavailable(f"schema registry {registry.url}, schema id {sid}: {first_line(exc)}") from exc
        except Exception as exc:  # transport errors (httpx) are not part of the client's API
            raise RegistryUnavailable(
                f"schema registry {registry.url} did not answer for schema id {sid}: {first_line(exc)}"
            ) from exc
        if schema.schema_type not in (None, "AVRO"):
            # Not an Avro schema: its records cannot decode as Avro.
            log.warning("schema_id_not_avro", registry=registry.url, schema_id=sid, type=schema.schema_type)
            return None
        text = str(schema.schema_str)
        with self._lock:
            self._schemas[key] = text
        return text
