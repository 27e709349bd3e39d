"""One redaction for every text that leaves the process: logs, error lines, tracebacks,
``status``, the metastore's error reports and ``source history``.

Two layers, because neither is enough alone:
- patterns: a URL's userinfo password (up to the *last* ``@`` of the authority, so a
  password containing ``@`` is hidden whole), and ``key=value`` pairs whose key names a
  password, secret or token (libpq DSNs, query strings, Spark Connect's ``;token=``);
- values: the secrets this process was configured with (the metastore password, Kafka SASL
  and SSL passwords, the Spark Connect token) are registered at start-up and hidden wherever
  they appear, whatever text a library wrapped them in.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

MASK = "***"

# scheme://user:PASSWORD@host... : the password runs to the last @ before a ? # or blank
# (greedy), so an unencoded @ or / inside it (AWS secret keys contain /) is hidden whole; a
# rare URL with an @ in its path loses a little more than its password.
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#@\s]*:)([^?#\s]*)(@)")
# password=..., sasl.password=..., token=..., client_secret=... in a DSN, a query string or a
# Spark Connect URL; the value is quoted ('a b' as libpq allows) or runs to a separator.
# The key ends in the secret's word (``tokens_read`` is not a secret), or in its key form
# (``fs.s3a.secret.key``, ``aws_secret_access_key``).
_SECRET_KEY = r"[\w.-]*(?:password|passwd|pwd|secret|token|credentials?)(?:[._-](?:access[._-])?key|[._-]value)?"
_SECRET_PAIR = re.compile(
    rf"(\b{_SECRET_KEY}\b\s*=\s*)('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s;&,'\"]+)",
    re.IGNORECASE,
)
_SECRET_NAME = re.compile(_SECRET_KEY, re.IGNORECASE)

# Registered values shorter than this would hide ordinary words; no real secret is that short.
_MIN_SECRET_LEN = 4
_secrets: set[str] = set()
_lock = threading.Lock()


def is_secret_name(name: str) -> bool:
    """Whether a setting or log key names a secret (``sasl.password``, ``token``...)."""
    return bool(_SECRET_NAME.fullmatch(name))


def register_secrets(values: Iterable[str]) -> None:
    """Hide these values wherever they appear from now on (process-wide)."""
    with _lock:
        _secrets.update(v for v in values if len(v) >= _MIN_SECRET_LEN)


def forget_secrets() -> None:
    """For tests: drop the registered values."""
    with _lock:
        _secrets.clear()


def redact(text: str) -> str:
    """The text with every password, token and registered secret replaced by ``***``."""
    text = _SECRET_PAIR.sub(rf"\1{MASK}", _URL_PASSWORD.sub(rf"\1{MASK}\3", text))
    with _lock:
        known = sorted(_secrets, key=len, reverse=True)  # longest first: no partial leftovers
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact_value(value: Any) -> Any:
    """``redact`` applied to every string inside a JSON-like value (specs, status documents)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: MASK if is_secret_name(str(k)) and v else redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


def structlog_processor(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor: runs after exception formatting, so tracebacks are covered too."""
    return {k: MASK if is_secret_name(k) and v else redact_value(v) for k, v in event.items()}
