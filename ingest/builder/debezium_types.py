"""Debezium's semantic types, read as their columns mean them.

Debezium's connectors write a temporal or decimal column as a number or bytes whose meaning the
JSON converter's ``schema`` section names (``schemas.enable=true``): PostgreSQL's ``timestamp``
is an ``io.debezium.time.MicroTimestamp`` (microseconds since the epoch), MySQL's ``DATETIME``
an ``io.debezium.time.Timestamp`` (milliseconds), a ``date`` an ``io.debezium.time.Date`` (days),
a ``numeric(p,s)`` an ``org.apache.kafka.connect.data.Decimal`` (the unscaled value's big-endian
two's-complement bytes in base64, its scale in the schema's ``parameters``). Read as a plain
JSON value, each would be wrong (microseconds taken for seconds: year 47851) or refused.

So a Debezium source's ``date``, ``timestamp``, ``timestamp_ntz`` and ``decimal(p,s)`` columns
are parsed as text, and each value is converted by the semantic type the event's own schema
section names for that field of the row it carries (``after``, or ``before`` for a delete):

==========================================================  ==========================================
``io.debezium.time.Date``, ``org.apache.kafka.connect.data.Date``  days since 1970-01-01
``io.debezium.time.Timestamp``, ``...connect.data.Timestamp``      milliseconds since the epoch
``io.debezium.time.MicroTimestamp``                                microseconds since the epoch
``io.debezium.time.NanoTimestamp``                                 nanoseconds (to microseconds, floor)
``org.apache.kafka.connect.data.Decimal``                          base64 unscaled bytes, ``scale`` parameter
``io.debezium.data.VariableScaleDecimal``                          ``{"scale", "value"}``, the same bytes
anything else (``ZonedTimestamp``, no schema section)              the text as Spark casts it; an
                                                                   integral number: seconds (timestamps)
                                                                   or days (dates), as ``from_json`` reads
==========================================================  ==========================================

``timestamp_ntz`` columns take Debezium's local date-times as written (they are encoded as if
UTC). A value that converts to nothing is a ``type_mismatch`` reject. A decimal with more
places than the column's scale is rounded (half up), as a JSON number into it is.
"""

from __future__ import annotations

from typing import Any

from ingest.formats.types import Decimal, Scalar, parse_type

_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_MILLIS = ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")
_MICROS = "io.debezium.time.MicroTimestamp"
_NANOS = "io.debezium.time.NanoTimestamp"
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_INTEGRAL = r"^-?[0-9]+$"


def semantic_columns(columns: tuple[tuple[str, str], ...]) -> frozenset[str]:
    """The columns read as text and converted (:func:`converted`)."""
    out = set()
    for name, ctype in columns:
        parsed = parse_type(ctype)
        if isinstance(parsed, Decimal) or parsed in (Scalar("date"), Scalar("timestamp"), Scalar("timestamp_ntz")):
            out.add(name)
    return frozenset(out)


def schema_section_type() -> Any:
    """The part of the JSON converter's ``schema`` section the conversion reads: each field of
    the envelope (``before``, ``after``, ...) and each of its fields' semantic name and parameters."""
    from pyspark.sql import types as T

    column = T.StructType(
        [
            T.StructField("field", T.StringType()),
            T.StructField("name", T.StringType()),
            T.StructField("parameters", T.MapType(T.StringType(), T.StringType())),
        ]
    )
    part = T.StructType([T.StructField("field", T.StringType()), T.StructField("fields", T.ArrayType(column))])
    return T.StructType([T.StructField("fields", T.ArrayType(part))])


def field_schema(schema: Any, side: Any, name: str) -> Any:
    """The schema section's entry of field ``name`` of the row ``side`` names (null when absent)."""
    from pyspark.sql import functions as F

    part = F.try_element_at(F.filter(schema.getField("fields"), lambda p: p.getField("field") == side), F.lit(1))
    return F.try_element_at(F.filter(part.getField("fields"), lambda c: c.getField("field") == F.lit(name)), F.lit(1))


def converted(raw: Any, ctype: str, meta: Any) -> Any:
    """The column value of ``raw`` (the field's JSON text) by its semantic type (``meta``: its
    schema section entry, :func:`field_schema`)."""
    from pyspark.sql import functions as F

    parsed = parse_type(ctype)
    semantic = meta.getField("name")
    integral = raw.rlike(_INTEGRAL)
    number = raw.try_cast("long")
    if isinstance(parsed, Decimal):
        scale = meta.getField("parameters").getItem("scale").try_cast("int")
        variable = F.get_json_object(raw, "$.value"), F.get_json_object(raw, "$.scale").try_cast("int")
        return (
            F.when(semantic == F.lit(_DECIMAL), _decimal(raw, scale, ctype))
            .when(semantic == F.lit(_VARIABLE_DECIMAL), _decimal(variable[0], variable[1], ctype))
            .otherwise(raw.try_cast(ctype))
        )
    if parsed == Scalar("date"):
        days = F.date_from_unix_date(raw.try_cast("int"))
        return F.when(semantic.isin(*_DATES) | integral, days).otherwise(raw.try_cast("date"))
    # Exact: a nanosecond count is past double's 53 bits, so it is divided as a decimal.
    nanos_to_micros = F.floor(number.cast("decimal(20,0)") / F.lit(1000)).cast("long")
    instant = (
        F.when(semantic.isin(*_MILLIS), F.timestamp_millis(number))
        .when(semantic == F.lit(_MICROS), F.timestamp_micros(number))
        .when(semantic == F.lit(_NANOS), F.timestamp_micros(nanos_to_micros))
        .when(integral, F.timestamp_seconds(number))
        # ISO-8601 text (ZonedTimestamp, a bare event's strings), in the session's UTC.
        .otherwise(raw.try_cast("timestamp"))
    )
    return instant.cast(ctype)


def _decimal(b64: Any, scale: Any, ctype: str) -> Any:
    """A Kafka Connect decimal's value: ``b64``, the unscaled value's big-endian two's-complement
    bytes in base64; ``scale``, its scale. Summed byte by byte as a decimal(38,0) (of the
    magnitude: a negative value's bytes inverted, so nothing overflows below 10^38), then the
    point placed in its text and the text cast to the column type."""
    from pyspark.sql import functions as F

    data = F.unbase64(b64)
    negative = F.conv(F.hex(F.substring(data, 1, 1)), 16, 10).try_cast("int") >= F.lit(128)
    digits = F.aggregate(
        F.sequence(F.lit(1), F.length(data)),
        F.lit(0).cast("decimal(38,0)"),
        lambda acc, i: (
            acc * F.lit(256)
            + F.when(negative, F.lit(255) - _byte(data, i)).otherwise(_byte(data, i)).cast("decimal(38,0)")
        ).cast("decimal(38,0)"),
    )
    magnitude = F.when(negative, digits + F.lit(1)).otherwise(digits).cast("string")
    padded = F.lpad(magnitude, F.greatest(F.length(magnitude), scale + F.lit(1)), "0")
    point = F.length(padded) - scale
    text = F.when(scale <= F.lit(0), padded).otherwise(
        F.concat(F.substring(padded, F.lit(1), point), F.lit("."), F.substring(padded, point + F.lit(1), scale))
    )
    return F.when(
        F.length(data) > F.lit(0), F.concat(F.when(negative, F.lit("-")).otherwise(F.lit("")), text)
    ).try_cast(ctype)


def _byte(data: Any, i: Any) -> Any:
    from pyspark.sql import functions as F

    return F.conv(F.hex(F.substring(data, i, F.lit(1))), 16, 10).try_cast("int")
