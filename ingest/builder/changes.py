"""The rows of an upsert source (``[table] mode = "upsert"``, ingest.spec.table): each good row
is a change of the row its key names, said by its last column, ``_op`` (``OP_COLUMN``):
``u`` (the key's new state) or ``d`` (the key is deleted).

A null value (a Kafka tombstone) is a delete, not a ``null_value`` reject: its row is null but
for its key, read from the Kafka key (a key column that is a value column ``x`` takes the
decoded key's ``_key_x``), and its event time, which is the record's Kafka ``_timestamp`` (so
the row has an event time and a file partition). A tombstone whose key is then incomplete is a
``tombstone_without_key`` reject (under Debezium, a row that deletes nothing: its ``d`` event
came first); any other record without its key, a ``null_key`` reject.

``envelope = "debezium"`` (format json): the value is a Debezium change event, bare
(``{"before", "after", "op", ...}``) or as the JSON converter writes it with schemas
(``{"schema", "payload": {...}}``). Ops c, u and r upsert ``after``; op d deletes ``before``
(kept whole, though only its key matters: with PostgreSQL's default replica identity it holds
the key alone, and a delete without its event time takes the record's Kafka timestamp). A
truncate (op t) is a ``debezium_truncate`` reject: the upsert table is not emptied. Any other
op, or no row for its op, is an ``invalid_envelope`` reject. The spec's columns are the row's;
its temporal and decimal columns are read by the semantic types the JSON converter's
``schema`` section names (ingest.builder.debezium_types).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any

from ingest.builder.debezium_types import converted, field_schema, schema_section_type, semantic_columns
from ingest.formats.types import spark_type
from ingest.formats.wire import KAFKA_TIMESTAMP, KEY_COLUMN_PREFIX
from ingest.spec.model import SourceSpec
from ingest.spec.table import OP_DELETE, OP_UPSERT, Envelope

# The parsed Debezium event while the plan's expressions read it (never written).
ENVELOPE_COLUMN = "_e"
_UPSERT_OPS = ("c", "u", "r")
_DELETE_OP = "d"
_TRUNCATE_OP = "t"


@dataclass(frozen=True)
class UpsertRows:
    """An upsert plan's expressions: the error column, the schema's columns (aliased, in the
    spec's order), the event time (the file partition's input) and the change column."""

    error: Any
    columns: tuple[Any, ...]
    event_time: Any
    op: Any


def json_options(corrupt: str) -> dict[str, str]:
    """from_json's options for a record's value or key: PERMISSIVE (a value that does not parse
    is a reject, never a failed job), its text kept in ``corrupt``. A JSON string may be as long
    as the record holding it: Jackson's default cap (20,000,000 characters) would make a valid
    record with a longer string a ``type_mismatch``."""
    return {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt, "maxStringLen": str(2**31 - 1)}


def debezium_parse(
    columns: tuple[tuple[str, str], ...], corrupt: str, event_time: str
) -> tuple[Callable[[Any], Any], Any, Any]:
    """A Debezium JSON event: the step that parses it once into ``ENVELOPE_COLUMN`` (before
    the plan's expressions), the row its op names (``_p``, its temporal and decimal columns
    read by their semantic types: ingest.builder.debezium_types) and the value's error column.
    ``columns``: the spec's; ``corrupt``: the name from_json gives the text of a value that does
    not parse to it; ``event_time``: the row's event time (a delete's row, often its key only,
    takes the record's Kafka timestamp when it lacks one)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    semantic = semantic_columns(columns)
    row_type = T.StructType(
        [T.StructField(n, T.StringType() if n in semantic else spark_type(t), True) for n, t in columns]
    )
    change = [
        T.StructField("before", row_type, True),
        T.StructField("after", row_type, True),
        T.StructField("op", T.StringType(), True),
    ]
    schema = T.StructType(
        [
            *change,
            T.StructField("payload", T.StructType(change), True),
            T.StructField("schema", schema_section_type(), True),
            T.StructField(corrupt, T.StringType(), True),
        ]
    )
    text = F.col("_value").cast("string")
    options = json_options(corrupt)

    def decode(df: Any) -> Any:
        return df.withColumn(ENVELOPE_COLUMN, F.from_json(text, schema, options))

    op = debezium_field("op")
    side = F.when(op == F.lit(_DELETE_OP), F.lit("before")).otherwise(F.lit("after"))
    raw = F.when(op.isin(*_UPSERT_OPS), debezium_field("after")).when(op == F.lit(_DELETE_OP), debezium_field("before"))
    event = F.col(ENVELOPE_COLUMN)
    section = event.getField("schema")
    row = F.when(
        raw.isNotNull(),
        F.struct(
            *(
                (
                    converted(raw.getField(n), t, field_schema(section, side, n)) if n in semantic else raw.getField(n)
                ).alias(n)
                for n, t in columns
            )
        ),
    )
    malformed = event.getField(corrupt).isNotNull()
    unconverted = [raw.getField(n).isNotNull() & F.col("_p").getField(n).isNull() for n, _ in columns if n in semantic]
    missing_time = (
        F.lit(False)
        if event_time == KAFKA_TIMESTAMP
        else (op != F.lit(_DELETE_OP)) & F.col("_p").getField(event_time).isNull()
    )
    # A tombstone's reason (if any) is upsert_rows': an envelope is always an upsert source's.
    error = (
        F.when(~F.is_valid_utf8(F.col("_value")), F.lit("invalid_utf8"))
        # from_json gives a null struct (not a corrupt record) for blank input and `null`.
        .when(event.isNull(), F.lit("invalid_json"))
        .when(malformed & F.json_object_keys(text).isNull(), F.lit("invalid_json"))
        .when(malformed, F.lit("type_mismatch"))
        .when(op == F.lit(_TRUNCATE_OP), F.lit("debezium_truncate"))
        .when(op.isNull() | ~op.isin(*_UPSERT_OPS, _DELETE_OP), F.lit("invalid_envelope"))
        .when(raw.isNull(), F.lit("invalid_envelope"))
        .when(reduce(lambda a, b: a | b, unconverted, F.lit(False)), F.lit("type_mismatch"))
        .when(missing_time, F.lit("missing_event_time"))
    )
    return decode, row, error


