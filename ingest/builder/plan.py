"""What a build's Spark job does to a batch of splits, as data: the column expressions that
parse the values read from Kafka (ingest.builder.kafka_read: Kafka coordinates plus the raw key
and value bytes) against the source's schema (and the keys against its key schema), classify
each bad record's error, name the file partition of each good one and, for the registry's
formats, name the schema ids the batch's writers did not cover. Format protobuf decodes in a
Python step first (``mapInArrow``, ingest.formats.protobuf) and the expressions read its
columns.

A plan's expressions are unresolved, so one plan serves every batch of its (schema, event
time, file partition): making it costs hundreds of Py4J round trips (the builder caches it).
Every parse error a plan can give is one of ``PARSE_ERRORS``; the good rows keep the Kafka
coordinates (``META_COLUMNS``), then the decoded key's columns (``SourceSpec.key_columns``),
then the schema's columns; an upsert source's then ``_op``, its tombstones and Debezium
envelopes read as ingest.builder.changes says.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.builder.changes import ENVELOPE_COLUMN, debezium_parse, json_options, upsert_rows
from ingest.builder.kafka_read import SPLIT_COLUMN
from ingest.builder.value_checks import key_reason, value_reasons
from ingest.formats.avro import DECODED_FIELD, avro_reader_schema, decode_schemas
from ingest.formats.protobuf import REASON_COLUMN, ArrowDecode, ProtoFiles
from ingest.formats.types import spark_type
from ingest.formats.wire import HEADER_BYTES, KAFKA_TIMESTAMP, KEY_COLUMN_PREFIX, STRING_KEY_COLUMN
from ingest.spec.model import SourceSpec
from ingest.spec.table import OP_COLUMN, Envelope
from ingest_common.model import PartitionBy

CORRUPT = "_corrupt"
META_COLUMNS = ("_topic", "_partition", "_offset", KAFKA_TIMESTAMP, "_key")
# The read's columns as Spark types (the protobuf decode step's input schema).
READ_DDL = (
    "_topic string, _partition int, _offset bigint, _timestamp timestamp, _key binary, _value binary, "
    f"{SPLIT_COLUMN} int"
)


def event_time_column(spec: SourceSpec) -> Any:
    """A row's event time: the Kafka record's timestamp (``event_time = "_timestamp"``) or a
    column of the parsed value."""
    from pyspark.sql import functions as F

    if spec.event_time == KAFKA_TIMESTAMP:
        return F.col(KAFKA_TIMESTAMP)
    return F.col("_p").getField(spec.event_time)


@dataclass(frozen=True)
class Plan:
    """Spark column expressions of one build (unresolved, so reusable by every batch)."""

    read_columns: tuple[Any, ...]
    error: Any
    # Observing the row count also fences the optimizer: without it, the filter on
    # ``_error`` is pushed below the projection and from_json is inlined, parsing each
    # value four times instead of once.
    total: Any
    good: Any
    output_columns: tuple[Any, ...]
    # The spec's file_partition as a string column (None: files are not cut by event time).
    file_partition: Any | None
    # Applied to the read rows before the expressions (format protobuf: the decode step).
    decode: Callable[[Any], Any] | None = None
    # The registry's formats: the schema id of a value (key) whose id none of the batch's
    # writers has, else null; evaluated once ``_error`` is set (ingest.builder.accounting).
    unknown_ids: Any | None = None
    unknown_key_ids: Any | None = None


# A name no schema column can have (columns are letters, digits and "_"): the column exists only
# while Spark writes, as the directory level ``ingest-part=<value>``; files do not hold it.
FILE_PARTITION_COLUMN = "ingest-part"
_FILE_PARTITION_FORMATS = {
    PartitionBy.HOUR: "yyyy-MM-dd-HH",
    PartitionBy.DAY: "yyyy-MM-dd",
    PartitionBy.MONTH: "yyyy-MM",
    PartitionBy.YEAR: "yyyy",
}


def file_partition_value(event_time: Any, partition_by: PartitionBy) -> Any | None:
    """The directory value a row's file lies under, from its event-time column (None: files are
    not cut). The session's time zone is UTC (ingest.spark.session), as are Iceberg's transforms."""
    from pyspark.sql import functions as F

    if partition_by is PartitionBy.NONE:
        return None
    return F.date_format(event_time, _FILE_PARTITION_FORMATS[partition_by])


def _framing(column: str = "_value") -> tuple[Any, Any, Any]:
    """The Confluent wire format in Spark: whether a value (or key) is framed, its schema id, its body."""
    from pyspark.sql import functions as F

    value = F.col(column)
    framed = (F.length(value) >= HEADER_BYTES) & (F.substring(value, 1, 1) == F.lit(bytes([0])))
    schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
    body = F.expr(f"substring({column}, {HEADER_BYTES + 1}, length({column}) - {HEADER_BYTES})")
    return framed, schema_id, body


@dataclass(frozen=True)
class Writers:
    """The writer schemas a batch decodes with, fetched from the registry before the job:
    ``avro``, the Avro writer schema (JSON) of every value schema id the registry knows and
    the reader schema resolves; ``unresolvable``, the ids the registry knows whose writer the
    reader cannot resolve (``unresolvable_writer_schema``, never given to from_avro);
    ``keys``, the Avro writers of the keys (key_format avro); ``protobuf``, the Protobuf files
    of every value id (format protobuf). A framed record with any other id is
    ``unknown_schema_id``."""

    avro: Mapping[int, str] = field(default_factory=dict)
    unresolvable: frozenset[int] = frozenset()
    keys: Mapping[int, str] = field(default_factory=dict)
    protobuf: Mapping[int, ProtoFiles] = field(default_factory=dict)

    def ids(self) -> tuple[tuple[int, ...], ...]:
        return (tuple(self.avro), tuple(sorted(self.unresolvable)), tuple(self.keys), tuple(self.protobuf))


class PlanCache:
    """The column expressions of a build, made once per (format, key format, schema, event
    time, and for the registry's formats the batch's writer schemas): building them costs
    hundreds of Py4J round trips, which would otherwise be paid per batch and contend for the
    GIL with the consumer thread."""

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self._lock = threading.Lock()

    def get(self, spec: SourceSpec, writers: Writers) -> Plan:
        key = (
            spec.format,
            spec.registry,
            spec.schema,
            spec.event_time,
            spec.file_partition,
            spec.reader_schema,
            spec.key_format,
            spec.key_schema,
            spec.table.mode,
            spec.table.key,
            spec.table.envelope,
            writers.ids(),
        )
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = make_plan(spec, writers)
            return plan


def make_plan(spec: SourceSpec, writers: Writers | None = None) -> Plan:
    from dataclasses import replace

    from pyspark.sql import functions as F

    writers = writers or Writers()
    parsed_key, key_error, unknown_key = _key_parse(spec, writers.keys)
    if spec.format == "protobuf":
        plan = _protobuf_plan(spec, writers.protobuf, (parsed_key, key_error))
    elif spec.table.envelope is Envelope.DEBEZIUM:
        decode, parsed, error = debezium_parse(spec.schema, CORRUPT, spec.event_time)
        plan = _plan(spec, parsed, error, parsed_key, key_error)
        plan = replace(plan, read_columns=(*plan.read_columns, F.col(ENVELOPE_COLUMN)), decode=decode)
    else:
        parsed, error = (
            _avro_parse(spec, writers.avro, writers.unresolvable) if spec.format == "avro" else _json_parse(spec)
        )
        plan = _plan(spec, parsed, error, parsed_key, key_error)
    unknown = None
    if spec.format in ("avro", "protobuf"):
        _, schema_id, _ = _framing()
        unknown = F.when(F.col("_error") == F.lit("unknown_schema_id"), schema_id)
    return replace(plan, unknown_ids=unknown, unknown_key_ids=unknown_key)


def _protobuf_plan(spec: SourceSpec, files: Mapping[int, ProtoFiles], keys: tuple[Any | None, Any | None]) -> Plan:
    """Format protobuf: one ``mapInArrow`` step decodes every record of the batch, whatever
    its writer, into the spec's columns and ``_reason`` (null for a good record); the
    expressions then only read them."""
    from pyspark.sql import functions as F

    columns = ", ".join(f"`{name}` {ctype}" for name, ctype in spec.schema)
    output = f"{READ_DDL}, {columns}, {REASON_COLUMN} string"
    decode = ArrowDecode(tuple(sorted(files.items())), spec.schema, spec.event_time)
    parsed = F.struct(*(F.col(f"`{name}`") for name, _ in spec.schema))
    plan = _plan(spec, parsed, F.col(REASON_COLUMN), *keys)
    return Plan(
        read_columns=(*plan.read_columns, F.col(REASON_COLUMN)),
        error=plan.error,
        total=plan.total,
        good=plan.good,
        output_columns=plan.output_columns,
        file_partition=plan.file_partition,
        decode=lambda df: df.mapInArrow(decode, output),
    )


def _row_type(spec: SourceSpec) -> Any:
    """The spec's columns as a Spark struct (every field nullable)."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(name, spark_type(ctype), True) for name, ctype in spec.schema])


