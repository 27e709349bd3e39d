"""Format protobuf end to end against the real registry, Kafka, Spark and PostgreSQL: two writer
versions of a message with a nested message, a repeated field, an enum and a Timestamp, and
bad records among them, through a worker; exactly once checked from the Parquet files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from confluent_kafka.serialization import MessageField, SerializationContext

from ingest.builder.job import BuilderFactory
from tests.acceptance.harness import Produced, StartWorker, apply_spec, assert_exactly_once
from tests.acceptance.test_registry_formats import (
    NEVER_REGISTERED_ID,
    PARTITIONS,
    published,
    run_to_end,
    write_registry_spec,
)
from tests.fixtures.servers import MakeTopic
from tests.protobuf_orders import ORDER_COLUMNS, OrderVersion, framed, order, when


def test_protobuf_with_two_writer_versions_and_bad_records_lands_exactly_once(
    tmp_path: Path,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    schema_registry_url: str,
    spark_builder: BuilderFactory,
    start_worker: StartWorker,
) -> None:
    topic = make_topic(partitions=PARTITIONS)
    ctx = SerializationContext(topic, MessageField.VALUE)
    produced = Produced(kafka_bootstrap, topic, PARTITIONS)
    v1, v2 = OrderVersion.make(1), OrderVersion.make(2)
    encode1, encode2 = framed(schema_registry_url, v1.Order, ctx), framed(schema_registry_url, v2.Order, ctx)
    produced.produce(400, lambda i: encode1(order(v1, i)))
    produced.produce(400, lambda i: encode2(order(v2, i, quantity=7)))
    good = encode1(order(v1, 0))
    header, body = good[:7], good[7:]
    bad = {
        "not_confluent_framed": [b"\x01" + good[1:], b"\x00\x00"],
        "unknown_schema_id": [b"\x00" + NEVER_REGISTERED_ID.to_bytes(4, "big") + good[5:]],
        "unknown_message_index": [good[:5] + b"\x02\x08" + body],
        "undecodable": [header + b"\x08"],
        "missing_event_time": [encode1(v1.Order(id=1))],
        "null_value": [None],
    }
    bad_values = [value for values in bad.values() for value in values]
    produced.produce(len(bad_values), lambda i: bad_values[i - 800])
    columns = "".join(f'{name} = "{ctype}"\n' for name, ctype in ORDER_COLUMNS.items())
    source, spec_path = write_registry_spec(
        tmp_path, topic, schema_registry_url, f'format = "protobuf"\n[schema]\n{columns}'
    )
    apply_spec(database_url, spec_path)

    run_to_end(tmp_path, database_url, kafka_bootstrap, start_worker, spark_builder, source, produced)

    result = assert_exactly_once(database_url, source, produced)
    assert (result.rows, result.rejects) == (800, len(bad_values))
    data, rejects = published(database_url, source)
    assert Counter(rejects["_error"].to_pylist()) == Counter({r: len(v) for r, v in bad.items()})
    rows = data.to_pylist()
    assert Counter(r["quantity"] for r in rows) == Counter({None: 400, 7: 400})
    assert Counter(r["status"] for r in rows) == Counter(
        {s: sum(1 for i in range(800) if i % 3 == n) for n, s in enumerate(("NEW", "PAID", "SHIPPED"))}
    )
    assert {r["ts"] for r in rows} == {when(i) for i in range(60)}
    assert all(r["tags"] == ["x", str(r["id"] % 3)] and r["customer__address__city"] for r in rows)
