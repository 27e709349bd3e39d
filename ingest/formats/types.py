"""Column types: the type language of a spec's ``[schema]`` and ``[key_schema]``, parsed,
checked and rendered for every place a column type is used.

The language is Spark's DDL for data types, lower case (what ``DataType.simpleString`` prints),
so a type reads the same in a spec, in Spark and in the docs::

    string  long  int  double  float  boolean  binary  date
    timestamp       instant, UTC (Iceberg timestamptz)
    timestamp_ntz   wall-clock time without a zone (Iceberg timestamp)
    decimal(p,s)    1 <= p <= 38, 0 <= s <= p
    array<T>  map<K,V>  struct<name:T,...>      any depth

A type is stored in its canonical text (:func:`canonical`): a spec's JSON form round-trips it.
Every column is nullable at every depth (a field a writer lacks, or a null in JSON, reads null).
No Spark here: :func:`spark_type` imports pyspark's type classes only (no JVM).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ingest.errors import ConfigError

#: Scalar types and what they hold; the keys are the type names of the language.
SCALARS = (
    "string",
    "long",
    "int",
    "double",
    "float",
    "boolean",
    "binary",
    "date",
    "timestamp",
    "timestamp_ntz",
)
MAX_DEPTH = 32
MAX_DECIMAL_PRECISION = 38
_FIELD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_TOKEN_RE = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(\d+)|([<>(),:]))")


@dataclass(frozen=True, slots=True)
class Scalar:
    name: str


@dataclass(frozen=True, slots=True)
class Decimal:
    precision: int
    scale: int


@dataclass(frozen=True, slots=True)
class Array:
    element: ColumnType


@dataclass(frozen=True, slots=True)
class Map:
    key: ColumnType
    value: ColumnType


@dataclass(frozen=True, slots=True)
class Struct:
    fields: tuple[tuple[str, ColumnType], ...]


ColumnType = Scalar | Decimal | Array | Map | Struct


def canonical(ctype: ColumnType) -> str:
    """The type's one spelling (lower case, no spaces), as specs store it."""
    if isinstance(ctype, Scalar):
        return ctype.name
    if isinstance(ctype, Decimal):
        return f"decimal({ctype.precision},{ctype.scale})"
    if isinstance(ctype, Array):
        return f"array<{canonical(ctype.element)}>"
    if isinstance(ctype, Map):
        return f"map<{canonical(ctype.key)},{canonical(ctype.value)}>"
    return "struct<" + ",".join(f"{name}:{canonical(t)}" for name, t in ctype.fields) + ">"


class _Tokens:
    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text.rstrip()):
            match = _TOKEN_RE.match(text, pos)
            if match is None:
                raise ValueError(f"unexpected {text[pos:].strip()[:20]!r}")
            self.tokens.append(match.group(match.lastindex or 0))
            pos = match.end()
        self.pos = 0

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if not token or (expected is not None and token != expected):
            raise ValueError(f"expected {expected or 'a type'}, found {token or 'the end'}")
        self.pos += 1
        return token


def _parse(tokens: _Tokens, depth: int) -> ColumnType:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    word = tokens.take().lower()
    if word in SCALARS:
        return Scalar(word)
    if word == "bigint":
        return Scalar("long")
    if word == "integer":
        return Scalar("int")
    if word == "decimal":
        if tokens.peek() != "(":
            raise ValueError("decimal needs its precision and scale: decimal(p,s)")
        tokens.take("(")
        precision, scale = int(tokens.take()), 0
        if tokens.peek() == ",":
            tokens.take(",")
            scale = int(tokens.take())
        tokens.take(")")
        if not (1 <= precision <= MAX_DECIMAL_PRECISION and 0 <= scale <= precision):
            raise ValueError(f"decimal({precision},{scale}): needs 1 <= precision <= 38 and 0 <= scale <= precision")
        return Decimal(precision, scale)
    if word == "array":
        tokens.take("<")
        element = _parse(tokens, depth + 1)
        tokens.take(">")
        return Array(element)
    if word == "map":
        tokens.take("<")
        key = _parse(tokens, depth + 1)
        tokens.take(",")
        value = _parse(tokens, depth + 1)
        tokens.take(">")
        if not isinstance(key, Scalar | Decimal):
            raise ValueError(f"map keys must be a scalar type, not {canonical(key)}")
        return Map(key, value)
    if word == "struct":
        tokens.take("<")
        fields: list[tuple[str, ColumnType]] = []
        while True:
            name = tokens.take()
            if not _FIELD_RE.fullmatch(name):
                raise ValueError(f"invalid field name {name!r}")
            tokens.take(":")
            fields.append((name, _parse(tokens, depth + 1)))
            if tokens.peek() != ",":
                break
            tokens.take(",")
        tokens.take(">")
        if len({n.lower() for n, _ in fields}) != len(fields):
            raise ValueError("struct field names must be unique ignoring case")
        return Struct(tuple(fields))
    raise ValueError(f"unknown type {word!r}")