def _json_parse(spec: SourceSpec) -> tuple[Any, Any]:
    """The parsed struct of format json (json_schema: after the header) and the error column."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType([*_row_type(spec).fields, T.StructField(CORRUPT, T.StringType(), True)])
    value = F.col("_value")
    framed, _, body = _framing()
    if spec.format == "json_schema":
        value = body
    text = value.cast("string")
    parsed = F.from_json(text, schema, json_options(CORRUPT))
    event_time = event_time_column(spec)
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


def _avro_decode(
    column: str, columns: tuple[tuple[str, str], ...], reader_schema: str, writers: Mapping[int, str]
) -> tuple[Any, Any, Any, Any]:
    """One from_avro per writer schema of the batch, chosen by the record's schema id (one job
    for a batch of several writers), each resolved to the reader schema by Avro's rules.
    PERMISSIVE: a body that does not decode gives a row of nulls (DECODED_FIELD null too),
    never a failed job. Returns the decoded struct, whether the column is framed, its schema
    id and whether that id is one of ``writers``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.avro.functions import from_avro

    framed, schema_id, body = _framing(column)
    no_writer = F.lit(None).cast(
        T.StructType(
            [T.StructField(name, spark_type(ctype), True) for name, ctype in columns]
            + [T.StructField(DECODED_FIELD, T.BooleanType(), True)]
        )
    )
    parsed: Any = None
    for sid, writer in sorted(writers.items()):
        inlined, reader = decode_schemas(reader_schema, writer)
        decoded = from_avro(body, inlined, {"mode": "PERMISSIVE", "avroSchema": reader})
        parsed = (F.when if parsed is None else parsed.when)(framed & (schema_id == F.lit(sid)), decoded)
    known = schema_id.isin(*sorted(writers)) if writers else F.lit(False)
    return (no_writer if parsed is None else parsed), framed, schema_id, known


