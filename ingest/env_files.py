"""Settings from the environment, or from files: a variable ``NAME`` may instead be given as
``NAME_FILE``, the path of a file that holds its value (``INGEST_DATABASE_URL_FILE=/run/secrets/db``),
as Docker and Kubernetes mount secrets. The file's trailing line break is not part of the value.

Which settings take ``_FILE``: ``INGEST_DATABASE_URL``, ``INGEST_SPARK_MASTER`` (a Spark Connect
token), ``INGEST_SCHEMA_REGISTRY_USER_INFO``, and every ``INGEST_KAFKA_PROP_*`` and
``INGEST_SPARK_KAFKA_PROP_*`` (``INGEST_KAFKA_PROP_SASL_PASSWORD_FILE``). A value read from a
file is redacted like one given inline (``ingest.config.Settings.secret_values``). Setting both
``NAME`` and ``NAME_FILE`` is a ConfigError: which one wins would be a guess.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from ingest.errors import ConfigError

FILE_SUFFIX = "_FILE"


def read_value_file(variable: str, path: str) -> str:
    """The value held by the file ``variable`` names, without its trailing line break; a
    ConfigError naming ``variable`` (never the content) when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{variable}: cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{variable}: {path} is not UTF-8 text (byte {exc.start})") from exc
    # Only the line end: a password may begin or end with blanks.
    return text.removesuffix("\n").removesuffix("\r")


def env_value(env: Mapping[str, str], name: str) -> str | None:
    """``name``'s value: set inline, read from the file ``name_FILE`` names, or None."""
    inline, path = env.get(name), env.get(name + FILE_SUFFIX)
    if path:
        if inline:
            raise ConfigError(f"{name} and {name}{FILE_SUFFIX} are both set: set one of them")
        return read_value_file(name + FILE_SUFFIX, path)
    return inline


def prefixed_properties(
    env: Mapping[str, str], prefix: str, file_properties: Collection[str] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    """Client properties given as ``<prefix><NAME with . as _>`` (``INGEST_KAFKA_PROP_SASL_MECHANISM``),
    or read from a file as ``<prefix><NAME>_FILE``: the properties (lower case, ``.`` for ``_``)
    and the variable each came from. ``file_properties``: the client's own property names that
    end in ``.file`` (their value is a path, given as is)."""
    props: dict[str, str] = {}
    origins: dict[str, str] = {}
    files: dict[str, str] = {}
    for key, value in env.items():
        if not key.startswith(prefix) or len(key) == len(prefix):
            continue
        name = key[len(prefix) :].lower().replace("_", ".")
        if key.endswith(FILE_SUFFIX) and name not in file_properties and len(name) > len(".file"):
            name = name.removesuffix(".file")
            files[name] = key
        if name in origins:
            first, second = sorted((origins[name], key))
            raise ConfigError(f"{first} and {second} are both set: set one of them")
        props[name], origins[name] = value, key
    for name, key in files.items():
        props[name] = read_value_file(key, props[name])
    return props, origins
