"""What every command shares: its settings from the environment (secrets registered for
redaction first) and its result, a ``--json`` document or text lines."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from ingest.config import Settings
from ingest_common.redact import register_secrets

# Every --json document carries it; it changes only when a field changes meaning or goes away.
JSON_SCHEMA_VERSION = 1


def emit(args: argparse.Namespace, document: dict[str, Any], lines: Sequence[str] = ()) -> None:
    """The command's result: ``document`` as JSON under ``--json``, else the text ``lines``."""
    if getattr(args, "json", False):
        print(json.dumps({"schema_version": JSON_SCHEMA_VERSION, **document}, indent=2, default=str))
    else:
        for line in lines:
            print(line)


def load_settings(require_kafka: bool = False) -> Settings:
    settings = Settings.from_env(require_kafka=require_kafka)
    register_secrets(settings.secret_values())
    return settings