def _avro_parse(spec: SourceSpec, writers: Mapping[int, str], unresolvable: frozenset[int]) -> tuple[Any, Any]:
    """Format avro: the value decoded with its writer schema (:func:`_avro_decode`), and the error column."""
    from pyspark.sql import functions as F

    parsed, framed, schema_id, known = _avro_decode("_value", spec.schema, spec.reader_schema, writers)
    error = (
        F.when(F.col("_value").isNull(), F.lit("null_value"))
        .when(~framed, F.lit("not_confluent_framed"))
        .when(
            schema_id.isin(*sorted(unresolvable)) if unresolvable else F.lit(False), F.lit("unresolvable_writer_schema")
        )
        .when(~known, F.lit("unknown_schema_id"))
        .when(F.col("_p").isNull() | F.col("_p").getField(DECODED_FIELD).isNull(), F.lit("undecodable"))
        .when(event_time_column(spec).isNull(), F.lit("missing_event_time"))
        .otherwise(F.lit(None).cast("string"))
    )
    return parsed, error


#: Event times a segment can carry: those a Python datetime holds (years 1 to 9999, UTC). The
#: segment's event-time range is kept as datetimes (metastore, table, readers); one record
#: outside it would fail every build of its split, so it is a reject of its own instead.
EVENT_TIME_MIN_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
EVENT_TIME_END_US = 253_402_300_800_000_000  # 10000-01-01T00:00:00Z


