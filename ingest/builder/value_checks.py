"""Values a segment must not carry, each a reject of its own record: a string that is not UTF-8
(``invalid_utf8``) and a timestamp or date outside years 1-9999 (``timestamp_out_of_range``; the
event time has its own reason, ``event_time_out_of_range``), at any depth of a column (array
elements, map keys and values, struct fields). Spark holds both without complaint, but the
segment's readers do not: pyiceberg reads each file's column statistics as Python strings and
datetimes when the committer appends it, and fails on such a value, for good (so do Python
readers of the files). One such record would stop its segment from ever reaching the table.

Which values can hold them, by format: from_avro copies an Avro string's (or bytes read as a
string's) bytes into Spark without checking them, so Avro values' and keys' strings are checked;
a JSON value is checked as UTF-8 whole before it is parsed (``invalid_utf8``), and from_json
gives no invalid string from valid UTF-8 text (an escaped lone surrogate, ``"\\ud800"``, reads as
``?``), so JSON strings are not checked again; Protobuf strings come from Python strings. Any
format's timestamps and dates can be out of range: a JSON number of seconds or a ``+10000-01-01``
text, an Avro ``timestamp-millis`` or ``date`` of any size.

The checks read the parsed columns (``_p``, ``_k``), never the value again: a few comparisons of
each timestamp, one UTF-8 scan of each Avro string, only for records with no other reason (they
come last in the ``coalesce`` of reasons).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from ingest.formats.types import spark_type
from ingest.spec.model import SourceSpec

INVALID_UTF8 = "invalid_utf8"
TIMESTAMP_OUT_OF_RANGE = "timestamp_out_of_range"
KEY_UNDECODABLE = "key_undecodable"

# Years 1 to 9999 (UTC), what a Python datetime or date holds.
_MIN_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
_END_US = 253_402_300_800_000_000  # 10000-01-01T00:00:00Z


@dataclass(frozen=True)
class _Check:
    """Which values are checked (by their Spark type) and the test of one (true: bad)."""

    holds: Callable[[Any], bool]
    bad: Callable[[Any, Any], Any]


def value_reasons(spec: SourceSpec) -> tuple[Any, ...]:
    """The reason of a record whose parsed value (``_p``) holds a value no segment may carry:
    at most one expression (string, null when there is none), for the plan's ``coalesce`` of
    reasons after the parse's and the event time's."""
    from pyspark.sql import functions as F

    row = F.col("_p")
    # The event time has its own check and reason.
    columns = [(row.getField(name), spark_type(ctype)) for name, ctype in spec.schema if name != spec.event_time]
    return _reason(columns, strings=spec.format == "avro", text=INVALID_UTF8, time=TIMESTAMP_OUT_OF_RANGE)


def key_reason(spec: SourceSpec, key_error: Any | None) -> Any | None:
    """``key_error`` (the decoded key's reason), else ``key_undecodable`` for a decoded key
    (``_k``: key_format avro and json_schema) holding such a value."""
    from pyspark.sql import functions as F

    if key_error is None or spec.key_format not in ("avro", "json_schema"):
        return key_error
    key = F.col("_k")
    columns = [(key.getField(name), spark_type(ctype)) for name, ctype in spec.key_schema]
    reason = _reason(columns, strings=spec.key_format == "avro", text=KEY_UNDECODABLE, time=KEY_UNDECODABLE)
    return F.coalesce(key_error, *reason) if reason else key_error


def _reason(columns: Sequence[tuple[Any, Any]], *, strings: bool, text: str, time: str) -> tuple[Any, ...]:
    from pyspark.sql import functions as F

    checks = [(_NOT_UTF8, text)] if strings else []
    checks.append((_OUT_OF_RANGE, time))
    reason: Any = None
    for check, name in checks:
        bad = [b for column, dtype in columns if (b := _any(column, dtype, check)) is not None]
        if bad:
            test = reduce(lambda a, b: a | b, bad)
            reason = (F.when if reason is None else reason.when)(test, F.lit(name))
    return () if reason is None else (reason,)


def _is_string(dtype: Any) -> bool:
    from pyspark.sql import types as T

    return isinstance(dtype, T.StringType)


def _not_utf8(column: Any, _dtype: Any) -> Any:
    from pyspark.sql import functions as F

    return ~F.is_valid_utf8(column)


def _is_time(dtype: Any) -> bool:
    from pyspark.sql import types as T

    return isinstance(dtype, (T.TimestampType, T.TimestampNTZType, T.DateType))


def _out_of_range(column: Any, dtype: Any) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.TimestampType):
        micros = F.unix_micros(column)
        return (micros < F.lit(_MIN_US)) | (micros >= F.lit(_END_US))
    if isinstance(dtype, T.TimestampNTZType):
        low, high = F.lit("0001-01-01 00:00:00"), F.lit("9999-12-31 23:59:59.999999")
        return (column < low.cast("timestamp_ntz")) | (column > high.cast("timestamp_ntz"))
    return (column < F.lit("0001-01-01").cast("date")) | (column > F.lit("9999-12-31").cast("date"))


_NOT_UTF8 = _Check(_is_string, _not_utf8)
_OUT_OF_RANGE = _Check(_is_time, _out_of_range)


def _any(column: Any, dtype: Any, check: _Check) -> Any | None:
    """True when ``check`` finds a bad value anywhere in ``column`` (null when it finds none
    and some are null: either way no reason); None when no part of ``dtype`` is checked."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if check.holds(dtype):
        return check.bad(column, dtype)
    parts: list[Any] = []
    if isinstance(dtype, T.ArrayType):
        parts = _within(column, dtype.elementType, check)
    elif isinstance(dtype, T.MapType):
        parts = _within(F.map_keys(column), dtype.keyType, check) + _within(
            F.map_values(column), dtype.valueType, check
        )
    elif isinstance(dtype, T.StructType):
        parts = [p for f in dtype.fields if (p := _any(column.getField(f.name), f.dataType, check)) is not None]
    return reduce(lambda a, b: a | b, parts) if parts else None


def _within(array: Any, element: Any, check: _Check) -> list[Any]:
    """[whether an element of ``array`` is bad], or [] when no part of ``element`` is checked."""
    from pyspark.sql import functions as F

    if not _checked(element, check):
        return []

    def bad(x: Any) -> Any:
        return _any(x, element, check)

    return [F.exists(array, bad)]


def _checked(dtype: Any, check: _Check) -> bool:
    from pyspark.sql import types as T

    if check.holds(dtype):
        return True
    if isinstance(dtype, T.ArrayType):
        return _checked(dtype.elementType, check)
    if isinstance(dtype, T.MapType):
        return _checked(dtype.keyType, check) or _checked(dtype.valueType, check)
    if isinstance(dtype, T.StructType):
        return any(_checked(f.dataType, check) for f in dtype.fields)
    return False