def debezium_field(name: str) -> Any:
    """A field of the change event: the payload's when the event is wrapped, else its own."""
    from pyspark.sql import functions as F

    event = F.col(ENVELOPE_COLUMN)
    payload = event.getField("payload")
    return F.when(payload.isNotNull(), payload.getField(name)).otherwise(event.getField(name))


def upsert_rows(
    spec: SourceSpec, decoded_key: Mapping[str, Any], value_error: Any, key_error: Any | None
) -> UpsertRows:
    """The columns and error of an upsert source's rows. ``decoded_key``: the decoded key's
    output columns by name; ``value_error``: the value's reason (null: it parsed, with an event
    time); ``key_error``: the key's (None: keys are not decoded)."""
    from pyspark.sql import functions as F

    tombstone = F.col("_value").isNull()
    row = F.col("_p")
    types = dict(spec.schema)
    # A tombstone's value columns: its key's where the key decodes them, its Kafka timestamp
    # for the event time, else null.
    from_key = {
        name: decoded_key[KEY_COLUMN_PREFIX + name].cast(types[name])
        for name in spec.table.key
        if name in types and KEY_COLUMN_PREFIX + name in decoded_key
    }
    values = {}
    for name, _ in spec.schema:
        stand_in = from_key.get(name, F.col("_timestamp") if name == spec.event_time else None)
        values[name] = (
            row.getField(name) if stand_in is None else F.when(tombstone, stand_in).otherwise(row.getField(name))
        )

    if spec.table.envelope is Envelope.DEBEZIUM and spec.event_time in values:
        # A delete's row is often its key alone (PostgreSQL's REPLICA IDENTITY DEFAULT).
        at = values[spec.event_time]
        deleted = debezium_field("op") == F.lit(_DELETE_OP)
        values[spec.event_time] = F.when(deleted & at.isNull(), F.col(KAFKA_TIMESTAMP)).otherwise(at)

    def missing(key: list[Any]) -> Any:
        return reduce(lambda a, b: a | b, (F.lit(True) if k is None else k.isNull() for k in key))

    in_row = [decoded_key.get(name, row.getField(name)) for name in spec.table.key]
    in_tombstone = [decoded_key.get(name, from_key.get(name)) for name in spec.table.key]
    keys = () if key_error is None else (key_error,)
    # Under Debezium a tombstone only follows its key's ``d`` event (for Kafka's log compaction):
    # one whose key does not decode is kept as a row that deletes nothing (the merge skips a row
    # without its key), not a reject per delete.
    keyless = (
        F.lit(None).cast("string")
        if spec.table.envelope is Envelope.DEBEZIUM
        else F.when(missing(in_tombstone), F.lit("tombstone_without_key"))
    )
    error = F.when(tombstone, F.coalesce(*keys, keyless)).otherwise(
        F.coalesce(value_error, *keys, F.when(missing(in_row), F.lit("null_key")))
    )
    op = F.when(tombstone, F.lit(OP_DELETE))
    if spec.table.envelope is Envelope.DEBEZIUM:
        op = op.when(debezium_field("op") == F.lit(_DELETE_OP), F.lit(OP_DELETE))
    return UpsertRows(
        error=error,
        columns=tuple(values[name].alias(name) for name, _ in spec.schema),
        event_time=values.get(spec.event_time, F.col(KAFKA_TIMESTAMP)),
        op=op.otherwise(F.lit(OP_UPSERT)),
    )
