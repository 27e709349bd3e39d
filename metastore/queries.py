"""Named queries from ``queries.sql``, parsed once."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    text = (resources.files("metastore") / "queries.sql").read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    named: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        statement = "\n".join(line for line in body.strip().splitlines() if not line.lstrip().startswith("--"))
        named[name] = statement.strip().rstrip(";")
    return named


def query(name: str) -> str:
    return queries()[name]