def _key_parse(spec: SourceSpec, writers: Mapping[int, str]) -> tuple[Any | None, Any | None, Any | None]:
    """The decoded key struct (key_format avro and json_schema), the key's error column (None
    for binary keys) and, for key_format avro, the key's schema id when no writer has it (else
    null). A null key is no error: its decoded columns are null."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    key = F.col("_key")
    unknown = None
    if spec.key_format == "string":
        return None, F.when(key.isNotNull() & ~F.is_valid_utf8(key), F.lit("key_undecodable")), None
    if spec.key_format == "avro":
        reader = avro_reader_schema(spec.key_schema)
        parsed, framed, key_id, known = _avro_decode("_key", spec.key_schema, reader, writers)
        unknown = F.when(key.isNotNull() & framed & ~known, key_id)
        decoded = F.col("_k").isNotNull() & F.col("_k").getField(DECODED_FIELD).isNotNull()
    elif spec.key_format == "json_schema":
        # As json_schema values: the JSON path on the body, the schema id not looked up.
        framed, _, body = _framing("_key")
        schema = T.StructType(
            [T.StructField(name, spark_type(ctype), True) for name, ctype in spec.key_schema]
            + [T.StructField(CORRUPT, T.StringType(), True)]
        )
        parsed = F.from_json(body.cast("string"), schema, json_options(CORRUPT))
        known = F.lit(True)
        decoded = F.is_valid_utf8(body) & F.col("_k").isNotNull() & F.col("_k").getField(CORRUPT).isNull()
    else:
        return None, None, None
    error = (
        F.when(key.isNull(), F.lit(None).cast("string"))
        .when(~framed, F.lit("key_not_confluent_framed"))
        .when(~known, F.lit("key_unknown_schema_id"))
        .when(~decoded, F.lit("key_undecodable"))
    )
    return parsed, error, unknown


def _decoded_key(spec: SourceSpec) -> dict[str, Any]:
    """The decoded key's output columns by name (``SourceSpec.key_columns``), unaliased."""
    from pyspark.sql import functions as F

    if spec.key_format == "string":
        return {STRING_KEY_COLUMN: F.col("_key").cast("string")}
    return {KEY_COLUMN_PREFIX + name: F.col("_k").getField(name) for name, _ in spec.key_schema}


def _plan(spec: SourceSpec, parsed: Any, error: Any, parsed_key: Any | None, key_error: Any | None) -> Plan:
    from pyspark.sql import functions as F

    event_us = F.unix_micros(event_time_column(spec))
    # The parse's reason, else one for an event time out of range: ``error`` appears once, so
    # it is evaluated once per record (a CASE that tested it and then returned it ran it twice).
    out_of_range = (event_us < F.lit(EVENT_TIME_MIN_US)) | (event_us >= F.lit(EVENT_TIME_END_US))
    # Then values no segment may carry (ingest.builder.value_checks): not UTF-8, out of range.
    error = F.coalesce(error, F.when(out_of_range, F.lit("event_time_out_of_range")), *value_reasons(spec))
    key_error = key_reason(spec, key_error)
    decoded_key = _decoded_key(spec)
    if spec.table.upsert:
        rows = upsert_rows(spec, decoded_key, error, key_error)
        error, columns, event_time = rows.error, (*rows.columns, rows.op.alias(OP_COLUMN)), rows.event_time
    else:
        # A record's value is checked first: its reason wins over its key's.
        error = error if key_error is None else F.coalesce(error, key_error)
        columns = tuple(F.col("_p").getField(name).alias(name) for name, _ in spec.schema)
        event_time = event_time_column(spec)
    return Plan(
        read_columns=(
            *(F.col(c) for c in META_COLUMNS),
            F.col("_value"),
            parsed.alias("_p"),
            *(() if parsed_key is None else (parsed_key.alias("_k"),)),
        ),
        error=error,
        total=F.count(F.lit(1)).alias("total"),
        good=F.col("_error").isNull(),
        output_columns=(
            *(F.col(c) for c in META_COLUMNS),
            *(column.alias(name) for name, column in decoded_key.items()),
            *columns,
        ),
        file_partition=file_partition_value(event_time, spec.file_partition),
    )
