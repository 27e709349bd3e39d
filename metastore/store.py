"""The metastore: offsets, serials and published segments in PostgreSQL.

One ``Metastore`` owns one connection and is used by one thread at a time; the worker
gives its polling thread and its publisher thread one each. A broken connection is
dropped and re-opened on the next call.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, cast

import psycopg
from psycopg.types.json import Jsonb

from ingest_common.errors import ConfigError
from ingest_common.model import (
    BuildRegistration,
    DesiredState,
    PartitionClaim,
    PartitionReset,
    ResetResult,
    SegmentToPublish,
    SourceControl,
    StartFrom,
    TopicPartition,
)
from ingest_common.redact import redact
from ingest_common.store_uri import canonical_store_uri, overlap
from metastore.connection import connect, wrap_exceptions
from metastore.errors import (
    CommitOutcomeUnknown,
    GroupTaken,
    InvalidReset,
    PublishConflict,
    SourceNotFound,
    SourceTerminated,
    StoreOverlap,
)
from metastore.queries import query

Row = dict[str, Any]


class Metastore:
    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[Row] | None = None

    # -- connection ---------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Row]:
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._conn = None
        if self._conn is None:
            self._conn = connect(self.url)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Metastore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fetch(self, query_name: str, **params: Any) -> list[Row]:
        with wrap_exceptions(self.url):
            return self._connection().execute(query(query_name), params).fetchall()

    def _fetch_none(self, query_name: str, **params: Any) -> None:
        with wrap_exceptions(self.url):
            self._connection().execute(query(query_name), params)

    def ping(self) -> None:
        with wrap_exceptions(self.url):
            self._connection().execute("SELECT 1")

    # -- sources ------------------------------------------------------------------

    def apply_source(
        self, name: str, spec: dict[str, Any], spec_text: str, reactivate: bool = False
    ) -> tuple[int, bool]:
        """Store a new version of the spec unless it equals the latest. Returns (version, changed).

        A terminated source refuses (SourceTerminated) unless ``reactivate``: then it is set
        running again (its history, segments and offsets are kept)."""
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                # Checks across sources see every other source's applies, not a snapshot.
                conn.execute(query("lock_applies"))
                if isinstance(spec.get("segment_store"), str):
                    _check_store_overlap(conn, name, spec["segment_store"])
                _check_group_unique(conn, name, str(spec.get("consumer_group") or ""))
                current = conn.execute(query("lock_source"), {"name": name}).fetchone()
                if current is not None:
                    if current["desired_state"] == DesiredState.TERMINATED:
                        if not reactivate:
                            raise SourceTerminated(name)
                        conn.execute(query("reactivate_source"), {"name": name})
                    latest = conn.execute(query("latest_spec"), {"name": name}).fetchone()
                    if latest is not None and latest["spec"] == json.loads(json.dumps(spec)):
                        return int(latest["version"]), False
                row = conn.execute(query("upsert_source"), {"name": name}).fetchone()
                assert row is not None
                version = int(row["version"])
                conn.execute(
                    query("insert_source_version"),
                    {"name": name, "version": version, "spec": Jsonb(spec), "spec_text": spec_text},
                )
                return version, True

    def latest_spec(self, name: str) -> tuple[int, dict[str, Any]]:
        rows = self._fetch("latest_spec", name=name)
        if not rows:
            raise SourceNotFound(name)
        return int(rows[0]["version"]), cast(dict[str, Any], rows[0]["spec"])

    def list_sources(self) -> list[Row]:
        return self._fetch("list_sources")

    def spec_versions(self, name: str) -> list[Row]:
        """Every applied version of a source's spec, oldest first."""
        rows = self._fetch("list_versions", name=name)
        if not rows:
            raise SourceNotFound(name)
        return rows

    # -- assignment -----------------------------------------------------------------

    def register_partitions(
        self, source: str, topic: str, partitions: Iterable[int], initial_position: StartFrom
    ) -> None:
        with wrap_exceptions(self.url):
            self._connection().execute(
                query("register_partitions"),
                {
                    "source": source,
                    "topic": topic,
                    "partitions": sorted(partitions),
                    "initial_position": initial_position,
                },
            )

    def claim_partitions(
        self, source: str, worker: str, tps: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionClaim]:
        """In one transaction: bump the serial of each partition, record the owner, read
        the stored offset. A partition without a row is created (starting from earliest)."""
        if not tps:
            return {}
        ordered = sorted(set(tps))
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                rows = conn.execute(
                    query("claim_partitions"),
                    {
                        "source": source,
                        "worker": worker,
                        "topics": [tp.topic for tp in ordered],
                        "partitions": [tp.partition for tp in ordered],
                    },
                ).fetchall()
        claims = {}
        for row in rows:
            tp = TopicPartition(row["topic"], row["partition"])
            claims[tp] = PartitionClaim(tp, int(row["serial"]), row["next_offset"], row["initial_position"])
        return claims

    def release_partition(self, source: str, worker: str, claim: PartitionClaim) -> None:
        """Clear the owner if this worker's claim is still the current one (status only)."""
        with wrap_exceptions(self.url):
            self._connection().execute(
                query("release_partition"),
                {
                    "source": source,
                    "worker": worker,
                    "topic": claim.tp.topic,
                    "partition": claim.tp.partition,
                    "serial": claim.serial,
                },
            )

    def reclaim_partitions(
        self, source: str, worker: str, held: Sequence[tuple[TopicPartition, int]]
    ) -> dict[TopicPartition, PartitionClaim]:
        """For partitions this worker holds with the given serials: those whose stored serial
        moved while this worker is still the recorded owner were reset. Claim them again
        (serial bumped once more) and return the new claims with the offsets the reset stored.
        Partitions another worker claimed (owner changed) are not touched: they are fenced."""
        if not held:
            return {}
        ordered = sorted(held, key=lambda h: h[0])
        params = {
            "source": source,
            "worker": worker,
            "topics": [tp.topic for tp, _ in ordered],
            "partitions": [tp.partition for tp, _ in ordered],
            "serials": [serial for _, serial in ordered],
        }
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                conn.execute(query("lock_partitions"), params)
                rows = conn.execute(query("reclaim_partitions"), params).fetchall()
        return {
            TopicPartition(r["topic"], r["partition"]): PartitionClaim(
                TopicPartition(r["topic"], r["partition"]), int(r["serial"]), r["next_offset"], r["initial_position"]
            )
            for r in rows
        }

    # -- publish --------------------------------------------------------------------

    def publish(self, item: SegmentToPublish) -> int:
        """The serial-guarded publish, as one statement (one transaction, one round trip):
        locks the partition rows in a fixed order, checks for each that the serial is the
        one seen at assign and that the range starts at the stored next offset, then inserts
        the segment and advances the offsets (``ingest_publish_segment``, migration 0007).

        Raises PublishConflict (nothing of the segment written, conflict recorded) or
        CommitOutcomeUnknown (the connection broke before the reply came back).
        """
        ranges = sorted(item.ranges, key=lambda r: r.range.tp)
        seg = item.segment
        params = {
            "source": item.source,
            "split_id": seg.split_id,
            "spec_version": item.spec_version,
            "worker": item.worker_id,
            "location": seg.location,
            "files": list(seg.files),
            "row_count": seg.row_count,
            "size_bytes": seg.size_bytes,
            "min_event_time": seg.min_event_time,
            "max_event_time": seg.max_event_time,
            "rejects_location": seg.rejects_location,
            "rejects_files": list(seg.rejects_files),
            "rejects_count": seg.rejects_count,
            "skipped_count": seg.skipped_count,
            "topics": [r.range.tp.topic for r in ranges],
            "partitions": [r.range.tp.partition for r in ranges],
            "serials": [r.serial for r in ranges],
            "starts": [r.range.start for r in ranges],
            "ends": [r.range.end for r in ranges],
        }
        with wrap_exceptions(self.url):
            conn = self._connection()
            try:
                row = conn.execute(query("publish_segment"), params).fetchone()
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # An error the server replied with ended the statement, and with it the
                # transaction, without a commit. No reply: it may have committed.
                if conn.closed or conn.broken:
                    self._conn = None
                    raise CommitOutcomeUnknown(f"connection lost while publishing split {seg.split_id}") from exc
                raise
        assert row is not None
        if row["segment_id"] is None:
            raise _conflict(row)
        return int(row["segment_id"])

    # -- offset gaps ------------------------------------------------------------------

    def record_gap(self, source: str, worker: str, tp: TopicPartition, from_offset: int, to_offset: int) -> None:
        """The partition stopped at ``from_offset``: ``[from_offset, to_offset)`` is no longer in the log."""
        self._fetch(
            "record_gap",
            source=source,
            worker=worker,
            topic=tp.topic,
            partition=tp.partition,
            from_offset=from_offset,
            to_offset=to_offset,
        )

    def skip_gap(
        self, source: str, worker: str, tp: TopicPartition, serial: int, from_offset: int, to_offset: int
    ) -> int:
        """Move ``next_offset`` from ``from_offset`` to ``to_offset`` and write the gap to the
        ledger, in one transaction guarded like a publish: the row is locked, the serial must
        be the caller's and ``next_offset`` must still be ``from_offset`` (or unset).

        Returns the gap's id; raises PublishConflict (rolled back) when the check fails."""
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                failed = conn.execute(
                    query("lock_ranges"),
                    {
                        "source": source,
                        "topics": [tp.topic],
                        "partitions": [tp.partition],
                        "serials": [serial],
                        "starts": [from_offset],
                    },
                ).fetchall()
                if failed:
                    raise _conflict(failed[0])
                params = {
                    "source": source,
                    "worker": worker,
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "from_offset": from_offset,
                    "to_offset": to_offset,
                }
                row = conn.execute(query("insert_skipped_gap"), params).fetchone()
                assert row is not None
                conn.execute(query("skip_offsets"), params)
                return int(row["id"])

    def gaps(self, source: str) -> list[Row]:
        return self._fetch("list_gaps", source=source)

    def acknowledge_gaps(self, source: str, by: str, ids: Sequence[int] | None = None) -> list[int]:
        """Acknowledge the given gaps (None: every unacknowledged one); returns the ids changed."""
        rows = self._fetch("ack_gaps", source=source, by=by, ids=None if ids is None else list(ids))
        return [int(r["id"]) for r in rows]

    def partition_state(self, source: str, tp: TopicPartition) -> tuple[int, int | None] | None:
        """(serial, next_offset) of one partition, or None if it has no row."""
        rows = self._fetch("partition_state", source=source, topic=tp.topic, partition=tp.partition)
        return (int(rows[0]["serial"]), rows[0]["next_offset"]) if rows else None

    def segment_for_split(self, split_id: uuid.UUID) -> int | None:
        rows = self._fetch("segment_for_split", split_id=split_id)
        return int(rows[0]["id"]) if rows else None

    # -- controls ---------------------------------------------------------------------

    def set_control(self, source: str, state: DesiredState, stay: bool = False) -> None:
        if not self._fetch("set_control", name=source, state=state, stay=stay):
            current = self.control(source)  # SourceNotFound for an unknown source
            raise SourceTerminated(source, current.desired_state)

    def mark_terminated(self, source: str) -> bool:
        """terminating -> terminated (after the drain). False if the source is not terminating."""
        return bool(self._fetch("mark_terminated", name=source))

    def control(self, source: str) -> SourceControl:
        rows = self._fetch("get_control", name=source)
        if not rows:
            raise SourceNotFound(source)
        row = rows[0]
        return SourceControl(
            DesiredState(row["desired_state"]),
            bool(row["drain_stay"]),
            int(row["reset_generation"]),
            int(row["version"]),
        )

    # -- resets -------------------------------------------------------------------------

    def reset_offsets(
        self,
        source: str,
        targets: dict[TopicPartition, int],
        *,
        actor: str,
        reason: str,
        target: str,
        confirmed: bool,
        earliest: dict[TopicPartition, int] | None = None,
    ) -> ResetResult:
        """Set stored offsets, in one transaction that also bumps each changed partition's
        serial (so every publish in flight for it is refused) and the source's reset
        generation (so workers re-claim and re-seek), and records the audit rows.

        The plan is computed from the rows locked in that same transaction. When it skips or
        replays records and ``confirmed`` is false, nothing is written and the plan is
        returned with ``reset_id`` None. ``earliest``: Kafka's low watermarks where known
        (what a partition that never published would start from).
        """
        bad = sorted(str(tp) + f"={offset}" for tp, offset in targets.items() if offset < 0)
        if bad:
            raise InvalidReset(f"offsets must be >= 0: {', '.join(bad)}")
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                if conn.execute(query("lock_source"), {"name": source}).fetchone() is None:
                    raise SourceNotFound(source)
                rows = {
                    TopicPartition(r["topic"], r["partition"]): r
                    for r in conn.execute(query("lock_source_partitions"), {"source": source}).fetchall()
                }
                unknown = sorted(tp for tp in targets if tp not in rows)
                if unknown:
                    known = ", ".join(str(tp) for tp in sorted(rows)) or "none yet: start a worker first"
                    raise InvalidReset(
                        f"source {source!r} has no partition {', '.join(map(str, unknown))} (known: {known})"
                    )
                plan = tuple(
                    _plan_partition(tp, rows[tp], offset, (earliest or {}).get(tp))
                    for tp, offset in sorted(targets.items())
                    if rows[tp]["next_offset"] != offset
                )
                result = ResetResult(plan)
                if not plan or (result.changes_data and not confirmed):
                    return result
                head = conn.execute(
                    query("insert_reset"), {"source": source, "actor": actor, "reason": reason, "target": target}
                ).fetchone()
                assert head is not None
                applied = []
                for p in plan:
                    new_serial = conn.execute(
                        query("reset_partition"),
                        {
                            "source": source,
                            "topic": p.tp.topic,
                            "partition": p.tp.partition,
                            "new_offset": p.new_offset,
                        },
                    ).fetchone()
                    assert new_serial is not None
                    p = replace(p, new_serial=int(new_serial["serial"]))
                    conn.execute(
                        query("insert_reset_partition"),
                        {
                            "reset_id": head["id"],
                            "topic": p.tp.topic,
                            "partition": p.tp.partition,
                            "old_offset": p.old_offset,
                            "new_offset": p.new_offset,
                            "old_serial": p.old_serial,
                            "new_serial": p.new_serial,
                            "last_segment_id": rows[p.tp]["last_segment_id"],
                            "skipped_start": p.skipped[0] if p.skipped else None,
                            "skipped_end": p.skipped[1] if p.skipped else None,
                            "replayed_start": p.replayed[0] if p.replayed else None,
                            "replayed_end": p.replayed[1] if p.replayed else None,
                        },
                    )
                    applied.append(p)
                conn.execute(query("bump_reset_generation"), {"name": source})
                return ResetResult(tuple(applied), int(head["id"]))

    def recent_resets(self, source: str, limit: int = 5) -> list[Row]:
        return self._fetch("recent_resets", source=source, limit=limit)

    # -- workers and errors -----------------------------------------------------------

    def heartbeat(
        self,
        source: str,
        worker: str,
        host: str,
        pid: int,
        version: str,
        state: str,
        partitions: Sequence[str],
        spec_version: int | None = None,
    ) -> None:
        with wrap_exceptions(self.url):
            conn = self._connection()
            conn.execute(
                query("heartbeat"),
                {
                    "source": source,
                    "worker": worker,
                    "host": host,
                    "pid": pid,
                    "version": version,
                    "state": state,
                    "partitions": list(partitions),
                    "spec_version": spec_version,
                },
            )
            # Rows of workers dead for a day are only noise.
            conn.execute(query("expire_workers"), {"keep_s": 86_400})

    def live_workers(self, source: str, expiry_s: float = 30.0) -> list[Row]:
        return self._fetch("live_workers", source=source, expiry_s=expiry_s)

    def record_error(self, source: str, worker: str, kind: str, message: str) -> None:
        with wrap_exceptions(self.url):
            self._connection().execute(
                query("record_error"),
                {"source": source, "worker": worker, "kind": kind, "message": redact(message)[:2000]},
            )

    def recent_errors(self, source: str, limit: int = 10) -> list[Row]:
        return self._fetch("recent_errors", source=source, limit=limit)

    # -- reading --------------------------------------------------------------------

    def segments(self, source: str, since: datetime | None = None, limit: int | None = None) -> list[Row]:
        """The source's segments, oldest first; with ``since`` / ``limit``: only those published
        at or after ``since``, and only the newest ``limit`` of them."""
        return self._fetch("list_segments", source=source, since=since, limit=limit)

    def partitions(self, source: str) -> list[Row]:
        return self._fetch("list_partitions", source=source)

    def partition_status(self, source: str) -> list[Row]:
        return self._fetch("partition_status", source=source)

    def conflict_counts(self, source: str) -> dict[str, int]:
        return {row["reason"]: int(row["n"]) for row in self._fetch("conflict_counts", source=source)}

    # -- the split registry (migrations/0008) ------------------------------------------

    def register_build(self, worker: str, build: BuildRegistration) -> None:
        """Register a build's locations and splits before it writes anything. Idempotent:
        after an unknown outcome, registering again is safe."""
        self._fetch_none(
            "register_build",
            build_id=build.build_id,
            source=build.source,
            worker=worker,
            staging=build.staging,
            data=build.data,
            rejects=build.rejects,
            split_ids=list(build.split_ids),
        )

    def abandon_stale_splits(self, source: str, grace_s: float, dry_run: bool = False) -> list[uuid.UUID]:
        """Give up the splits still building after ``grace_s``: from the commit of this call
        on, their publish is refused. ``dry_run``: only say which."""
        rows = self._fetch("stale_splits" if dry_run else "abandon_splits", source=source, grace_s=grace_s)
        return [r["split_id"] for r in rows]

    def builds_to_sweep(self, source: str) -> list[Row]:
        """Builds of the source with no split still building and not swept yet, each with
        ``keep``: the files its published segments list."""
        return self._fetch("builds_to_sweep", source=source)

    def mark_swept(self, source: str, build_id: uuid.UUID) -> None:
        self._fetch_none("mark_swept", source=source, build_id=build_id)

    def build_counts(self, source: str) -> tuple[int, int]:
        """(unswept, total) registered builds of the source."""
        row = self._fetch("build_counts", source=source)[0]
        return int(row["unswept"]), int(row["total"])


