"""Worker settings from the environment.

``INGEST_DATABASE_URL``, ``INGEST_KAFKA_BOOTSTRAP`` and ``INGEST_SPARK_MASTER`` name the
servers. Any librdkafka property passes through untouched, either as
``INGEST_KAFKA_PROP_<name with . as _>`` (e.g. ``INGEST_KAFKA_PROP_SECURITY_PROTOCOL=SASL_SSL``)
or from a Java-style properties file named by ``INGEST_KAFKA_CONFIG_FILE``. Secrets may come
from files instead (``INGEST_KAFKA_PROP_SASL_PASSWORD_FILE``, ``INGEST_DATABASE_URL_FILE``:
ingest.env_files). Spark's Kafka reader gets the Java client's equivalents (ingest.kafka_java),
and ``INGEST_SPARK_KAFKA_PROP_*`` of its own. ``INGEST_KAFKA_OAUTH_CB`` (``module:function``)
gives every librdkafka client an OAUTHBEARER token callback (AWS MSK IAM).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from confluent_kafka import KafkaError, KafkaException
from psycopg.conninfo import conninfo_to_dict

from ingest.env_files import env_value, prefixed_properties
from ingest.errors import ConfigError
from ingest.kafka_java import JAVA_PROP_PREFIX, java_secret_values
from ingest_common.redact import is_secret_name
from metastore.connection import ConnectionLimits

KAFKA_PROP_PREFIX = "INGEST_KAFKA_PROP_"
# sc://host:15002/;token=...;user_id=... (Spark Connect's connection string)
_URL_AUTHORITY = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://([^/?#]*)")
_SPARK_CONNECT_TOKEN = re.compile(r";token=([^;]+)", re.IGNORECASE)
WARM_UP_RECORDS = 2000
# Secrets the process reads from the environment without naming them in a setting: S3A (in the
# Spark JVM), pyarrow and the Iceberg catalog's file IO take the AWS credentials, libpq the
# metastore password when INGEST_DATABASE_URL has none. Their values are redacted like the rest.
# INGEST_SCHEMA_REGISTRY_USER_INFO is "user:password" (the registry client's basic auth); its
# password is also registered alone (secret_values).
# It may also be read from a file (INGEST_SCHEMA_REGISTRY_USER_INFO_FILE, ingest.env_files).
SECRET_ENV_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "PGPASSWORD", "INGEST_SCHEMA_REGISTRY_USER_INFO")
_FILE_ENV_SECRETS = frozenset({"INGEST_SCHEMA_REGISTRY_USER_INFO"})
# librdkafka properties that hold a secret without naming one (is_secret_name covers the rest:
# sasl.password, ssl.key.password, sasl.oauthbearer.client.secret, ...).
KAFKA_SECRET_PROPERTIES = frozenset(
    {
        "ssl.key.pem",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.assertion.private.key.passphrase",
    }
)
# librdkafka's own properties whose names end in ".file" (a path, given as is): for any other,
# INGEST_KAFKA_PROP_<NAME>_FILE reads <name>'s value from the file (ingest.env_files).
LIBRDKAFKA_FILE_PROPERTIES = frozenset(
    {
        "sasl.oauthbearer.assertion.file",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.jwt.template.file",
    }
)
OAUTH_CB_ENV = "INGEST_KAFKA_OAUTH_CB"
# Properties the protocol depends on, with why: every consumer the worker makes carries these
# values (consumer_config applies them last), and Settings.from_env refuses any other value.
_PINNED: dict[str, tuple[str, str]] = {
    "enable.auto.commit": (
        "false",
        "the metastore's next_offset is the only position; Kafka's committed offsets are advice",
    ),
    "enable.auto.offset.store": (
        "false",
        "the metastore's next_offset is the only position; Kafka's committed offsets are advice",
    ),
    # A stored offset that fell out of the log must surface as an error, never be silently
    # replaced by earliest/latest (that would skip or re-read records unnoticed).
    "auto.offset.reset": (
        "error",
        "an offset no longer in the log must stop the partition or be recorded in the gap ledger,"
        " never be replaced unnoticed",
    ),
    # A validated position is confirmed by the first fetch after it: a record, or the end of
    # the partition when the position is the log end (ingest.consume.validator).
    "enable.partition.eof": (
        "true",
        "a position at the log end is confirmed valid by the end of the partition",
    ),
    # Spark's reader reads committed records only, and splits end at the last stable offset
    # (ingest.builder.kafka_read, ingest.consume.cutter); every client of the worker agrees.
    "isolation.level": (
        "read_committed",
        "records of aborted and open transactions would be published, and splits would stretch over open transactions",
    ),
}
PROTOCOL_PROPERTIES = {name: value for name, (value, _why) in _PINNED.items()}

# The worker's own consumers receive record bytes only by accident (a fetch decided before a
# partition's pause) or to learn an answer (the position validator): one record batch per
# fetch (the broker still sends a first batch whole) and no prefetch past one record held.
# librdkafka's defaults keep fetching until 100,000 records or 64 MB are queued: a validation
# of a backlogged partition would receive the backlog.
NO_PREFETCH = {"max.partition.fetch.bytes": 1, "queued.min.messages": 1, "queued.max.messages.kbytes": 1}


# The longest a pass of a singleton role may go without a step of it ending (ingest.roles.runner):
# past it the pass is asked to stop, the role's lock released for a standby and /healthz fails.
# The table committer's step is one commit attempt: 20-120 ms on a local store, seconds for
# a batch of many segments' footers on an object store; 2 minutes is far past any of those and
# keeps a hung committer's table within its IngestTableBehind alert (15 minutes of lag).
TABLE_PASS_DEADLINE_S = 120.0
# The compactor's step is one chunk (one Spark job over at most target_file_size of segments,
# then its replacement): about a minute for 256 MiB on one core; half an hour leaves room for a
# slow store or a busy cluster and still finds a hung job long before IngestSmallFiles (6 hours).
COMPACT_PASS_DEADLINE_S = 1800.0


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str
    kafka_bootstrap: str
    spark_master: str = "local[2]"
    kafka_properties: Mapping[str, str] = field(default_factory=dict)
    # Spark's Kafka reader's own (Java client) properties, applied over those derived from
    # kafka_properties (INGEST_SPARK_KAFKA_PROP_*, ingest.kafka_java).
    spark_reader_properties: Mapping[str, str] = field(default_factory=dict)
    # "module:function": every librdkafka client's OAUTHBEARER token callback (``oauth_cb``).
    kafka_oauth_cb: str = ""
    worker_id: str = ""
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    log_format: str = "auto"
    build_threads: int = 2
    # A build thread builds up to this many waiting splits as one batch (one Spark job), and
    # waits up to the linger after the oldest was sealed for others to join it.
    build_batch_splits: int = 8
    build_linger_s: float = 0.5
    # Synthetic records built (and thrown away) before the worker joins its group, so that
    # the JIT has compiled the parse and write paths before the first real split; 0: none.
    warm_up_records: int = WARM_UP_RECORDS
    # Fault injection for tests and chaos runs: sleep this long between build and publish.
    fault_publish_delay_s: float = 0.0
    # Splits failing in a row (each after its build retries, none published in between)
    # before the worker reports itself unhealthy (/healthz, /readyz, registry, `ingest health`).
    unhealthy_after_failed_splits: int = 5
    # A publish unfinished for this long makes /healthz unhealthy (ingest.consume.publish_watch).
    unhealthy_after_publish_stall_s: float = 120.0
    # `ingest status`: a partition with lag and no publish for this long is STUCK.
    stuck_after_s: float = 300.0
    # A Spark session not started within this is SparkUnavailable: Spark Connect's client
    # otherwise retries an unreachable server for 10 minutes without a word.
    spark_start_timeout_s: float = 300.0
    # Under Spark Connect, one call (a build's, an interrupt, the stop) retries an unreachable
    # server for at most this long (ingest.spark.connect), instead of the client's 10 minutes.
    spark_connect_retry_s: float = 30.0
    # A batch's build running this long is interrupted and fails (it is retried): a Spark job
    # that never finishes (ingest.builder.job).
    build_deadline_s: float = 600.0
    # The longest a table committer's or a compactor's pass may go without a step ending
    # (TABLE_PASS_DEADLINE_S, COMPACT_PASS_DEADLINE_S).
    table_pass_deadline_s: float = TABLE_PASS_DEADLINE_S
    compact_pass_deadline_s: float = COMPACT_PASS_DEADLINE_S
    # How long one poll of Spark's Kafka reader may wait for a range's records
    # (ingest.builder.kafka_read): what a range that cannot be read to its end costs.
    spark_kafka_poll_timeout_s: float = 30.0
    # How long a schema id the registry answers 404 for is waited for before its records are
    # rejects (ingest.builder.writer_schemas).
    schema_id_wait_s: float = 60.0
    # How often the owned partitions' log ends are asked of the brokers (ingest.consume.log_ends).
    log_end_interval_s: float = 0.2
    # A pattern source (topic_pattern): how often the matching topics are asked of the cluster
    # (librdkafka's topic.metadata.refresh.interval.ms; ingest.consume.topic_watch).
    topic_refresh_s: float = 10.0
    # The values of SECRET_ENV_VARS that are set (for redaction only; never shown).
    environment_secrets: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, require_kafka: bool = True) -> Settings:
        env = os.environ if env is None else env
        database_url = env_value(env, "INGEST_DATABASE_URL") or ""
        if not database_url:
            raise ConfigError("INGEST_DATABASE_URL: not set (e.g. postgresql://user:pass@host:5432/db)")
        authority = _URL_AUTHORITY.match(database_url)
        if authority and authority.group(1).count("@") > 1:
            # libpq splits at the first '@' and would try to resolve the rest of the password
            # as a host name, printing it in its error.
            raise ConfigError("INGEST_DATABASE_URL: an '@' in the user name or password must be written %40")
        # Read again by every metastore connection (metastore.connection); a bad value fails here, at start.
        ConnectionLimits.from_env(env)
        bootstrap = env.get("INGEST_KAFKA_BOOTSTRAP", "")
        if require_kafka and not bootstrap:
            raise ConfigError("INGEST_KAFKA_BOOTSTRAP: not set (e.g. broker1:9092,broker2:9092)")
        props: dict[str, str] = {}
        # Where each property came from, for a refusal that names it.
        origins: dict[str, str] = {}
        config_file = env.get("INGEST_KAFKA_CONFIG_FILE")
        if config_file:
            props.update(read_properties(Path(config_file)))
            origins.update(dict.fromkeys(props, "INGEST_KAFKA_CONFIG_FILE"))
        from_env, env_origins = prefixed_properties(env, KAFKA_PROP_PREFIX, LIBRDKAFKA_FILE_PROPERTIES)
        props.update(from_env)
        origins.update(env_origins)
        _refuse_protocol_overrides(props, origins)
        oauth_cb = env.get(OAUTH_CB_ENV, "")
        if oauth_cb:
            oauth_callback(oauth_cb)  # refused now if it cannot be imported, not at the first connection
        return cls(
            database_url=database_url,
            kafka_bootstrap=bootstrap,
            spark_master=env_value(env, "INGEST_SPARK_MASTER") or "local[2]",
            kafka_properties=props,
            spark_reader_properties=prefixed_properties(env, JAVA_PROP_PREFIX)[0],
            kafka_oauth_cb=oauth_cb,
            worker_id=env.get("INGEST_WORKER_ID", "") or default_worker_id(),
            metrics_host=env.get("INGEST_METRICS_HOST", "127.0.0.1"),
            metrics_port=_optional_port(env.get("INGEST_METRICS_PORT")),
            log_format=_choice("INGEST_LOG_FORMAT", env.get("INGEST_LOG_FORMAT", "auto"), ("auto", "json", "console")),
            build_threads=positive_int("INGEST_BUILD_THREADS", env.get("INGEST_BUILD_THREADS", "2")),
            build_batch_splits=positive_int("INGEST_BUILD_BATCH_SPLITS", env.get("INGEST_BUILD_BATCH_SPLITS", "8")),
            build_linger_s=non_negative_seconds("INGEST_BUILD_LINGER_S", env.get("INGEST_BUILD_LINGER_S", "0.5")),
            warm_up_records=_non_negative_int(
                "INGEST_WARM_UP_RECORDS", env.get("INGEST_WARM_UP_RECORDS", str(WARM_UP_RECORDS))
            ),
            fault_publish_delay_s=non_negative_seconds(
                "INGEST_FAULT_PUBLISH_DELAY_S", env.get("INGEST_FAULT_PUBLISH_DELAY_S", "0")
            ),
            unhealthy_after_failed_splits=positive_int(
                "INGEST_UNHEALTHY_AFTER_FAILED_SPLITS", env.get("INGEST_UNHEALTHY_AFTER_FAILED_SPLITS", "5")
            ),
            unhealthy_after_publish_stall_s=positive_seconds(
                "INGEST_UNHEALTHY_AFTER_PUBLISH_STALL_S", env.get("INGEST_UNHEALTHY_AFTER_PUBLISH_STALL_S", "120")
            ),
            stuck_after_s=non_negative_seconds("INGEST_STUCK_AFTER_S", env.get("INGEST_STUCK_AFTER_S", "300")),
            spark_start_timeout_s=non_negative_seconds(
                "INGEST_SPARK_START_TIMEOUT_S", env.get("INGEST_SPARK_START_TIMEOUT_S", "300")
            ),
            spark_connect_retry_s=non_negative_seconds(
                "INGEST_SPARK_CONNECT_RETRY_S", env.get("INGEST_SPARK_CONNECT_RETRY_S", "30")
            ),
            build_deadline_s=positive_seconds("INGEST_BUILD_DEADLINE_S", env.get("INGEST_BUILD_DEADLINE_S", "600")),
            table_pass_deadline_s=positive_seconds(
                "INGEST_TABLE_PASS_DEADLINE_S", env.get("INGEST_TABLE_PASS_DEADLINE_S", f"{TABLE_PASS_DEADLINE_S:g}")
            ),
            compact_pass_deadline_s=positive_seconds(
                "INGEST_COMPACT_PASS_DEADLINE_S",
                env.get("INGEST_COMPACT_PASS_DEADLINE_S", f"{COMPACT_PASS_DEADLINE_S:g}"),
            ),
            spark_kafka_poll_timeout_s=positive_seconds(
                "INGEST_SPARK_KAFKA_POLL_TIMEOUT_S", env.get("INGEST_SPARK_KAFKA_POLL_TIMEOUT_S", "30")
            ),
            schema_id_wait_s=non_negative_seconds("INGEST_SCHEMA_ID_WAIT_S", env.get("INGEST_SCHEMA_ID_WAIT_S", "60")),
            log_end_interval_s=positive_seconds(
                "INGEST_LOG_END_INTERVAL_S", env.get("INGEST_LOG_END_INTERVAL_S", "0.2")
            ),
            topic_refresh_s=positive_seconds("INGEST_TOPIC_REFRESH_S", env.get("INGEST_TOPIC_REFRESH_S", "10")),
            environment_secrets=_environment_secrets(env),
        )

    def secret_values(self) -> list[str]:
        """The secrets these settings carry (for ingest_common.redact): the metastore password, every
        Kafka property that holds a secret (KAFKA_SECRET_PROPERTIES, or its name says so; Spark's
        reader's own too), a Spark Connect token, and the secrets read from the environment
        (SECRET_ENV_VARS), inline or from files alike."""
        values = [v for k, v in self.kafka_properties.items() if is_secret_name(k) or k in KAFKA_SECRET_PROPERTIES]
        values.extend(java_secret_values(self.spark_reader_properties))
        values.extend(self.environment_secrets)
        values.extend(v.partition(":")[2] for v in self.environment_secrets if ":" in v)
        # A string libpq does not accept fails at connect, its message redacted by pattern.
        with contextlib.suppress(psycopg.Error):
            values.append(str(conninfo_to_dict(self.database_url).get("password", "")))
        values.extend(m.group(1) for m in _SPARK_CONNECT_TOKEN.finditer(self.spark_master))
        return [v for v in values if v]


def _environment_secrets(env: Mapping[str, str]) -> tuple[str, ...]:
    values = [env_value(env, name) if name in _FILE_ENV_SECRETS else env.get(name) for name in SECRET_ENV_VARS]
    return tuple(v for v in values if v)


def oauth_callback(spec: str) -> Callable[[str], tuple[str, float]]:
    """The function ``INGEST_KAFKA_OAUTH_CB`` names (``package.module:function``): librdkafka's
    ``oauth_cb``, called with ``sasl.oauthbearer.config`` and returning (token, expiry as seconds
    since the epoch)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"{OAUTH_CB_ENV}: expected package.module:function, got {spec!r}")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{OAUTH_CB_ENV}: cannot import {spec}: {exc}") from exc
    if not callable(function):
        raise ConfigError(f"{OAUTH_CB_ENV}: {spec} is not a function")
    return function  # type: ignore[no-any-return]


