"""The writer schemas of a batch of framed splits (Avro, Protobuf), fetched from the schema
registry on the worker before the Spark job (which then needs no registry): every distinct
schema id among the batch's framed records, each fetched once per registry and kept for the
worker's life, so a schema fetched once keeps decoding through a registry outage.

Each writer schema is checked against the reader schema before the job (Avro's resolution
rules, ingest.avro_resolution): a writer the reader cannot resolve is never given to from_avro,
and its records are rejects (``unresolvable_writer_schema``); the check runs once per (reader,
writer) for the worker's life.

An id the registry answers 404 for is unknown: its records are rejects (``unknown_schema_id``),
and the id is asked again in a later batch (it may be registered by then). Any other failure
(no answer, a 5xx, a timeout) is not bad input: the splits that hold an id not fetched yet
are not built (:class:`RegistryUnavailable`, their result), and wait, retried by the pipeline
(ingest.publish.pipeline) for as long as the registry stays down; no record is rejected or
skipped for it. The batch's other splits, whose ids are all cached, build as usual.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from ingest.avro_resolution import resolution_problem
from ingest.builder.protobuf_decode import ProtoFiles
from ingest.builder.protobuf_writers import schema_files
from ingest.errors import BuildError, first_line
from ingest.formats import HEADER_BYTES, RegistrySettings, reader_for_writer, registry_client, schema_id
from ingest.spec import SourceSpec
from ingest.splits.split import SealedSplit

log = structlog.get_logger(__name__)

_NOT_FOUND = 404
_T = TypeVar("_T")


class RegistryUnavailable(BuildError):
    """The schema registry did not answer (or answered with an error other than 404)."""


@dataclass(frozen=True, slots=True)
class BatchSchemas:
    """What a batch of splits gets from the registry: the writer schema of every id the
    splits that can build hold (ids the registry does not know are left out), and the splits
    that cannot build yet, each with the error of the registry that did not answer."""

    schemas: dict[int, str]
    waiting: dict[uuid.UUID, RegistryUnavailable]
    # The same as ``schemas`` for the keys' ids (key_format avro), and for values of format
    # protobuf (their files; ``()`` for one the registry holds in a form this worker cannot read).
    key_schemas: dict[int, str] = field(default_factory=dict)
    protobuf: dict[int, ProtoFiles] = field(default_factory=dict)


class WriterSchemas:
    """Writer schemas by (registry URL, id); safe from several build threads."""

    def __init__(self, client: Callable[[RegistrySettings], Any] = registry_client) -> None:
        # Makes a registry's client (confluent-kafka's SchemaRegistryClient; tests pass a fake).
        # Per registry: the client of the plain form, and one for ?format=serialized (a
        # client caches by id whatever the format asked, so the two forms need two).
        self._client = client
        self._clients: dict[RegistrySettings, tuple[Any, Any]] = {}
        self._schemas: dict[tuple[str, int], str] = {}
        self._protobuf: dict[tuple[str, int], ProtoFiles] = {}
        self._lock = threading.Lock()

    def for_batch(
        self,
        splits: Sequence[SealedSplit],
        registry: RegistrySettings,
        *,
        values: bool = True,
        keys: bool = False,
        protobuf: bool = False,
    ) -> BatchSchemas:
        """The writer schemas of the splits' framed values (``protobuf``: as Protobuf files)
        and (``keys``) keys (Avro). Once the registry failed to answer for one id, ids not
        cached are not asked for again in this batch (each could take the client's timeout):
        the splits holding any of them wait."""
        value_ids = {split.id: _ids(split, keys=False) if values else set() for split in splits}
        key_ids = {split.id: _ids(split, keys=True) if keys else set() for split in splits}
        wanted = sorted(
            {(sid, protobuf) for ids in value_ids.values() for sid in ids}
            | {(sid, False) for ids in key_ids.values() for sid in ids}
        )
        found: dict[tuple[int, bool], Any] = {}
        missing: set[int] = set()
        failure: RegistryUnavailable | None = None
        for sid, as_protobuf in wanted:
            if failure is not None and not self.cached(registry, sid, protobuf=as_protobuf):
                missing.add(sid)
                continue
            try:
                schema = self.get_protobuf(registry, sid) if as_protobuf else self.get(registry, sid)
            except RegistryUnavailable as exc:
                failure = exc
                missing.add(sid)
                continue
            if schema is not None:
                found[(sid, as_protobuf)] = schema
        needs = {split.id: value_ids[split.id] | key_ids[split.id] for split in splits}
        waiting = {} if failure is None else {split.id: failure for split in splits if needs[split.id] & missing}

        def building(ids: dict[uuid.UUID, set[int]], as_protobuf: bool) -> dict[int, Any]:
            held = set().union(*(i for split_id, i in ids.items() if split_id not in waiting))
            return {sid: schema for (sid, pb), schema in found.items() if pb is as_protobuf and sid in held}

        return BatchSchemas(
            {} if protobuf else building(value_ids, False),
            waiting,
            building(key_ids, False),
            building(value_ids, True) if protobuf else {},
        )

    def cached(self, registry: RegistrySettings, sid: int, *, protobuf: bool = False) -> bool:
        with self._lock:
            return (registry.url, sid) in (self._protobuf if protobuf else self._schemas)

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
                clients = self._clients[registry] = (self._client(registry), self._client(registry))
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


def _ids(split: SealedSplit, *, keys: bool) -> set[int]:
    """The schema ids the split's framed values (or keys) name: from their distinct headers."""
    if not split.chunks:
        return set()
    column = pa.chunked_array([chunk.keys if keys else chunk.values for chunk in split.chunks], pa.binary())
    headers = pc.unique(pc.binary_slice(column, 0, HEADER_BYTES)).to_pylist()
    return {sid for header in headers if (sid := schema_id(header)) is not None}


def resolvable(spec: SourceSpec, writers: Mapping[int, str]) -> tuple[dict[int, str], frozenset[int]]:
    """The writers the spec's reader schema resolves, and the ids of those it cannot."""
    ok: dict[int, str] = {}
    refused: set[int] = set()
    for sid, writer in writers.items():
        if _problem(spec.name, spec.reader_schema, sid, writer) is None:
            ok[sid] = writer
        else:
            refused.add(sid)
    return ok, frozenset(refused)


@functools.lru_cache(maxsize=1024)
def _problem(source: str, reader: str, sid: int, writer: str) -> str | None:
    """Checked (and logged) once per (reader, writer): schemas are immutable once registered."""
    problem = resolution_problem(writer, reader_for_writer(reader, writer))
    if problem is not None:
        log.warning("unresolvable_writer_schema", source=source, schema_id=sid, problem=problem)
    return problem
