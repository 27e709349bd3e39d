"""The writer schemas a build decodes with (Avro, Protobuf), fetched from the schema registry
on the worker: Spark needs no registry. Each schema the registry served is kept for the
worker's life (schemas are immutable once registered), so a schema fetched once keeps
decoding through a registry outage. Nothing else is kept: a failure is never cached.

Which ids a batch holds is not known before Spark reads it (the worker never sees a record):
a build decodes with every writer this worker knows, its job names the ids it met that none
of them has (ingest.builder.plan), and those are fetched here (:meth:`WriterSchemas.fetch`):
- served: kept; the build runs again with it;
- 404 (the id, or a Protobuf import it references): not known *yet*. A registry follower may
  not have replicated a fresh id, or a producer registered it a moment ago: the splits that
  hold it wait, as for an outage, until the id appears or ``wait_s`` has passed since its
  first 404; only then are its records rejects (``unknown_schema_id``). A registry that
  answered 404 for every id it was asked and never served one is misconfigured (a base URL
  without its API path): :class:`RegistryMisconfigured` stops the worker with one line
  instead of rejecting a whole stream;
- no answer, a 5xx, a timeout (:class:`RegistryUnavailable`): the splits that hold the id wait,
  retried by the build queue for as long as the registry stays down; nothing is rejected.

Each Avro writer is checked against the reader schema before the job (Avro's resolution
rules, ingest.formats.avro_resolution): a writer the reader cannot resolve is never given to from_avro,
its records are rejects (``unresolvable_writer_schema``); a served id of another type than the
format's is kept as such (its records are rejects too, never waited for).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from ingest.errors import BuildError, ConfigError, WorkerFailed, first_line
from ingest.formats.avro import decode_schemas
from ingest.formats.avro_resolution import resolution_problem
from ingest.formats.protobuf import ProtoFiles
from ingest.formats.protobuf_schemas import ReferenceNotFound, schema_files
from ingest.formats.registry import RegistrySettings, registry_client
from ingest.spec.model import SourceSpec
from ingest_common.backoff import SYSTEM_CLOCK, Clock

log = structlog.get_logger(__name__)

_NOT_FOUND = 404
#: How long an id the registry answers 404 for is waited for before its records are rejects.
SCHEMA_ID_WAIT_S = 60.0
# A served id whose schema is of another type than the format's: its records are rejects.
NOT_OF_FORMAT = ""


class RegistryUnavailable(BuildError):
    """The schema registry did not answer (or answered with an error other than 404)."""


class SchemaIdsPending(RegistryUnavailable):
    """Ids the registry answered 404 for, within their wait, or served only once the job that
    met them had run without them: the splits holding them wait, and are built again."""


class RegistryMisconfigured(WorkerFailed):
    """Every id asked answered 404 and none was ever served: the URL is not the registry's."""

    exit_code = ConfigError.exit_code


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one :meth:`WriterSchemas.fetch` learned."""

    # Ids served now (kept from now on).
    learned: frozenset[int] = frozenset()
    # Ids answered 404 whose wait has not passed, and those whose wait has.
    pending: frozenset[int] = frozenset()
    expired: frozenset[int] = frozenset()
    # The registry did not answer for these (its error in ``failure``).
    unanswered: frozenset[int] = frozenset()
    failure: RegistryUnavailable | None = None


@dataclass(slots=True)
class _Registry:
    clients: tuple[Any, Any]
    avro: dict[int, str] = field(default_factory=dict)
    protobuf: dict[int, ProtoFiles] = field(default_factory=dict)
    # First 404 of each id not served yet (forgotten once served).
    first_404: dict[int, float] = field(default_factory=dict)
    served: bool = False


class WriterSchemas:
    """Writer schemas by (registry, id); safe from several build threads."""

    def __init__(
        self,
        client: Callable[[RegistrySettings], Any] = registry_client,
        *,
        wait_s: float = SCHEMA_ID_WAIT_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        # Makes a registry's client (confluent-kafka's SchemaRegistryClient; tests pass a fake).
        # Per registry: the client of the plain form, and one for ?format=serialized (a client
        # caches by id whatever the format asked, so the two forms need two).
        self._client = client
        self._wait_s = wait_s
        self._clock = clock
        self._registries: dict[RegistrySettings, _Registry] = {}
        self._lock = threading.Lock()

    def _registry(self, registry: RegistrySettings) -> _Registry:
        with self._lock:
            return self._registry_unlocked(registry)

    def avro(self, registry: RegistrySettings) -> dict[int, str]:
        """Every Avro writer served so far (an id of another type maps to ``NOT_OF_FORMAT``)."""
        with self._lock:
            return dict(self._registry_unlocked(registry).avro)

    def protobuf(self, registry: RegistrySettings) -> dict[int, ProtoFiles]:
        """Every Protobuf writer served so far (``()``: one of another type, or unreadable here)."""
        with self._lock:
            return dict(self._registry_unlocked(registry).protobuf)

    def _registry_unlocked(self, registry: RegistrySettings) -> _Registry:
        found = self._registries.get(registry)
        if found is None:
            found = self._registries[registry] = _Registry((self._client(registry), self._client(registry)))
        return found

    def fetch(self, registry: RegistrySettings, ids: Iterable[int], *, protobuf: bool = False) -> Fetched:
        """Ask the registry for the ids not served yet. Once it failed to answer for one, the
        rest are not asked in this call (each could take the client's timeout)."""
        state = self._registry(registry)
        learned: set[int] = set()
        pending: set[int] = set()
        expired: set[int] = set()
        unanswered: set[int] = set()
        failure: RegistryUnavailable | None = None
        for sid in sorted(set(ids)):
            with self._lock:
                if sid in (state.protobuf if protobuf else state.avro):
                    continue
            if failure is not None:
                unanswered.add(sid)
                continue
            try:
                schema = self._ask(registry, state, sid, protobuf)
            except RegistryUnavailable as exc:
                failure = exc
                unanswered.add(sid)
                continue
            now = self._clock.monotonic()
            with self._lock:
                if schema is None:
                    first = state.first_404.setdefault(sid, now)
                    (expired if now - first >= self._wait_s else pending).add(sid)
                    continue
                if protobuf:
                    state.protobuf[sid] = schema
                else:
                    state.avro[sid] = schema
                state.first_404.pop(sid, None)
                state.served = True
            learned.add(sid)
        if pending or expired:
            log.warning(
                "schema_ids_not_found",
                registry=registry.url,
                pending=sorted(pending),
                expired=sorted(expired),
                wait_s=self._wait_s,
            )
        if expired and not self.served_any(registry):
            raise RegistryMisconfigured(
                f"schema registry {registry.url} answered 404 for every schema id it was asked "
                f"({', '.join(map(str, sorted(expired | pending)))}, for {self._wait_s:g} s) and never served one: "
                "is [registry] url the registry's Confluent-compatible base URL (Apicurio's ends in /apis/ccompat/v7)?"
            )
        return Fetched(frozenset(learned), frozenset(pending), frozenset(expired), frozenset(unanswered), failure)

    def served_any(self, registry: RegistrySettings) -> bool:
        with self._lock:
            return self._registry_unlocked(registry).served

    def prefetch(self, registry: RegistrySettings, subjects: Iterable[str], *, protobuf: bool = False) -> int:
        """Every version of ``subjects`` (best effort, at the worker's start): the common ids are
        known before the first build, which then runs once. Returns how many ids it learned."""
        state = self._registry(registry)
        plain = state.clients[0]
        ids: set[int] = set()
        for subject in subjects:
            try:
                for version in plain.get_versions(subject):
                    ids.add(int(plain.get_version(subject, version).schema_id))
            except Exception as exc:  # a subject that does not exist yet, a registry down: the builds ask later
                log.info("schema_prefetch_skipped", registry=registry.url, subject=subject, error=first_line(exc))
        if not ids:
            return 0
        try:
            return len(self.fetch(registry, ids, protobuf=protobuf).learned)
        except RegistryMisconfigured:
            return 0

    def _ask(self, registry: RegistrySettings, state: _Registry, sid: int, protobuf: bool) -> Any:
        """The id's schema (``NOT_OF_FORMAT`` / ``()`` for one of another type), or None on a 404."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        plain, serialized = state.clients
        try:
            if protobuf:
                files = schema_files(plain, serialized, sid, registry.url)
                return () if files is None else files
            schema = plain.get_schema(sid)
            if schema.schema_type not in (None, "AVRO"):
                log.warning("schema_id_not_avro", registry=registry.url, schema_id=sid, type=schema.schema_type)
                return NOT_OF_FORMAT
            return str(schema.schema_str)
        except ReferenceNotFound:
            return None
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                return None
            raise RegistryUnavailable(f"schema registry {registry.url}, schema id {sid}: {first_line(exc)}") from exc
        except Exception as exc:  # transport errors (httpx) are not part of the client's API
            raise RegistryUnavailable(
                f"schema registry {registry.url} did not answer for schema id {sid}: {first_line(exc)}"
            ) from exc


def resolvable(spec: SourceSpec, writers: Mapping[int, str]) -> tuple[dict[int, str], frozenset[int]]:
    """The writers the spec's reader schema resolves, and the ids of those it cannot (ids of
    another type than Avro among them)."""
    ok: dict[int, str] = {}
    refused: set[int] = set()
    for sid, writer in writers.items():
        if writer != NOT_OF_FORMAT and _problem(spec.name, spec.reader_schema, sid, writer) is None:
            ok[sid] = writer
        else:
            refused.add(sid)
    return ok, frozenset(refused)


@functools.lru_cache(maxsize=1024)
def _problem(source: str, reader: str, sid: int, writer: str) -> str | None:
    """Checked (and logged) once per (reader, writer): schemas are immutable once registered."""
    problem = resolution_problem(*decode_schemas(reader, writer))
    if problem is not None:
        log.warning("unresolvable_writer_schema", source=source, schema_id=sid, problem=problem)
    return problem