def _refuse_protocol_overrides(props: Mapping[str, str], origins: Mapping[str, str]) -> None:
    """A pinned property (``_PINNED``) may be restated with its value, in any case; any other
    value is a ConfigError naming where it was set, the value the worker keeps and why."""
    for name, (pinned, why) in _PINNED.items():
        value = props.get(name)
        if value is not None and value.strip().lower() != pinned:
            raise ConfigError(
                f"{origins[name]}: {name}={value} is refused: the worker always runs with {name}={pinned}"
                f" ({why}); remove it"
            )


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def read_properties(path: Path) -> dict[str, str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"INGEST_KAFKA_CONFIG_FILE: cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"INGEST_KAFKA_CONFIG_FILE: {path} is not UTF-8 text (byte {exc.start})") from exc
    props: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        if "=" not in line:
            raise ConfigError(f"INGEST_KAFKA_CONFIG_FILE: {path}:{number}: expected key=value")
        key, value = line.split("=", 1)
        props[key.strip()] = value.strip()
    return props


def _optional_port(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not is_digits(value) or not 0 <= int(value) <= 65535:
        raise ConfigError(f"INGEST_METRICS_PORT: expected a port number 0-65535, got {value!r}")
    return int(value)


def is_digits(value: str) -> bool:
    """A non-negative integer in ASCII digits."""
    # ASCII only: str.isdigit() is also true of "²", which int() refuses.
    return value.isascii() and value.isdigit()


def positive_int(name: str, value: str, maximum: int | None = None) -> int:
    """A positive integer in ASCII digits, at most ``maximum``; else a ConfigError naming ``name``."""
    if not is_digits(value) or int(value) <= 0 or (maximum is not None and int(value) > maximum):
        bound = f" up to {maximum}" if maximum is not None else ""
        raise ConfigError(f"{name}: expected a positive integer{bound}, got {value!r}")
    return int(value)


def _non_negative_int(name: str, value: str) -> int:
    if not is_digits(value):
        raise ConfigError(f"{name}: expected a non-negative integer, got {value!r}")
    return int(value)


def non_negative_seconds(name: str, value: str) -> float:
    """A finite number of seconds, 0 or more; anything else is a ConfigError naming ``name``."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    # Also refuses nan (every comparison false) and inf (a linger or delay that never ends).
    if not 0 <= number < math.inf:
        raise ConfigError(f"{name}: expected a non-negative number of seconds, got {value!r}")
    return number


def positive_seconds(name: str, value: str) -> float:
    """A finite number of seconds above 0; anything else is a ConfigError naming ``name``."""
    number = non_negative_seconds(name, value)
    if number == 0:
        raise ConfigError(f"{name}: expected a positive number of seconds, got {value!r}")
    return number


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
    return value


# Defaults of the classic group protocol. Under KIP-848 (``group.protocol=consumer``) the
# broker owns the session timeout, the heartbeat interval and the assignor, and librdkafka
# refuses these properties, so they are left out there.
CLASSIC_GROUP_DEFAULTS: dict[str, str | int] = {
    "partition.assignment.strategy": "cooperative-sticky",
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 1_000,
}


def uses_consumer_protocol(conf: Mapping[str, object]) -> bool:
    """KIP-848's consumer group protocol (``group.protocol=consumer``) rather than the classic one."""
    return str(conf.get("group.protocol", "classic")).lower() == "consumer"


def incremental_assignment(conf: Mapping[str, object]) -> bool:
    """Whether rebalances add and remove partitions one by one (cooperative-sticky, or the
    consumer protocol, which is always incremental) instead of revoking everything (eager)."""
    return uses_consumer_protocol(conf) or "cooperative" in str(conf.get("partition.assignment.strategy", ""))


# A librdkafka client's configuration: property values, and the callbacks confluent-kafka takes
# beside them (``oauth_cb``, ``error_cb``, ``on_commit``).
KafkaConf = dict[str, Any]


def _callbacks(settings: Settings) -> KafkaConf:
    return {"oauth_cb": oauth_callback(settings.kafka_oauth_cb)} if settings.kafka_oauth_cb else {}


def consumer_config(settings: Settings, group_id: str) -> KafkaConf:
    """The group member's librdkafka config: user pass-through first, the protocol's settings
    last (PROTOCOL_PROPERTIES). The member reads no record (its partitions stay paused: Spark
    reads them); ``NO_PREFETCH`` bounds what a fetch decided before a pause receives, whatever
    fetch settings the properties give Spark's reader."""
    conf: KafkaConf = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "group.id": group_id,
        "max.poll.interval.ms": 300_000,
        "client.id": settings.worker_id,
    }
    if not uses_consumer_protocol(settings.kafka_properties):
        conf.update(CLASSIC_GROUP_DEFAULTS)
    conf.update(settings.kafka_properties)
    conf.update(PROTOCOL_PROPERTIES)
    conf.update(NO_PREFETCH)
    conf.update(_callbacks(settings))
    return conf


def validator_config(settings: Settings, group_id: str) -> KafkaConf:
    """The position validator's consumer (ingest.consume.validator): in no group (``group_id``
    only names it), answering soon at a log end; it receives about one record batch per answer
    (``NO_PREFETCH``)."""
    conf = consumer_config(settings, group_id)
    for key in CLASSIC_GROUP_DEFAULTS:
        conf.pop(key, None)
    conf["fetch.wait.max.ms"] = 100
    return conf


def admin_config(settings: Settings) -> KafkaConf:
    """For admin/metadata clients: pass-through properties that are not consumer-only."""
    conf: KafkaConf = {"bootstrap.servers": settings.kafka_bootstrap}
    for key, value in settings.kafka_properties.items():
        if (
            key.startswith(("security.", "sasl.", "ssl.", "client.", "socket.", "broker.", "api.", "https."))
            or key == "enable.ssl.certificate.verification"
        ):
            conf[key] = value
    conf.update(_callbacks(settings))
    return conf


def reader_config(settings: Settings, group_id: str) -> KafkaConf:
    """For a consumer that only reads watermarks and never joins its group (``ingest status``):
    admin_config's properties and the protocol's (PROTOCOL_PROPERTIES), so the high watermark
    it reads is the last stable offset, as the worker's consumers see it."""
    return {**admin_config(settings), "group.id": group_id, **PROTOCOL_PROPERTIES}


_Client = TypeVar("_Client")


def kafka_error(exc: KafkaException) -> KafkaError | None:
    """The librdkafka error a KafkaException carries (its first argument), if any."""
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


def kafka_client(factory: Callable[[dict[str, Any]], _Client], conf: Mapping[str, Any]) -> _Client:
    """A librdkafka client (Consumer, AdminClient); a property librdkafka refuses (unknown
    name, bad value) is a ConfigError naming it, not a traceback. librdkafka checks every
    property when the client is made, before it connects anywhere. Its own log lines go
    through the structured logger (ingest.logs.librdkafka_logger), so JSON logs stay JSON."""
    from ingest.logs import librdkafka_logger

    try:
        return factory({"logger": librdkafka_logger(), **conf})
    except KafkaException as exc:
        error = kafka_error(exc)
        if error is not None and error.code() == KafkaError._INVALID_ARG:
            raise ConfigError(
                f"Kafka client properties (INGEST_KAFKA_PROP_*, INGEST_KAFKA_CONFIG_FILE): {error.str()}"
            ) from exc
        raise
