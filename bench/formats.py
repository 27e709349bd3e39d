"""What decoding costs per format: the same records as JSON, Avro and Protobuf (the Confluent
wire format for the two last, their schemas in a local schema registry), each built by the
worker's own ``SparkSegmentBuilder.build_batch`` in one Spark session: ``from_json``,
``from_avro`` with each writer schema, and the Protobuf decoder in ``mapInArrow``.

No broker and no metastore: the benchmark's records (``bench.data``) are made in memory,
encoded with confluent-kafka's serializers, dealt into ``--splits`` splits and built as one
batch per round. Rounds go through the formats in turn, so drift of the machine hits them
alike; each format is built once before the rounds (the JVM's and the Python workers'
warm-up), and the figure is the median of the rounds.

    python -m bench.formats [--records 200000] [--splits 4] [--rounds 3] [--master local[2]]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.data import EVENT_TIME, SCHEMA, record_value
from bench.floor import _measure, _splits, _TempDirBuilds
from ingest.builder.job import SparkSegmentBuilder
from ingest.logs import configure_logging
from ingest.spark.session import create_session
from ingest.spec import SourceSpec, spec_from_dict
from ingest_common.model import BuiltSegment
from ingest_dev.registry import client as registry_client

FORMATS = ("json", "avro", "protobuf")
TOPIC = "bench-formats"

# The benchmark's schema as an Avro record and as a Protobuf message (same fields, same order).
_AVRO_TYPES = {"long": "long", "string": "string", "double": "double"}


def _avro_schema() -> str:
    fields: list[dict[str, Any]] = []
    for name, ctype in SCHEMA.items():
        if ctype == "timestamp":
            avro: Any = {"type": "long", "logicalType": "timestamp-millis"}
        elif ctype.startswith("array<"):
            avro = {"type": "array", "items": _AVRO_TYPES[ctype[6:-1]]}
        else:
            avro = _AVRO_TYPES[ctype]
        fields.append({"name": name, "type": avro})
    return json.dumps({"type": "record", "name": "BenchRecord", "namespace": "bench", "fields": fields})


def _protobuf_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    f = descriptor_pb2.FieldDescriptorProto
    scalar = {"long": f.TYPE_INT64, "string": f.TYPE_STRING, "double": f.TYPE_DOUBLE}
    file = descriptor_pb2.FileDescriptorProto(name="bench/record.proto", package="bench", syntax="proto3")
    file.dependency.append("google/protobuf/timestamp.proto")
    message = file.message_type.add(name="BenchRecord")
    for number, (name, ctype) in enumerate(SCHEMA.items(), start=1):
        field = message.field.add(name=name, number=number, label=f.LABEL_OPTIONAL)
        if ctype == "timestamp":
            field.type, field.type_name = f.TYPE_MESSAGE, ".google.protobuf.Timestamp"
        elif ctype.startswith("array<"):
            field.type, field.label = scalar[ctype[6:-1]], f.LABEL_REPEATED
        else:
            field.type = scalar[ctype]
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.BenchRecord"))


def encode(fmt: str, registry_url: str, records: int) -> list[bytes]:
    """The benchmark's first ``records`` records in a format (Avro and Protobuf framed, their
    schemas registered in the registry)."""
    docs = [json.loads(record_value(i)) for i in range(records)]
    if fmt == "json":
        return [record_value(i) for i in range(records)]
    from confluent_kafka.serialization import MessageField, SerializationContext

    # A timeout, so that a lost reply is retried (the client's default retries) instead of
    # waiting forever: seen once under load, a reply Apicurio logged as sent never arrived.
    client = registry_client(registry_url)
    ctx = SerializationContext(TOPIC + "-" + fmt, MessageField.VALUE)
    for doc in docs:
        doc[EVENT_TIME] = datetime.fromisoformat(doc[EVENT_TIME]).astimezone(UTC)
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        avro = AvroSerializer(client, _avro_schema(), conf={"auto.register.schemas": True})
        return [bytes(avro(doc, ctx) or b"") for doc in docs]
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    cls = _protobuf_class()
    protobuf = ProtobufSerializer(cls, client, {"auto.register.schemas": True})
    out = []
    for doc in docs:
        when = doc.pop(EVENT_TIME)
        msg = cls(**doc)
        getattr(msg, EVENT_TIME).FromDatetime(when)
        out.append(bytes(protobuf(msg, ctx) or b""))
    return out


def _spec(fmt: str, store: Path, registry_url: str) -> SourceSpec:
    doc: dict[str, Any] = {
        "name": f"formats-{fmt.replace('_', '-')}",
        "topics": [TOPIC],
        "event_time": EVENT_TIME,
        "segment_store": "file://" + str(store),
        "schema": dict(SCHEMA),
        "format": fmt,
    }
    if fmt != "json":
        doc["registry"] = {"url": registry_url}
    return spec_from_dict(doc)


def run(records: int, splits: int, rounds: int, master: str, registry_url: str) -> dict[str, Any]:
    values = {fmt: encode(fmt, registry_url, records) for fmt in FORMATS}
    work = Path(tempfile.mkdtemp(prefix="ingest_formats_"))
    runs: dict[str, list[dict[str, float]]] = {fmt: [] for fmt in FORMATS}
    try:
        spark = create_session(master, "bench-formats", connectors=True)
        try:
            builder = SparkSegmentBuilder(spark, _TempDirBuilds())
            builds: dict[str, Callable[[], None]] = {}
            for fmt in FORMATS:
                builds[fmt] = _builder(builder, _spec(fmt, work / fmt, registry_url), values[fmt], splits)
                builds[fmt]()  # warm-up: the JVM's code paths, the Python workers, the writer schemas
            for _ in range(rounds):
                for fmt in FORMATS:
                    runs[fmt].append(_measure(records, builds[fmt]))
        finally:
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sizes = {fmt: sum(map(len, vs)) / len(vs) for fmt, vs in values.items()}
    config = {"records": records, "splits": splits, "rounds": rounds, "master": master}
    return {"config": config, "bytes_per_record": sizes, "runs": runs}


def _builder(builder: SparkSegmentBuilder, spec: SourceSpec, values: list[bytes], splits: int) -> Callable[[], None]:
    batch = _splits(values, splits)

    def build() -> None:
        rows = 0
        for result in builder.build_batch(batch, spec):
            if not isinstance(result, BuiltSegment):
                raise result
            rows += result.row_count
            if result.rejects_count:
                raise RuntimeError(f"{spec.format}: {result.rejects_count} rejects: {result.parse_errors}")
            builder.discard(result)
        if rows != len(values):
            raise RuntimeError(f"{spec.format}: built {rows} rows of {len(values)}")

    return build


def report(result: dict[str, Any]) -> str:
    lines = [f"{'format':<10} {'bytes/rec':>9} {'rec/s (median)':>15} {'CPU s/M':>8} {'JVM':>6} {'Python':>7}"]
    for fmt, runs in result["runs"].items():
        lines.append(
            f"{fmt:<10} {result['bytes_per_record'][fmt]:>9.0f} "
            f"{statistics.median(r['records_per_s'] for r in runs):>15,.0f} "
            f"{statistics.median(r['cpu_s_per_million'] for r in runs):>8.1f} "
            f"{statistics.median(r['jvm_cpu_s_per_million'] for r in runs):>6.1f} "
            f"{statistics.median(r['python_cpu_s_per_million'] for r in runs):>7.1f}"
        )
    cfg = result["config"]
    lines.append(
        f"{cfg['records']:,} records in {cfg['splits']} splits, {cfg['rounds']} rounds after one warm-up build "
        f"each, {cfg['master']}; the Python column is this process (staging), the Protobuf decode runs in "
        "Spark's Python workers (children: the JVM column)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.formats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--splits", type=int, default=4, help="splits of the batch (the benchmark's partitions)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--registry-url", help="a Confluent-compatible registry (default: a local Apicurio)")
    parser.add_argument("--out", type=Path, help="write the runs as JSON here")
    args = parser.parse_args(argv)
    configure_logging(level=logging.WARNING)
    if args.registry_url:
        result = run(args.records, args.splits, args.rounds, args.master, args.registry_url)
    else:
        from ingest_dev.registry import LocalSchemaRegistry

        with LocalSchemaRegistry() as registry:
            result = run(args.records, args.splits, args.rounds, args.master, registry.url)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
