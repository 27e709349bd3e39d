"""Partition claims: the rows a source's partitions have, who owns each, with which serial."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ingest_common.model import PartitionClaim, StartFrom, StoredPosition, TopicPartition
from metastore.base import Row, StoreBase
from metastore.connection import wrap_exceptions
from metastore.queries import query


class ClaimsMixin(StoreBase):
    """Register, claim, release and re-claim partitions (each claim bumps the serial that fences
    the previous owner's publishes), and read their state."""

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
        self,
        source: str,
        worker: str,
        tps: Sequence[TopicPartition],
        topic_ids: Mapping[str, str | None] | None = None,
    ) -> dict[TopicPartition, PartitionClaim]:
        """In one transaction: bump the serial of each partition, record the owner, read
        the stored offset. A partition without a row is created (starting from earliest).
        A claim with no stored offset is pinned by :meth:`pin_start_offsets` before it is read.

        ``topic_ids``: Kafka's id of each topic, asked before the claim (migrations/0027). It is
        recorded where the row has none, or nothing stored to read from; a stored id is kept
        and returned (the caller compares it with Kafka's: another one is a re-created topic)."""
        if not tps:
            return {}
        ordered = sorted(set(tps))
        ids = topic_ids or {}
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
                        "topic_ids": [ids.get(tp.topic) for tp in ordered],
                    },
                ).fetchall()
        return _claims(rows)

    def pin_start_offsets(
        self, source: str, pins: Sequence[tuple[PartitionClaim, int]]
    ) -> dict[TopicPartition, PartitionClaim]:
        """Store each claimed partition's start offset (resolved from the log by the claimer)
        where nothing is stored yet, while the claim's serial is still the current one. Returns
        the claims that hold, with the offset now stored (another claimer's, if it pinned
        first); a claim missing from the answer was superseded."""
        if not pins:
            return {}
        ordered = sorted(pins, key=lambda p: p[0].tp)
        params = {
            "source": source,
            "topics": [c.tp.topic for c, _ in ordered],
            "partitions": [c.tp.partition for c, _ in ordered],
            "serials": [c.serial for c, _ in ordered],
            "offsets": [offset for _, offset in ordered],
        }
        return self._under_row_locks("pin_start_offsets", params)

    def claim_from(
        self, source: str, worker: str, tps: Sequence[TopicPartition], start: int
    ) -> dict[TopicPartition, PartitionClaim]:
        """Claim, and pin ``start`` where nothing is stored: for callers that know where the
        partitions start without asking Kafka (the bench, tests). Workers pin what the log says."""
        claims = self.claim_partitions(source, worker, tps)
        return claims | self.pin_start_offsets(source, [(c, start) for c in claims.values() if c.next_offset is None])

    def retire_topic(self, source: str, topic: str) -> list[int]:
        """Retire the partitions of a deleted topic (migrations/0024); the partitions retired
        by this call (none when they already were)."""
        return [int(r["partition"]) for r in self._fetch("retire_topic", source=source, topic=topic)]

    def live_topics(self, source: str) -> list[str]:
        """The source's topics with a partition that is not retired."""
        return [str(r["topic"]) for r in self._fetch("live_topics", source=source)]

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
        return self._under_row_locks("reclaim_partitions", params)

    def _under_row_locks(self, name: str, params: dict[str, Any]) -> dict[TopicPartition, PartitionClaim]:
        """Run the claims query ``name`` in one transaction after locking the partitions' rows
        in (topic, partition) order (``params`` sorted so), as publishes lock them: the same
        order everywhere, so no two transactions deadlock."""
        with wrap_exceptions(self.url):
            conn = self._connection()
            with conn.transaction():
                conn.execute(query("lock_partitions"), params)
                rows = conn.execute(query(name), params).fetchall()
        return _claims(rows)

    def partition_state(self, source: str, tp: TopicPartition) -> tuple[int, int | None] | None:
        """(serial, next_offset) of one partition, or None if it has no row."""
        rows = self._fetch("partition_state", source=source, topic=tp.topic, partition=tp.partition)
        return (int(rows[0]["serial"]), rows[0]["next_offset"]) if rows else None

    def stored_position(self, source: str, tp: TopicPartition) -> StoredPosition | None:
        """(serial, next_offset, leader_epoch, topic_id) of one partition, or None if it has no row."""
        rows = self._fetch("stored_position", source=source, topic=tp.topic, partition=tp.partition)
        if not rows:
            return None
        row = rows[0]
        return StoredPosition(int(row["serial"]), row["next_offset"], row["leader_epoch"], row["topic_id"])

    def record_topic_id(self, source: str, tp: TopicPartition, serial: int, topic_id: str) -> str | None:
        """Record Kafka's id of the partition's topic while ``serial`` is the current claim,
        where none is stored or the stored offset is 0 (nothing of any log lies below it).
        Returns the id stored now (another one: the topic was re-created); None: fenced."""
        rows = self._fetch(
            "record_topic_id", source=source, topic=tp.topic, partition=tp.partition, serial=serial, topic_id=topic_id
        )
        return str(rows[0]["topic_id"]) if rows and rows[0]["topic_id"] is not None else None

    def partitions(self, source: str) -> list[Row]:
        return self._fetch("list_partitions", source=source)

    def partition_status(self, source: str) -> list[Row]:
        return self._fetch("partition_status", source=source)


def _claims(rows: Iterable[Row]) -> dict[TopicPartition, PartitionClaim]:
    claims = {}
    for row in rows:
        tp = TopicPartition(row["topic"], row["partition"])
        claims[tp] = PartitionClaim(
            tp,
            int(row["serial"]),
            row["next_offset"],
            row["initial_position"],
            row["leader_epoch"],
            retired=row.get("retired_at") is not None,
            topic_id=row.get("topic_id"),
        )
    return claims
