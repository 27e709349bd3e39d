"""The schema registry: the ``[registry]`` section of a spec and the registry client.

Only the Confluent Schema Registry REST API is used (any registry that speaks it will do).
Credentials come from the environment only (``INGEST_SCHEMA_REGISTRY_USER_INFO``, or a file
named by ``INGEST_SCHEMA_REGISTRY_USER_INFO_FILE``; redacted with the other secrets by
ingest.config), never from a spec, which the metastore stores and ``source history`` shows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from ingest.env_files import env_value
from ingest.errors import ConfigError, shown
from ingest_common.errors import refuse_unknown_fields

USER_INFO_ENV = "INGEST_SCHEMA_REGISTRY_USER_INFO"

SubjectStrategy = Literal["topic", "record"]
SchemaFrom = Literal["spec", "registry"]
_REGISTRY_KEYS = {"url", "subject_strategy", "record_name"}


@dataclass(frozen=True, slots=True)
class RegistrySettings:
    url: str
    # Whose latest version ``schema_from = "registry"`` reads: ``<topic>-value``, or the
    # record's full name (``record_name``).
    subject_strategy: SubjectStrategy = "topic"
    record_name: str = ""

    def subject(self, topic: str) -> str:
        return self.record_name if self.subject_strategy == "record" else f"{topic}-value"


def registry_from_dict(doc: object) -> RegistrySettings:
    if not isinstance(doc, dict):
        raise ConfigError("registry: expected a table with url = the registry's base URL")
    refuse_unknown_fields("registry", doc, _REGISTRY_KEYS)
    if "url" not in doc:
        raise ConfigError("registry.url: missing (required: the registry's base URL)")
    url = doc["url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"registry.url: expected an http:// or https:// URL, got {shown(url)}")
    if "@" in url.partition("://")[2].partition("/")[0]:
        raise ConfigError(f"registry.url: credentials go in {USER_INFO_ENV}, not in the URL")
    strategy = doc.get("subject_strategy", "topic")
    if strategy not in ("topic", "record"):
        raise ConfigError(f"registry.subject_strategy: {shown(strategy)} is not one of topic, record")
    record_name = doc.get("record_name", "")
    if not isinstance(record_name, str):
        raise ConfigError(f"registry.record_name: expected a record's full name, got {shown(record_name)}")
    if strategy == "record" and not record_name:
        raise ConfigError('registry.record_name: required with subject_strategy = "record" (the subject\'s name)')
    return RegistrySettings(url.rstrip("/"), cast(SubjectStrategy, strategy), record_name)


def registry_client(settings: RegistrySettings, env: Mapping[str, str] | None = None) -> Any:
    """confluent-kafka's SchemaRegistryClient for these settings (it caches schemas by id).
    Its own retries are off: a registry that does not answer fails the build, and the
    pipeline's build retry backs off."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    env = os.environ if env is None else env
    conf: dict[str, Any] = {"url": settings.url, "max.retries": 0, "timeout": 10}
    user_info = env_value(env, USER_INFO_ENV)
    if user_info:
        conf["basic.auth.user.info"] = user_info
    return SchemaRegistryClient(conf)


def latest_schema(settings: RegistrySettings, topic: str, schema_type: str = "AVRO") -> str:
    """The latest schema of the topic's subject (``schema_from = "registry"``, at apply): an
    Avro schema, or a JSON Schema (``schema_type = "JSON"``)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    subject = settings.subject(topic)
    try:
        registered = registry_client(settings).get_latest_version(subject)
    except SchemaRegistryError as exc:
        raise ConfigError(f"schema_from = registry: subject {subject!r} at {settings.url}: {exc}") from exc
    except Exception as exc:  # the client's transport errors are not part of its API
        raise ConfigError(f"schema_from = registry: cannot reach the registry at {settings.url}: {exc}") from exc
    schema = registered.schema
    if (schema.schema_type or "AVRO") != schema_type:
        raise ConfigError(
            f"schema_from = registry: subject {subject!r} holds a {schema.schema_type} schema, not {schema_type}"
        )
    return str(schema.schema_str)