def parse_type(text: str) -> ColumnType:
    """A type of the language from its text; ValueError (one line) when it is none."""
    tokens = _Tokens(text)
    ctype = _parse(tokens, 0)
    if tokens.peek():
        raise ValueError(f"unexpected {tokens.peek()!r} after the type")
    return ctype


def column_type(field: str, text: object) -> str:
    """A spec's column type, checked, in its canonical text; ConfigError naming ``field``."""
    if not isinstance(text, str):
        raise ConfigError(f"{field}: expected a type name, got {text!r}")
    try:
        return canonical(parse_type(text))
    except ValueError as exc:
        raise ConfigError(
            f"{field}: type {text!r} is not a column type ({exc}); types: {', '.join(SCALARS)}, "
            "decimal(p,s), array<T>, map<K,V>, struct<name:T,...>"
        ) from None


def widens(old: str, new: str) -> bool:
    """Can rows of type ``old`` be read as ``new`` by the table and every segment reader: the
    same type, int to long, float to double, a decimal's precision raised (same scale), a
    struct gaining fields (and its fields widening), arrays and map values widening."""
    return _widens(parse_type(old), parse_type(new))


_SCALAR_WIDENINGS = frozenset({("int", "long"), ("float", "double")})


def _widens(old: ColumnType, new: ColumnType) -> bool:
    if old == new:
        return True
    if isinstance(old, Scalar) and isinstance(new, Scalar):
        return (old.name, new.name) in _SCALAR_WIDENINGS
    if isinstance(old, Decimal) and isinstance(new, Decimal):
        return old.scale == new.scale and old.precision <= new.precision
    if isinstance(old, Array) and isinstance(new, Array):
        return _widens(old.element, new.element)
    if isinstance(old, Map) and isinstance(new, Map):
        return old.key == new.key and _widens(old.value, new.value)
    if isinstance(old, Struct) and isinstance(new, Struct):
        fields = dict(new.fields)
        return all(name in fields and _widens(t, fields[name]) for name, t in old.fields)
    return False


def spark_type(text: str) -> Any:
    """The Spark data type of a column type (every field and element nullable)."""
    return _spark(parse_type(text))


def _spark(ctype: ColumnType) -> Any:
    from pyspark.sql import types as T

    if isinstance(ctype, Scalar):
        return {
            "string": T.StringType(),
            "long": T.LongType(),
            "int": T.IntegerType(),
            "double": T.DoubleType(),
            "float": T.FloatType(),
            "boolean": T.BooleanType(),
            "binary": T.BinaryType(),
            "date": T.DateType(),
            "timestamp": T.TimestampType(),
            "timestamp_ntz": T.TimestampNTZType(),
        }[ctype.name]
    if isinstance(ctype, Decimal):
        return T.DecimalType(ctype.precision, ctype.scale)
    if isinstance(ctype, Array):
        return T.ArrayType(_spark(ctype.element), True)
    if isinstance(ctype, Map):
        return T.MapType(_spark(ctype.key), _spark(ctype.value), True)
    return T.StructType([T.StructField(name, _spark(t), True) for name, t in ctype.fields])
