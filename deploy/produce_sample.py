"""Sample data for the compose setup: KAFKA_BOOTSTRAP, TOPIC, COUNT (bounded)."""

from __future__ import annotations

import json
import os

from confluent_kafka import Producer

count = min(int(os.environ.get("COUNT", "100000")), 10_000_000)
producer = Producer({"bootstrap.servers": os.environ.get("KAFKA_BOOTSTRAP", "kafka:9092"), "linger.ms": 20})
topic = os.environ.get("TOPIC", "clicks")
for i in range(count):
    value = {"id": i, "user": f"user-{i % 1000}", "ts": "2026-11-22T10:00:00Z", "amount": i * 0.5, "tags": ["a"]}
    while True:
        try:
            producer.produce(topic, key=str(i).encode(), value=json.dumps(value).encode())
            break
        except BufferError:
            producer.poll(0.1)
    producer.poll(0)
producer.flush(60)
print(f"produced {count} records to {topic}")
