import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
import pytest

from ingest.spec.parse import load_spec_file
from ingest_dev import avro_samples
from ingest_dev.demo import avro_encoder, sample_record, spec_text, waiting_for


class Workers:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def live_workers(self, source: str) -> list[dict[str, Any]]:
        return self.rows


class Proc:
    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


def test_the_demo_says_what_it_waits_for() -> None:
    joining = Workers([{"state": "starting", "partitions": []}])
    said = waiting_for(joining, [Proc(None), Proc(None), Proc(3)], 0)  # type: ignore[arg-type, list-item]
    assert "worker-2 exited with code 3 (see worker-2.log)" in said
    assert "1 worker(s) starting Spark" in said and "1 worker(s) joining the consumer group" in said
    # Mid-rebalance two workers may list one partition: it is counted once.
    running = Workers(
        [
            {"state": "running", "partitions": ["clicks[0]", "clicks[1]"]},
            {"state": "running", "partitions": ["clicks[1]"]},
        ]
    )
    assert "own 2/6 partitions" in waiting_for(running, [Proc(None)] * 2, 0)  # type: ignore[arg-type, list-item]
    assert "building the first segments" in waiting_for(running, [Proc(None)], 0)  # type: ignore[arg-type, list-item]
    assert waiting_for(running, [Proc(None)], 10) == ""  # type: ignore[arg-type, list-item]


def test_the_demo_spec_is_avro_through_the_registry_or_plain_json(tmp_path: Path) -> None:
    avro_path, json_path = tmp_path / "avro.toml", tmp_path / "json.toml"
    avro_path.write_text(spec_text(tmp_path / "segments", "http://127.0.0.1:8081/apis/ccompat/v7"))
    json_path.write_text(spec_text(tmp_path / "segments", None))
    avro, _ = load_spec_file(avro_path)
    plain, _ = load_spec_file(json_path)
    assert (avro.format, avro.key_format, avro.key_columns) == ("avro", "avro", (("_key_user", "string"),))
    assert avro.registry is not None and avro.registry.url == "http://127.0.0.1:8081/apis/ccompat/v7"
    assert dict(avro.schema)["region"] == "string"
    assert (plain.format, plain.key_format, plain.registry) == ("json", "binary", None)
    assert "region" not in dict(plain.schema)


def test_the_demo_avro_samples_decode_with_their_writer_versions() -> None:
    v1 = avro_samples.AvroWriter(avro_samples.CLICK_V1, 11)
    v2 = avro_samples.AvroWriter(avro_samples.CLICK_V2, 12)
    key = avro_samples.AvroWriter(avro_samples.CLICK_KEY, 13)
    schemas = {11: avro_samples.CLICK_V1, 12: avro_samples.CLICK_V2, 13: avro_samples.CLICK_KEY}

    def decode(framed: bytes | None) -> Any:
        assert framed is not None and framed[0] == 0
        writer = fastavro.parse_schema(json.loads(schemas[int.from_bytes(framed[1:5], "big")]))
        return fastavro.schemaless_reader(io.BytesIO(framed[5:]), writer, None)

    k, value = avro_encoder(v1, key, 1)(7)
    assert decode(k) == {"user": "user-7"}
    assert decode(value) == {**sample_record(7, 1), "ts": datetime(2026, 11, 22, 0, 0, 7, tzinfo=UTC)}
    _, value = avro_encoder(v2, key, 2)(8)
    assert decode(value)["region"] == "ap"
    # Every 500th is framed with its id but does not decode: a reject, as the JSON demo's.
    _, bad = avro_encoder(v2, key, 2)(499)
    assert bad is not None and bad[:5] == v2.header
    with pytest.raises(EOFError):
        decode(bad)
