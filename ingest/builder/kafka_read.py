"""Spark reads each split's exact offsets from Kafka: the build's input.

One Spark Kafka batch read covers, per partition, one range ``[start, end)``; a batch may hold
several consecutive splits of one partition, so its splits are laid out in **layers** (the
n-th split of each partition in layer n) and the layers' reads are unioned. Spark makes one
task per range, so every task reads one split and every file it writes lies in one split
(ingest.segments.output_files proves it from the footers).

How the reader is set, and why:
- ``kafka.isolation.level=read_committed``: records of aborted transactions are never read;
  splits end at most at the last stable offset (ingest.consume.cutter), so no read waits for
  an open transaction.
- ``failOnDataLoss=true``: offsets of a range that are gone from the log (retention,
  ``delete_records``, a truncated log) fail the job instead of being skipped silently; the
  worker then measures and records the gap against the stored offset, or stops the partition
  (ingest.consume.gaps). Transaction markers, aborted records and compacted-away offsets inside
  a range are no data loss for Spark's reader: they are read past without an error.
- ``kafkaConsumer.pollTimeoutMs``: the longest one poll of an executor's consumer may wait for a
  range's records (Spark's default is 120 s). A range that cannot be read to its end (the log
  was truncated below it) then fails within it rather than two minutes later.
- ``kafka.group.id`` fixed per source and client properties: the source's group id, then a
  digest of the reader's Kafka properties (its secrets keyed with a key of the process's own:
  the id shows in logs and in Kafka, and must not let a password be guessed offline; a
  restarted worker with secrets gets another id). Spark keeps its executors' consumers in a pool keyed
  by group id and partition, so every job reuses them (without it each read makes a new group
  id, and new consumers and connections per job). The pool also keeps, for the JVM's life,
  the properties each key was first read with, and fails every task that asks for the key with
  others: on a long-lived Spark (a Connect server, a cluster's executors) two workers of one
  source with a ``client.id`` each, or a worker restarted with new properties, would fail
  every build of the partitions the other had read. The reader only assigns partitions and
  never commits: the id never joins a group. Each read's id also ends with a digest of the
  ids (KIP-516) of every topic the reader has read, as the splits carry them
  (:class:`ReadTopics`): a topic deleted and re-created under its name is another log at the
  same offsets, and a consumer or the fetched records the pool kept for the old one must never
  serve a read of the new one. The digest changes only when a topic is first read or read
  under a new id, so between those every read shares one id and the pool is reused as before.
- ``kafka.fetch.max.wait.ms``: :data:`FETCH_MAX_WAIT_MS`, not Kafka's 500. With Kafka's, every
  task held one fetch for the whole wait (a fetch the broker answers only when it has records
  or the wait is over), so every job's read of a range, however small and pooled consumer or
  not, took over half a second: a batch with rejects (two jobs) a second. No range waits for
  records (a split ends at most at the last stable offset), so the short wait costs nothing
  but a fetch every few milliseconds from a consumer that waits for records that are not
  there (a truncated log, until ``pollTimeoutMs``). The client's properties may set another.
- The DSv2 source (``kafka`` not in ``spark.sql.sources.useV1SourceList``, set with the
  session, ingest.spark.session): a job interrupted by a kill switch stops reading within a
  fraction of a second (0.15-0.18 s measured: tests/integration/test_kafka_read.py). A study
  on this kind of machine found the V1 source's tasks reading their whole range first; it did
  not reproduce since, but DSv2 is the path the tests cover.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.kafka_java import JAVA_SECRET_PROPERTIES
from ingest.splits.split import SealedSplit
from ingest_common.model import TopicPartition
from ingest_common.redact import is_secret_name

# The row's split: its index in the sequence of splits the read was asked for.
SPLIT_COLUMN = "_split"

# The Kafka source's columns, as the build's plan reads them (ingest.builder.plan): the meta
# columns a segment keeps, the value, and the row's split. A record without a timestamp
# (type -1) has none.
READ_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp", "_key", "_value", SPLIT_COLUMN)

# The Kafka source's columns as the build's: a record without a timestamp (type -1) has none.
_COLUMNS = (
    "topic AS _topic",
    "partition AS _partition",
    "offset AS _offset",
    "CASE WHEN timestampType >= 0 THEN timestamp END AS _timestamp",
    "key AS _key",
    "value AS _value",
)

#: Spark's default (120 s) is what a range that cannot be read to its end waits, per partition.
POLL_TIMEOUT_MS = 30_000
#: The longest the broker holds a fetch of the reader's consumers that finds nothing to read.
FETCH_MAX_WAIT_MS = 20


# Secrets enter the group id's digest keyed with this process's own random key: the id shows in
# logs and in Kafka, and a plain hash of the properties would let anyone test guesses of a
# password against it. Within the process, the same properties still give the same id.
_SECRET_KEY = secrets.token_bytes(32)


class ReadTopics:
    """The (topic, topic id) pairs a reader has read, for the group id of each read: the
    reader's own, then a digest of every pair seen so far (none: the reader's alone). A read
    of a topic under an id never seen before (a new topic, or one re-created under its name)
    gets a group id no earlier read had, so Spark's pool serves it nothing of another log;
    pairs are never forgotten, so the id moves only then. Build threads share it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str]] = set()
        self._digest = ""

    def know(self, topic_ids: Mapping[str, str]) -> None:
        """Topics read from now on (a worker's, at its start): one group id from the first read."""
        self._add(set(topic_ids.items()))

    def group_id(self, group_id: str, splits: Sequence[SealedSplit]) -> str:
        digest = self._add({(s.tp.topic, s.topic_id) for s in splits if s.topic_id is not None})
        return f"{group_id}-{digest}" if digest else group_id

    def _add(self, pairs: set[tuple[str, str]]) -> str:
        with self._lock:
            if not pairs <= self._seen:
                self._seen |= pairs
                text = json.dumps(sorted(self._seen))
                self._digest = hashlib.sha256(text.encode()).hexdigest()[:8]
            return self._digest