def _plan_partition(tp: TopicPartition, row: Row, new: int, earliest: int | None) -> PartitionReset:
    old: int | None = row["next_offset"]
    skipped = replayed = None
    if old is not None:
        if new > old:
            skipped = (old, new)
        elif new < old:
            replayed = (new, old)
    elif row["initial_position"] == "earliest":
        # Nothing published yet: the partition would start at Kafka's earliest offset
        # (0 when it is not known), so a later offset skips what lies before it.
        floor = earliest if earliest is not None else 0
        if new > floor:
            skipped = (floor, new)
    # Never published and starting from latest: nothing would have been read before the
    # new offset either way, so the reset neither skips nor replays published data.
    return PartitionReset(tp, old, new, skipped, replayed, old_serial=int(row["serial"]))


def _source_root(store: str, name: str) -> str:
    """Where a source's files lie: ``<store>/<name>`` (ingest/segment_store.py)."""
    try:
        store = canonical_store_uri(store)
    except ConfigError:  # a store stored before URIs were validated: compare it as written
        store = store.rstrip("/")
    return f"{store}/{name}"


def _check_store_overlap(conn: psycopg.Connection[Row], name: str, store: str) -> None:
    """Refuse a store whose source directory overlaps another source's (any version of
    it): one source's gc or cleanup could otherwise reach the other's files."""
    root = _source_root(store, name)
    for row in conn.execute(query("other_stores"), {"name": name}).fetchall():
        if row["segment_store"] is None:
            continue
        other_root = _source_root(str(row["segment_store"]), str(row["source"]))
        if overlap(root, other_root):
            raise StoreOverlap(name, root, str(row["source"]), other_root)


def group_id(name: str, consumer_group: str) -> str:
    """The Kafka group a source's workers join (``SourceSpec.group_id``)."""
    return consumer_group or f"ingest-{name}"


def _check_group_unique(conn: psycopg.Connection[Row], name: str, consumer_group: str) -> None:
    """Refuse a group another source (any state, terminated too: its group's committed
    offsets are its own) already joins."""
    mine = group_id(name, consumer_group)
    for row in conn.execute(query("other_groups"), {"name": name}).fetchall():
        if group_id(str(row["source"]), str(row["consumer_group"])) == mine:
            raise GroupTaken(name, mine, str(row["source"]))


def _conflict(row: Row) -> PublishConflict:
    """A failed check as returned by ``ingest_lock_ranges`` / ``ingest_publish_segment``."""
    return PublishConflict(
        row["reason"], TopicPartition(row["topic"], row["partition"]), row["expected"], row["actual"]
    )
