"""librdkafka's own log lines go through the structured logger: JSON logs stay JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A consumer whose broker refuses connections: librdkafka logs every failed connect (level 3).
SCRIPT = """
import time
from confluent_kafka import Consumer
from ingest.config import kafka_client
from ingest_dev.testkit import free_port
from ingest.logs import configure_logging

configure_logging("json")
consumer = kafka_client(Consumer, {"bootstrap.servers": f"127.0.0.1:{free_port()}", "group.id": "g"})
consumer.subscribe(["t"])
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    consumer.poll(0.2)
consumer.close()
"""


def test_librdkafka_lines_are_json_events() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, "librdkafka logged nothing about a refused connection"
    events = [json.loads(line) for line in lines]  # a raw "%3|...|FAIL|..." line fails here
    refused = [e for e in events if e["event"] == "librdkafka" and e["facility"] == "FAIL"]
    assert refused and refused[0]["level"] == "error" and "Connection refused" in refused[0]["message"]
