"""Records for any Avro schema, and what a reader of the segment's Parquet file (pyarrow's
``to_pylist``) must see for each: the test's independent statement of the type table in
ingest.formats.avro. Values vary with the record's index (every union branch, extremes)."""

from __future__ import annotations

import decimal
import json
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

PUBLIC_SCHEMAS = Path(__file__).parent / "fixtures" / "public_schemas"
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def public_schema(name: str) -> str:
    return (PUBLIC_SCHEMAS / name).read_text()


class Values:
    """(value to serialize, value read back) pairs for one schema."""

    def __init__(self, schema: str) -> None:
        self.doc = json.loads(schema)
        self.names: dict[str, Any] = {}
        self._collect(self.doc, "")

    def _collect(self, doc: Any, space: str) -> None:
        if isinstance(doc, list):
            for branch in doc:
                self._collect(branch, space)
        elif isinstance(doc, dict):
            kind = doc.get("type")
            if kind in ("record", "enum", "fixed"):
                name = str(doc["name"])
                space = name.rpartition(".")[0] if "." in name else str(doc.get("namespace", space) or "")
                self.names[name.rpartition(".")[2]] = doc
                for f in doc.get("fields", []):
                    self._collect(f["type"], space)
            elif kind == "array":
                self._collect(doc["items"], space)
            elif kind == "map":
                self._collect(doc["values"], space)
            elif isinstance(kind, dict | list):
                self._collect(kind, space)

    def record(self, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        written, read = {}, {}
        for f in self.doc["fields"]:
            w, r, present = self.value(f["type"], i)
            written[f["name"]] = w
            if present:
                read[f["name"]] = r
        return written, read

    def value(self, doc: Any, i: int) -> tuple[Any, Any, bool]:
        """(written, read back, has a column)."""
        while isinstance(doc, dict) and isinstance(doc.get("type"), dict | list):
            doc = doc["type"]
        if isinstance(doc, str) and doc not in _PRIMITIVES:
            doc = self.names[doc.rpartition(".")[2]]
        if isinstance(doc, list):
            return self._union(doc, i)
        kind = doc if isinstance(doc, str) else doc["type"]
        logical = doc.get("logicalType") if isinstance(doc, dict) else None
        if kind == "null":
            return None, None, False
        if kind == "record":
            w, r = {}, {}
            for f in doc["fields"]:
                fw, fr, present = self.value(f["type"], i + 1)
                w[f["name"]] = fw
                if present:
                    r[f["name"]] = fr
            return w, r, True
        if kind == "array":
            pairs = [self.value(doc["items"], i + k) for k in range(i % 3 + 1)]
            return [p[0] for p in pairs], [p[1] for p in pairs], pairs[0][2]
        if kind == "map":
            pairs = {f"k{k}": self.value(doc["values"], i + k) for k in range(i % 3)}
            return {k: p[0] for k, p in pairs.items()}, [(k, p[1]) for k, p in pairs.items()], True
        if kind == "enum":
            symbol = doc["symbols"][i % len(doc["symbols"])]
            return symbol, symbol, True
        if logical == "decimal" and kind in ("bytes", "fixed"):
            scale, precision = doc.get("scale", 0), doc["precision"]
            unscaled = (i * 7919) % (10 ** min(precision, 15)) * (-1 if i % 2 else 1)
            value = decimal.Decimal(unscaled).scaleb(-scale)
            return value, value, True
        if kind == "fixed":
            value = bytes((i + k) % 256 for k in range(doc["size"]))
            return value, value, True
        if kind == "bytes":
            value = bytes([i % 256, 0xFF, 0x00])
            return value, value, True
        if kind == "string":
            value = str(uuid.UUID(int=i)) if logical == "uuid" else f"s{i}-\u00fc\u4e2d"
            return value, value, True
        if kind == "boolean":
            return i % 2 == 0, i % 2 == 0, True
        if kind == "int":
            if logical == "date":
                day = date(1969, 7, 20) + timedelta(days=i * 400)
                return day, day, True
            value = [-(2**31), 2**31 - 1, i][i % 3]
            return value, value, True
        if kind == "long":
            if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros"):
                instant = _EPOCH + timedelta(days=i * 3000 - 20000, microseconds=i * 1001)
                if logical.endswith("millis"):
                    instant = instant.replace(microsecond=instant.microsecond // 1000 * 1000)
                if logical.startswith("local"):
                    naive = instant.replace(tzinfo=None)
                    return naive, naive, True
                return instant, instant, True
            value = [-(2**63), 2**63 - 1, i * 1_000_000_007][i % 3]
            return value, value, True
        if kind in ("float", "double"):
            value = [0.5, -1024.75, float(i)][i % 3]
            return value, value, True
        raise AssertionError(f"no value for {doc!r}")

    def _union(self, doc: list[Any], i: int) -> tuple[Any, Any, bool]:
        branches = [b for b in doc if b != "null"]
        nullable = len(branches) < len(doc)
        if not branches:
            return None, None, False
        if nullable and i % 4 == 3:
            return None, None, True
        k = i % len(branches)
        w, r, present = self.value(branches[k], i)
        if len(branches) == 1:
            return w, r, present
        kinds = {b if isinstance(b, str) else b.get("type") for b in branches}
        if kinds <= {"int", "long"} or kinds <= {"float", "double"}:
            return w, r, present
        # Spark's from_avro: a struct of the branches, the written one set.
        return w, {f"member{n}": (r if n == k else None) for n in range(len(branches))}, present
