"""The benchmark's records: keyed ~200-byte JSON with an event-time field, and how they are produced."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench import avro_wire as avro
from ingest_dev.kafka_clients import end_offsets, produce_records

# One schema for every system: the ingest spec's [schema], the raw baseline's explicit pyarrow
# schema (bench/peers/raw.py) and what Quix infers all describe these fields.
SCHEMA: dict[str, str] = {
    "id": "long",
    "user": "string",
    "ts": "timestamp",
    "amount": "double",
    "country": "string",
    "device": "string",
    "session": "string",
    "tags": "array<string>",
    "page": "string",
}
EVENT_TIME = "ts"
# The topic of ``python -m bench``'s data set.
TOPIC = "bench"

_COUNTRIES = ("DE", "FR", "US", "BR", "IN", "JP", "NG", "AU")
_DEVICES = ("android", "ios", "desktop", "tablet")
# Fixed base so the data set is the same on every run; only the ms part varies with the id.
_BASE_EPOCH_S = 1_795_000_000


def record_value(i: int, event_time_s: float | None = None) -> bytes:
    """Record ``i``: ~200 bytes of compact JSON, deterministic unless ``event_time_s`` is given;
    the same record in Avro (Confluent wire format) once the run is Avro (bench/avro_wire.py)."""
    ts_s = _BASE_EPOCH_S + i / 1000 if event_time_s is None else event_time_s
    wire = avro.active()
    if wire is not None:
        return wire.encode(_doc(i, int(ts_s * 1000)))
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts_s)) + f".{int(ts_s * 1000) % 1000:03d}Z"
    return json.dumps(_doc(i, ts), separators=(",", ":")).encode()


def _doc(i: int, ts: str | int) -> dict[str, Any]:
    return {
        "id": i,
        "user": f"user-{i % 50_000:05d}",
        "ts": ts,
        "amount": round((i * 7919 % 1_000_000) / 100, 2),
        "country": _COUNTRIES[i % len(_COUNTRIES)],
        "device": _DEVICES[i % len(_DEVICES)],
        # A multiplicative hash: looks random, costs nothing, identical on every run.
        "session": f"{(i * 2_654_435_761) % 2**64:016x}",
        "tags": ["bench", f"t{i % 7}"],
        "page": f"/products/{i % 997}/details?ref=campaign-{i % 13}",
    }


def record_key(i: int) -> bytes:
    return f"user-{i % 50_000:05d}".encode()


@dataclass
class Produced:
    """What a produce call delivered: per-partition log ends (from delivery reports) and byte counts."""

    ends: dict[int, int]
    records: int
    value_bytes: int
    seconds: float

    @property
    def avg_value_bytes(self) -> float:
        return self.value_bytes / self.records if self.records else 0.0


def produce_dataset(
    bootstrap: str, topic: str, records: int, partitions: int, first_id: int = 0, timeout: float = 600.0
) -> Produced:
    """Produce ``records`` keyed records, spread round-robin so every partition gets the same count.

    The partition is set explicitly (not hashed from the key) so that "records per partition"
    is the same for every run and every size; the key is still there, as in a keyed topic.
    Log ends are Kafka's end offsets, checked against the delivery reports (:func:`kafka_ends`).
    """
    value_bytes = 0

    def gen() -> Iterator[tuple[int | None, bytes | None, bytes | None]]:
        nonlocal value_bytes
        for i in range(first_id, first_id + records):
            value = record_value(i)
            value_bytes += len(value)
            yield i % partitions, record_key(i), value

    started = time.monotonic()
    ends = kafka_ends(bootstrap, topic, produce_records(bootstrap, topic, gen(), timeout=timeout))
    return Produced(ends=ends, records=records, value_bytes=value_bytes, seconds=time.monotonic() - started)


def produce_steady(
    bootstrap: str, topic: str, partitions: int, rate: float, duration_s: float, first_id: int
) -> Produced:
    """Produce at ``rate`` records/s for ``duration_s`` seconds (paced in 10 ms steps).

    Each record's Kafka timestamp is set by the producer at ``produce()`` time, which is what
    produce-to-visible latency is measured from.  Returns Kafka's log ends (:func:`kafka_ends`).
    """
    from confluent_kafka import KafkaError, Message, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            # Low linger: the point is to measure latency, not to batch for throughput.
            "linger.ms": 1,
        }
    )
    ends: dict[int, int] = {}
    failures: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(str(err))
            return
        p, o = msg.partition(), msg.offset()
        assert p is not None and o is not None
        ends[p] = max(ends.get(p, 0), o + 1)

    total = int(rate * duration_s)
    value_bytes = 0
    started = time.monotonic()
    sent = 0
    # Bounded: at most ``total`` records, and the loop ends at duration + 5 s whatever happens.
    while sent < total and time.monotonic() < started + duration_s + 5:
        due = min(total, int((time.monotonic() - started) * rate) + 1)
        while sent < due:
            i = first_id + sent
            value = record_value(i, event_time_s=time.time())
            value_bytes += len(value)
            producer.produce(topic, value=value, key=record_key(i), partition=i % partitions, on_delivery=on_delivery)
            sent += 1
        producer.poll(0)
        time.sleep(0.01)
    remaining = producer.flush(30)
    if failures or remaining:
        raise RuntimeError(
            f"steady produce: {len(failures)} failed, {remaining} undelivered"
            + (f"; first error: {failures[0]}" if failures else "")
        )
    return Produced(
        ends=kafka_ends(bootstrap, topic, ends),
        records=sent,
        value_bytes=value_bytes,
        seconds=time.monotonic() - started,
    )


def kafka_ends(bootstrap: str, topic: str, delivered: dict[int, int]) -> dict[int, int]:
    """Kafka's end offset of every partition, which is what the runs wait for.

    The bench's producers are the topic's only writers and are not transactional, so each
    end must equal the last delivered offset + 1 on every partition written to: a
    difference means records the delivery reports cannot account for, and the run stops.
    """
    ends = end_offsets(bootstrap, topic)
    differ = {p: (end, ends.get(p)) for p, end in delivered.items() if ends.get(p) != end}
    if differ:
        raise RuntimeError(
            f"{topic}: Kafka's end offsets differ from the delivery reports (partition: (delivered, kafka)): {differ}"
        )
    return ends


@dataclass
class Paced:
    """One paced produce: how many records, and when the first and the last were handed to the
    producer (wall clock: their Kafka timestamps are taken at that moment)."""

    records: int
    started_at: float
    ended_at: float
    rate_asked: float

    @property
    def rate(self) -> float:
        """The rate delivered to the producer (records over the span it took)."""
        return self.records / max(self.ended_at - self.started_at, 1e-6)


class RecordPool:
    """Pre-made keys and values, reused round-robin, so that a paced producer's cost per record
    is one ``produce()`` call and not the JSON encoding of a fresh record (which would cap the
    rate at what one Python thread encodes). The freshness run tells records apart by their
    Kafka coordinates and timestamps, never by ``id``."""

    def __init__(self, size: int = 50_000) -> None:
        self.records = [(record_key(i), record_value(i)) for i in range(size)]


def produce_paced(
    producer: Any, topic: str, partitions: int, rate: float, duration_s: float, pool: RecordPool
) -> Paced:
    """Hand ``rate * duration_s`` records of ``pool`` to ``producer`` at ``rate`` records/s (paced in
    5 ms steps), then flush. A producer that cannot keep up takes longer than ``duration_s``
    (bounded at twice it, then what was not sent is not sent): :attr:`Paced.rate` tells."""
    total = int(rate * duration_s)
    records = pool.records
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    started_at = time.time()
    started = time.monotonic()
    sent = 0
    while sent < total and time.monotonic() < started + 2 * duration_s:
        due = min(total, int((time.monotonic() - started) * rate) + 1)
        while sent < due:
            key, value = records[sent % len(records)]
            try:
                producer.produce(topic, value=value, key=key, partition=sent % partitions, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.05)  # librdkafka's queue is full: let it drain, then go on
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.005)
    ended_at = time.time()
    remaining = producer.flush(60)
    if failures or remaining:
        raise RuntimeError(
            f"paced produce: {len(failures)} failed, {remaining} undelivered"
            + (f"; first error: {failures[0]}" if failures else "")
        )
    return Paced(records=sent, started_at=started_at, ended_at=ended_at, rate_asked=rate)


def paced_producer(bootstrap: str) -> Any:
    """The freshness run's one producer: acks from the broker, batches of up to 5 ms."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
