"""The chaos run's records: record i's fields, its JSON value and the row it must become, and
the producer that writes ids 0..n-1 at an even pace and keeps where each one landed."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any


def record_fields(i: int) -> dict[str, Any]:
    """Record ``i``'s fields; :func:`expected_row` is the row it must become."""
    return {
        "id": i,
        "user": f"user-{i % 997}-{i * 7919 % 100_003}",
        "ts": _ts(i),
        "amount": i * 0.25,
        "tags": ["c", str(i % 11), str(i)],
    }


def record_value(i: int) -> bytes:
    """Record ``i``'s value in JSON."""
    return json.dumps({**record_fields(i), "ts": _ts(i).isoformat()}).encode()


def _ts(i: int) -> datetime:
    return datetime.fromtimestamp(1_790_000_000 + i, tz=UTC)


def expected_row(i: int) -> dict[str, Any]:
    return {"_key": str(i).encode(), **record_fields(i)}


class ChaosProducer:
    """Produces ids 0..records-1 at an even pace over ``duration_s`` (bounded by both), and
    keeps from the delivery reports which id landed at which (partition, offset). ``client``:
    how the producer reaches the broker (its bootstrap and security settings)."""

    def __init__(
        self,
        client: Mapping[str, Any],
        topic: str,
        partitions: int,
        records: int,
        duration_s: float,
        value: Callable[[int], bytes] = record_value,
    ) -> None:
        from confluent_kafka import Producer

        self.value = value
        self.topic = topic
        self.partitions = partitions
        self.records = records
        self.duration_s = duration_s
        self.delivered: dict[int, dict[int, int]] = {p: {} for p in range(partitions)}
        self.errors: list[str] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._producer = Producer(
            {
                **client,
                "acks": "all",
                "linger.ms": 20,
                "batch.num.messages": 2000,
                "queue.buffering.max.messages": 200_000,
                "partitioner": "murmur2_random",
                # Long enough never to give up on a record while the broker is healthy: a record
                # reported failed might still be in the log, which the check could not explain.
                "message.timeout.ms": 600_000,
            }
        )
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)
        self.done = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def ends(self) -> dict[int, int]:
        with self._lock:
            return {p: (max(d) + 1 if d else 0) for p, d in self.delivered.items()}

    def delivered_count(self) -> int:
        with self._lock:
            return sum(len(d) for d in self.delivered.values())

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.key()!r}: {err}")
            return
        with self._lock:
            self.delivered[msg.partition()][msg.offset()] = int(msg.key())

    def _run(self) -> None:
        started = time.monotonic()
        deadline = started + self.duration_s * 2 + 60
        try:
            while self.sent < self.records and time.monotonic() < deadline:
                elapsed = time.monotonic() - started
                due = min(self.records, int(self.records * min(1.0, elapsed / self.duration_s)) + 1)
                while self.sent < due:
                    i = self.sent
                    try:
                        self._producer.produce(
                            self.topic,
                            value=self.value(i),
                            key=str(i).encode(),
                            partition=i % self.partitions,
                            on_delivery=self._on_delivery,
                        )
                    except BufferError:
                        self._producer.poll(0.05)
                        continue
                    self.sent += 1
                self._producer.poll(0.05)
            remaining = self._producer.flush(120)
            if remaining:
                self.errors.append(f"{remaining} records still undelivered after the final flush")
        finally:
            self.done.set()