def _digest(options: Mapping[str, str]) -> str:
    """12 hex digits that change with any of the reader's client properties."""
    hidden = {k for k in options if k.removeprefix("kafka.") in JAVA_SECRET_PROPERTIES or is_secret_name(k)}
    plain = {k: v for k, v in options.items() if k not in hidden}
    keyed = hmac.new(_SECRET_KEY, json.dumps({k: options[k] for k in hidden}, sort_keys=True).encode(), "sha256")
    text = json.dumps({"options": plain, "secrets": keyed.hexdigest() if hidden else ""}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class KafkaReader:
    """The options of every read: ``kafka.*`` client properties and the source's own."""

    options: tuple[tuple[str, str], ...]
    # The topics (and their ids) read so far: each read's group id ends with their digest.
    topics: ReadTopics = field(default_factory=ReadTopics, compare=False, repr=False)

    @staticmethod
    def of(
        bootstrap: str,
        group_id: str,
        client: Mapping[str, str] | None = None,
        poll_timeout_ms: int = POLL_TIMEOUT_MS,
    ) -> KafkaReader:
        """``client``: Kafka (Java) client properties, without the ``kafka.`` prefix (a
        ``group.id`` among them is ignored: the reader's is ``group_id`` and their digest)."""
        kafka = {
            "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
            **{f"kafka.{k}": v for k, v in (client or {}).items()},
            "kafka.bootstrap.servers": bootstrap,
        }
        kafka.pop("kafka.group.id", None)
        digest = _digest(kafka)
        options = {
            **kafka,
            "kafka.group.id": f"{group_id}-{digest}",
            "kafka.isolation.level": "read_committed",
            "failOnDataLoss": "true",
            "includeHeaders": "false",
            "kafkaConsumer.pollTimeoutMs": str(poll_timeout_ms),
        }
        return KafkaReader(tuple(sorted(options.items())))

    def frame(self, spark: Any, splits: Sequence[SealedSplit]) -> Any:
        """The records of every split, as the build's columns (:data:`READ_COLUMNS`); each
        row's ``SPLIT_COLUMN`` is its split's index in ``splits``."""
        from functools import reduce

        index = {split.id: i for i, split in enumerate(splits)}
        frames = [self._read(spark, layer, index) for layer in layers(splits)]
        return reduce(lambda a, b: a.unionByName(b), frames)

    def _read(self, spark: Any, layer: Sequence[SealedSplit], index: Mapping[uuid.UUID, int]) -> Any:
        assigned: dict[str, list[int]] = {}
        starts: dict[str, dict[str, int]] = {}
        ends: dict[str, dict[str, int]] = {}
        for split in layer:
            assigned.setdefault(split.tp.topic, []).append(split.tp.partition)
            starts.setdefault(split.tp.topic, {})[str(split.tp.partition)] = split.start
            ends.setdefault(split.tp.topic, {})[str(split.tp.partition)] = split.end
        options = dict(self.options)
        options = {
            **options,
            "kafka.group.id": self.topics.group_id(options["kafka.group.id"], layer),
            "assign": json.dumps(assigned, sort_keys=True),
            "startingOffsets": json.dumps(starts, sort_keys=True),
            "endingOffsets": json.dumps(ends, sort_keys=True),
        }
        # One call each (a job's planning is paid per batch: Py4J round trips add up).
        return spark.read.format("kafka").options(**options).load().selectExpr(*_COLUMNS, _split_of(layer, index))


def _split_of(layer: Sequence[SealedSplit], index: Mapping[uuid.UUID, int]) -> str:
    """The row's split in a layer's read: a layer holds one split per partition, and the read
    returns no record outside its ranges, so the topic and partition say which. The mapping is
    a map literal, which Spark folds into one value its compiled code refers to: the code is
    the same whatever the batch's splits, and Spark compiles an expression's code once per
    distinct text. A CASE naming each split's offsets made every job compile its stages anew
    (Janino, then the JIT: 7.6 of a worker JVM's 20.7 CPU s at 80,000 records/s went to the
    C2 compiler)."""
    if len({split.tp.topic for split in layer}) == 1:
        key, entries = "partition", [f"{split.tp.partition}, {index[split.id]}" for split in layer]
    else:
        # Kafka topic names are [a-zA-Z0-9._-]: safe in a SQL string literal.
        key = "concat(topic, ':', partition)"
        entries = [f"'{split.tp.topic}:{split.tp.partition}', {index[split.id]}" for split in layer]
    return f"element_at(map({', '.join(entries)}), {key}) AS {SPLIT_COLUMN}"


def layers(splits: Sequence[SealedSplit]) -> list[list[SealedSplit]]:
    """The splits in layers: each layer holds at most one split of a partition, the earliest
    first (one Kafka read takes one range per partition)."""
    out: list[list[SealedSplit]] = []
    depth: dict[TopicPartition, int] = {}
    for split in sorted(splits, key=lambda s: (s.tp, s.start)):
        n = depth.get(split.tp, 0)
        depth[split.tp] = n + 1
        if n == len(out):
            out.append([])
        out[n].append(split)
    return out
