"""What a build's Spark job does to a batch of splits, as data: the layout of the staged files
(one per split: Kafka coordinates plus the raw key and value bytes) and the column expressions
that parse the values against the source's schema, classify each bad record's error and name
the file partition of each good one. Format protobuf decodes in a Python step first
(``mapInArrow``, ingest.build.protobuf_decode) and the expressions read its columns.

A plan's expressions are unresolved, so one plan serves every batch of its (schema, event
time, file partition): making it costs hundreds of Py4J round trips (the builder caches it).
Every parse error a plan can give is one of ``PARSE_ERRORS``; the good rows keep the staged
coordinates (``META_COLUMNS``) beside the schema's columns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ingest.build.protobuf_decode import REASON_COLUMN, ArrowDecode, ProtoFiles
from ingest.build.split import SealedSplit
from ingest.formats import DECODED_FIELD, HEADER_BYTES, reader_for_writer
from ingest.spec import SourceSpec
from ingest_common.model import PartitionBy

CORRUPT = "_corrupt"
META_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp", "_key")
STAGED_SCHEMA = pa.schema(
    [
        ("_topic", pa.string()),
        ("_partition", pa.int32()),
        ("_offset", pa.int64()),
        ("_timestamp", pa.timestamp("ms", tz="UTC")),
        ("_key", pa.binary()),
        ("_value", pa.binary()),
    ]
)
STAGED_DDL = "_topic string, _partition int, _offset bigint, _timestamp timestamp, _key binary, _value binary"


def stage_records(split: SealedSplit) -> pa.Table:
    records = split.records
    n = len(records)
    # Kind 0 is TIMESTAMP_NOT_AVAILABLE.
    timestamps = [ms if kind else None for kind, ms in (r.timestamp() for r in records)]
    return pa.table(
        [
            pa.repeat(pa.scalar(split.tp.topic, pa.string()), n),
            pa.repeat(pa.scalar(split.tp.partition, pa.int32()), n),
            pa.array([r.offset() for r in records], pa.int64()),
            pa.array(timestamps, pa.timestamp("ms", tz="UTC")),
            pa.array([r.key() for r in records], pa.binary()),
            pa.array([r.value() for r in records], pa.binary()),
        ],
        schema=STAGED_SCHEMA,
    )


def spark_type(name: str) -> Any:
    from pyspark.sql import types as T

    scalars = {
        "string": T.StringType(),
        "long": T.LongType(),
        "int": T.IntegerType(),
        "double": T.DoubleType(),
        "float": T.FloatType(),
        "boolean": T.BooleanType(),
        "timestamp": T.TimestampType(),
        "date": T.DateType(),
    }
    if name.startswith("array<") and name.endswith(">"):
        return T.ArrayType(scalars[name[6:-1]])
    return scalars[name]


@dataclass(frozen=True)
class Plan:
    """Spark column expressions of one build (unresolved, so reusable by every batch)."""

    staged_columns: tuple[Any, ...]
    error: Any
    # Observing the row count also fences the optimizer: without it, the filter on
    # ``_error`` is pushed below the projection and from_json is inlined, parsing each
    # value four times instead of once.
    total: Any
    good: Any
    output_columns: tuple[Any, ...]
    # The spec's file_partition as a string column (None: files are not cut by event time).
    file_partition: Any | None
    # Applied to the staged rows before the expressions (format protobuf: the decode step).
    decode: Callable[[Any], Any] | None = None


# A name no schema column can have (columns are letters, digits and "_"): the column exists only
# while Spark writes, as the directory level ``ingest-part=<value>``; files do not hold it.
FILE_PARTITION_COLUMN = "ingest-part"
_FILE_PARTITION_FORMATS = {
    PartitionBy.HOUR: "yyyy-MM-dd-HH",
    PartitionBy.DAY: "yyyy-MM-dd",
    PartitionBy.MONTH: "yyyy-MM",
    PartitionBy.YEAR: "yyyy",
}


def _framing() -> tuple[Any, Any, Any]:
    """The Confluent wire format in Spark: whether a value is framed, its schema id, its body."""
    from pyspark.sql import functions as F

    value = F.col("_value")
    framed = (F.length(value) >= HEADER_BYTES) & (F.substring(value, 1, 1) == F.lit(bytes([0])))
    schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
    body = F.expr(f"substring(_value, {HEADER_BYTES + 1}, length(_value) - {HEADER_BYTES})")
    return framed, schema_id, body


def make_plan(
    spec: SourceSpec, writers: Mapping[int, str] | None = None, proto_files: Mapping[int, ProtoFiles] | None = None
) -> Plan:
    """``writers``: for format avro, the writer schema (Avro JSON) of every schema id the batch
    holds that the registry knows; ``proto_files`` the same for format protobuf. A framed
    record with any other id is ``unknown_schema_id``."""
    if spec.format == "avro":
        return _plan(spec, *_avro_parse(spec, writers or {}))
    if spec.format == "protobuf":
        return _protobuf_plan(spec, proto_files or {})
    return _plan(spec, *_json_parse(spec))


def _protobuf_plan(spec: SourceSpec, files: Mapping[int, ProtoFiles]) -> Plan:
    """Format protobuf: one ``mapInArrow`` step decodes every record of the batch, whatever
    its writer, into the spec's columns and ``_reason`` (null for a good record); the
    expressions then only read them."""
    from pyspark.sql import functions as F

    columns = ", ".join(f"`{name}` {ctype}" for name, ctype in spec.schema)
    output = f"{STAGED_DDL}, {columns}, {REASON_COLUMN} string"
    decode = ArrowDecode(tuple(sorted(files.items())), spec.schema, spec.event_time)
    parsed = F.struct(*(F.col(f"`{name}`") for name, _ in spec.schema))
    plan = _plan(spec, parsed, F.col(REASON_COLUMN))
    return Plan(
        staged_columns=(*plan.staged_columns, F.col(REASON_COLUMN)),
        error=plan.error,
        total=plan.total,
        good=plan.good,
        output_columns=plan.output_columns,
        file_partition=plan.file_partition,
        decode=lambda df: df.mapInArrow(decode, output),
    )


def _json_parse(spec: SourceSpec) -> tuple[Any, Any]:
    """The parsed struct of format json (json_schema: after the header) and the error column."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType(
        [T.StructField(name, spark_type(ctype), True) for name, ctype in spec.schema]
        + [T.StructField(CORRUPT, T.StringType(), True)]
    )
    value = F.col("_value")
    framed, _, body = _framing()
    if spec.format == "json_schema":
        value = body
    text = value.cast("string")
    parsed = F.from_json(text, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    event_time = F.col("_p").getField(spec.event_time)
    corrupt = F.col("_p").getField(CORRUPT)
    # Cheap checks first; the second parse (json_object_keys) runs for bad rows only.
    error = F.when(F.col("_value").isNull(), F.lit("null_value"))
    if spec.format == "json_schema":
        error = error.when(~framed, F.lit("not_confluent_framed"))
    error = (
        error.when(~F.is_valid_utf8(value), F.lit("invalid_utf8"))
        # from_json gives a null struct (not a corrupt record) for blank input and `null`.
        .when(F.col("_p").isNull(), F.lit("invalid_json"))
        .when(corrupt.isNull() & event_time.isNotNull(), F.lit(None).cast("string"))
        .when(corrupt.isNull(), F.lit("missing_event_time"))
        .when(F.json_object_keys(text).isNull(), F.lit("invalid_json"))
        .otherwise(F.lit("type_mismatch"))
    )
    return parsed, error


def _avro_parse(spec: SourceSpec, writers: Mapping[int, str]) -> tuple[Any, Any]:
    """Format avro: one from_avro per writer schema of the batch, chosen by the record's schema
    id (one job for a batch of several writers), each resolved to the reader schema by Avro's
    rules. PERMISSIVE: a body that does not decode gives a row of nulls (DECODED_FIELD null
    too), never a failed job."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.avro.functions import from_avro

    framed, schema_id, body = _framing()
    from_spec = spec.schema_from == "spec"
    no_writer = F.lit(None).cast(
        T.StructType(
            [T.StructField(name, spark_type(ctype), True) for name, ctype in spec.schema]
            + [T.StructField(DECODED_FIELD, T.BooleanType(), True)]
        )
    )
    parsed: Any = None
    for sid, writer in sorted(writers.items()):
        reader = reader_for_writer(spec.reader_schema, writer, from_spec)
        decoded = from_avro(body, writer, {"mode": "PERMISSIVE", "avroSchema": reader})
        parsed = (F.when if parsed is None else parsed.when)(framed & (schema_id == F.lit(sid)), decoded)
    parsed = no_writer if parsed is None else parsed
    known = schema_id.isin(*sorted(writers)) if writers else F.lit(False)
    error = (
        F.when(F.col("_value").isNull(), F.lit("null_value"))
        .when(~framed, F.lit("not_confluent_framed"))
        .when(~known, F.lit("unknown_schema_id"))
        .when(F.col("_p").isNull() | F.col("_p").getField(DECODED_FIELD).isNull(), F.lit("undecodable"))
        .when(F.col("_p").getField(spec.event_time).isNull(), F.lit("missing_event_time"))
        .otherwise(F.lit(None).cast("string"))
    )
    return parsed, error


def _plan(spec: SourceSpec, parsed: Any, error: Any) -> Plan:
    from pyspark.sql import functions as F

    value = F.col("_value")
    return Plan(
        staged_columns=(*(F.col(c) for c in META_COLUMNS), value, parsed.alias("_p")),
        error=error,
        total=F.count(F.lit(1)).alias("total"),
        good=F.col("_error").isNull(),
        output_columns=(
            *(F.col(c) for c in META_COLUMNS),
            *(F.col("_p").getField(name).alias(name) for name, _ in spec.schema),
        ),
        file_partition=(
            None
            if spec.file_partition is PartitionBy.NONE
            # The session's time zone is UTC (ingest.build.spark), as are Iceberg's transforms.
            else F.date_format(F.col("_p").getField(spec.event_time), _FILE_PARTITION_FORMATS[spec.file_partition])
        ),
    )
