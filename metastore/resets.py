"""Offset changes outside publishes: operator resets (audited, serial-bumping) and the ledger of
offset gaps (records no longer in Kafka's log)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ingest_common.model import PartitionReset, ResetResult, TopicPartition
from metastore.base import Row, StoreBase, conflict_from_row
from metastore.connection import wrap_exceptions
from metastore.errors import InvalidReset, SourceNotFound
from metastore.queries import query


class ResetsMixin(StoreBase):
    """Reset stored offsets and list past resets; record, skip and acknowledge offset gaps."""

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
        topic_ids: Mapping[str, str | None] | None = None,
    ) -> ResetResult:
        """Set stored offsets, in one transaction that also bumps each changed partition's
        serial (so every publish in flight for it is refused) and the source's reset
        generation (so workers re-claim and re-seek), and records the audit rows.

        The plan is computed from the rows locked in that same transaction. When it skips or
        replays records and ``confirmed`` is false, nothing is written and the plan is
        returned with ``reset_id`` None. ``earliest``: Kafka's low watermarks where known
        (what a partition that never published would start from).

        ``topic_ids``: Kafka's id of each topic, asked before the offsets were (migrations/0027):
        stored with each partition reset (a topic missing: NULL, the next claim records it).
        A partition whose stored id is not Kafka's (its topic was re-created) is reset even to
        the offset it holds: it is read in the new topic from there.
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
                ids = topic_ids or {}
                plan = tuple(
                    _plan_partition(tp, rows[tp], offset, (earliest or {}).get(tp))
                    for tp, offset in sorted(targets.items())
                    if rows[tp]["next_offset"] != offset or ids.get(tp.topic) not in (None, rows[tp]["topic_id"])
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
                            "topic_id": ids.get(p.tp.topic),
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

    def record_gap(self, source: str, worker: str, tp: TopicPartition, from_offset: int, to_offset: int) -> None:
        """The partition stopped at ``from_offset`` in its current epoch: ``[from_offset, to_offset)``
        is no longer in the log. One row per epoch and offset (migration 0022)."""
        self._fetch(
            "record_gap",
            source=source,
            worker=worker,
            topic=tp.topic,
            partition=tp.partition,
            from_offset=from_offset,
            to_offset=to_offset,
        )

    def record_truncation(self, source: str, worker: str, tp: TopicPartition, from_offset: int, to_offset: int) -> None:
        """The partition stopped at ``to_offset`` (its stored offset): Kafka's log was truncated
        below it, so the records published at ``[from_offset, to_offset)`` are no longer the
        log's. Recorded with reason ``log_truncated``; never skipped."""
        self._fetch(
            "record_truncation",
            source=source,
            worker=worker,
            topic=tp.topic,
            partition=tp.partition,
            from_offset=from_offset,
            to_offset=to_offset,
        )

    def record_topic_recreation(
        self,
        source: str,
        worker: str,
        tp: TopicPartition,
        from_offset: int,
        to_offset: int,
        old_topic_id: str,
        new_topic_id: str,
    ) -> None:
        """The partition stopped at ``to_offset`` (its stored offset): its topic was deleted and
        re-created (Kafka's id for it is ``new_topic_id``, the stored offset was read from
        ``old_topic_id``), so the new log's ``[from_offset, to_offset)`` holds records never
        read. Recorded with reason ``topic_recreated`` and both ids; never skipped."""
        self._fetch(
            "record_topic_recreation",
            source=source,
            worker=worker,
            topic=tp.topic,
            partition=tp.partition,
            from_offset=from_offset,
            to_offset=to_offset,
            old_topic_id=old_topic_id,
            new_topic_id=new_topic_id,
        )

    def skip_gap(
        self, source: str, worker: str, tp: TopicPartition, serial: int, from_offset: int, to_offset: int
    ) -> int:
        """Move ``next_offset`` from ``from_offset`` to ``to_offset`` and write the gap to the
        ledger, in one transaction guarded like a publish: the row is locked, the serial must
        be the caller's and ``next_offset`` must still be ``from_offset`` (or unset). The gap
        is the partition's current epoch's: a stop recorded at that offset in this epoch becomes
        this skip, another epoch's row is left alone.

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
                    raise conflict_from_row(failed[0])
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
