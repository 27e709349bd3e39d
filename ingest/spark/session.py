"""The worker's one long-lived SparkSession: local, standalone (``spark://``) or Spark
Connect (``sc://``)."""

from __future__ import annotations

import abc
import os
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from ingest.abandoned import any_alive
from ingest.errors import SparkDriverExited, first_line

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)

# A Kafka secret option in a plan's text: a JAAS line's or a key's option (its name, then its
# quoted value, escapes included, as the proto text of a Spark Connect plan shows it), a
# password="..." or clientSecret="..." pair, a PEM private key.
SECRET_TEXT_PATTERN = (
    r"(?i)(?:sasl\.jaas\.config|ssl\.keystore\.key|ssl\.key\.password|ssl\.keystore\.password"
    r"|ssl\.truststore\.password)\W+(?:value:\s*)?\"(?:[^\"\\]|\\.)*\""
    r"|(?:password|secret)\s*=\s*\\*\"(?:[^\"\\]|\\.)*\""
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----"
)
# What every build relies on: UTC, microsecond timestamps, no _SUCCESS or .crc litter.
BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.file.impl.disable.cache": "true",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    # Builds read Kafka through the DSv2 source (ingest.builder.kafka_read): its tasks stop
    # within a fraction of a second of an interrupt (a kill switch). Every other source keeps
    # Spark's default (V1).
    "spark.sql.sources.useV1SourceList": "avro,csv,json,orc,parquet,text",
    # Spark's Kafka reader carries the worker's Kafka secrets as options (ingest.kafka_java):
    # hidden wherever Spark shows a source's options (their values match spark.redaction.regex's
    # "password"/"secret" too, but an inline key or a JAAS line without one would not) ...
    "spark.sql.redaction.options.regex": r"(?i)url|sasl\.jaas\.config|ssl\.keystore\.key",
    # ... and in plan texts: Spark Connect's operation events (its UI, the event log) show the
    # plan's proto text, options and all, redacted by this pattern only.
    "spark.sql.redaction.string.regex": SECRET_TEXT_PATTERN,
}
# Static settings of the Spark application itself: under Spark Connect the driver is the
# server, which owns them (they are set on its command line), and a client that tries to
# set them only gets a CANNOT_MODIFY_CONFIG warning.
SERVER_ONLY_CONF = frozenset({"spark.ui.enabled", "spark.ui.showConsoleProgress"})
#: Avro's bounds on what one length in a body may claim (Avro 1.12, which Spark 4.1 ships:
#: org.apache.avro.SystemLimitException reads these system properties once, when the class
#: loads). Avro's BinaryDecoder allocates a string's or bytes' claimed length, and
#: GenericDatumReader an array's or map's claimed block count, before it reads a byte of them;
#: Avro's own default allows 2^31 - 9, so one record of a few bytes claiming 2 GiB is an
#: OutOfMemoryError, which Spark treats as fatal (PERMISSIVE from_avro catches non-fatal errors
#: only): the executor exits (52), under local[N] the worker's driver, under Spark Connect the
#: server. Past these bounds Avro throws SystemLimitException (a RuntimeException), from_avro
#: gives null and the record is an ``undecodable`` (``key_undecodable``) reject.
#: Strings and bytes, 64 MiB: no field is longer than the Kafka record holding it (1 MiB by
#: default, the broker's message.max.bytes / the topic's max.message.bytes), so this rejects
#: nothing a broker capped at 64 MiB delivers; a lying length under it costs one transient
#: array of at most 64 MiB per task decoding it (2 tasks under local[2], in a 2 GiB heap).
#: Collections, 10M items: a claimed count allocates an array of that many references (40 MB,
#: compressed oops) up front; a real array of 10M items is 10M objects, more than one build
#: should hold per record anyway. Raise them with the same -D options in
#: spark.driver.extraJavaOptions / spark.executor.extraJavaOptions (they follow ours on the
#: command line, and the last -D of a property wins); docs/spark.md#avro-length-limits.
AVRO_MAX_LENGTH = 64 * 1024**2
AVRO_MAX_COLLECTION_ITEMS = 10_000_000
AVRO_LIMITS = {
    "org.apache.avro.limits.string.maxLength": AVRO_MAX_LENGTH,
    "org.apache.avro.limits.bytes.maxLength": AVRO_MAX_LENGTH,
    "org.apache.avro.limits.collectionItems.maxLength": AVRO_MAX_COLLECTION_ITEMS,
}
AVRO_LIMIT_OPTIONS = " ".join(f"-D{name}={value}" for name, value in AVRO_LIMITS.items())
#: Java options every Spark JVM the project starts is launched with: the driver's (pyspark hands
#: a session's settings to spark-submit as --conf when it launches the JVM: they only count
#: then) and the executors'. Spark's *default*JavaOptions ("for administrators", prepended to
#: the extraJavaOptions), so an operator's extraJavaOptions in spark-defaults.conf (the Kafka
#: OAuth allowed-URLs one of docs/configuration.md) keeps working beside them. A Connect
#: server's command line carries the same (:func:`jvm_options_args`).
JVM_OPTIONS_CONF = {
    "spark.driver.defaultJavaOptions": AVRO_LIMIT_OPTIONS,
    "spark.executor.defaultJavaOptions": AVRO_LIMIT_OPTIONS,
}


def jvm_options_args() -> list[str]:
    """:data:`JVM_OPTIONS_CONF` as spark-submit arguments (a Spark Connect server's command line)."""
    return [arg for key, value in JVM_OPTIONS_CONF.items() for arg in ("--conf", f"{key}={value}")]


# Only for local[N]: the executors live in this JVM, so the driver needs no address others can
# reach. A standalone cluster's executors must connect back, so Spark picks the address there.
LOCAL_DRIVER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


# Spark writes an s3a:// store through Hadoop's S3A "magic" committer: each task uploads its
# files as multipart uploads completed at job commit, in the output directory itself. No
# rename (on S3 a copy) anywhere; a build's files are where the publish says they are.
S3A_CONF = {
    "spark.hadoop.fs.s3a.committer.name": "magic",
    "spark.hadoop.fs.s3a.committer.magic.enabled": "true",
    "spark.hadoop.mapreduce.outputcommitter.factory.scheme.s3a": "org.apache.hadoop.fs.s3a.commit.S3ACommitterFactory",
    "spark.sql.sources.commitProtocolClass": "org.apache.spark.internal.io.cloud.PathOutputCommitProtocol",
    "spark.sql.parquet.output.committer.class": "org.apache.spark.internal.io.cloud.BindingParquetOutputCommitter",
    # Upload blocks are buffered in memory: S3A's disk buffer goes through Hadoop's
    # LocalFileSystem, which the raw local file system of BASE_CONF (no .crc files) is not.
    "spark.hadoop.fs.s3a.fast.upload.buffer": "bytebuffer",
}


def object_store_conf(stores: Iterable[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a driver-side session needs for the given stores (canonical URIs): for s3a://, the
    committer (the connector's jars come with :func:`jars_conf`). Credentials are never set
    here: S3A reads the usual AWS variables and Hadoop settings itself. A local S3 API
    (AWS_ENDPOINT_URL[_S3], as pyarrow reads it) gets its endpoint, path-style access and, for
    http://, no TLS."""
    if not any(store.startswith("s3a://") for store in stores):
        return {}
    env = os.environ if env is None else env
    conf = dict(S3A_CONF)
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https://")).lower()
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def jars_conf() -> dict[str, str]:
    """The project's pinned jar set (``scripts/spark-jars/pom.xml``, fetched by
    scripts/setup.sh) on a driver's classpath: the S3 connector, Spark's Kafka source,
    spark-avro, Iceberg's runtime and PostgreSQL's JDBC driver. Loaded whole or not at all, so
    every session that has any of them has the same classpath."""
    from ingest.spark.jars import spark_jars

    return {"spark.jars": ",".join(str(j) for j in spark_jars())}


class SessionSource(abc.ABC):
    """Where builds take their Spark session from: the one owner of the worker's session."""

    @abc.abstractmethod
    def current(self) -> Any:
        """The session for the next build (it may start one, and raise when it cannot)."""

    @abc.abstractmethod
    def peek(self) -> Any | None:
        """The session now, if any; never starts one (a job interrupt)."""

    def failed(self, session: Any, exc: BaseException) -> None:  # noqa: B027 (a no-op by default)
        """A build on ``session`` ended with ``exc``."""

    @abc.abstractmethod
    def stop(self) -> None: ...


class FixedSession(SessionSource):
    """A session made elsewhere, used as it is for its whole life: a local or standalone
    driver's, or a test's. States: usable, exited (the driver JVM this process launched is
    gone: every later :meth:`current` raises SparkDriverExited, so the role exits and its
    supervisor restarts it, rather than failing builds until /healthz says so)."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._exited: SparkDriverExited | None = None

    def current(self) -> Any:
        if self._exited is not None:
            raise self._exited
        return self._session

    def peek(self) -> Any | None:
        return None if self._exited is not None else self._session

    def failed(self, session: Any, exc: BaseException) -> None:
        status = driver_exit_status(session)
        if status is None or self._exited is not None:
            return
        self._exited = SparkDriverExited(status, exc)
        log.error("spark_driver_exited", exit_status=status, error=first_line(exc))

    def stop(self) -> None:
        if self._exited is None:  # a JVM that is gone has nothing to stop
            self._session.stop()


def driver_exit_status(session: Any) -> int | None:
    """The exit status of the driver JVM pyspark launched for ``session`` (its gateway's
    process), or None while it runs or when this process launched none."""
    try:
        process = session.sparkContext._gateway.proc
    except Exception:  # not a classic session, or one that was never launched here
        return None
    status = process.poll() if process is not None else None
    return None if status is None else int(status)


def start_abandoned() -> bool:
    """Whether a thread given up on (ingest.abandoned: a session start, a role's pass), or an
    interrupt, is still running (see ingest.cli.exit_process): none can be stopped."""
    return any_alive() or any(i.busy for i in list(_interrupters))


def _is_connect_session(session: Any) -> bool:
    """Anything but a session whose driver is this process (local, standalone): a Spark
    Connect client (whose tags are the server's), or a test's stand-in."""
    from pyspark.sql import SparkSession

    return not isinstance(session, SparkSession)


@contextmanager
def job_tag(session: Any, tag: str) -> Iterator[None]:
    """Tag the jobs this thread starts on ``session`` while the body runs, so that
    :class:`JobInterrupts` can interrupt them from another thread. A Connect session's tags are
    the server's (``interruptTag`` finds them from any client thread). A classic session's are
    not: it keeps the tags of ``SparkSession.addTag`` per thread, and its ``interruptTag``
    called from any other thread finds none and interrupts nothing; so its jobs carry the tag
    on the SparkContext, whose ``cancelJobsWithTag`` matches the jobs of every thread."""
    if _is_connect_session(session):
        session.addTag(tag)
        try:
            yield
        finally:
            session.removeTag(tag)
        return
    context = session.sparkContext
    context.addJobTag(tag)
    try:
        yield
    finally:
        context.removeJobTag(tag)


def interrupt_tag(session: Any, tag: str) -> None:
    """Interrupt the jobs :func:`job_tag` tagged ``tag`` (from any thread)."""
    if _is_connect_session(session):
        session.interruptTag(tag)
    else:
        session.sparkContext.cancelJobsWithTag(tag)


class JobInterrupts:
    """Interrupts a session's jobs tagged by :func:`job_tag` on a thread of its own, in the order asked.

    The kill switch trips in the consumer's revoke and lost callbacks, which must never wait
    for Spark: under Spark Connect an interrupt is a gRPC call that the client retries for ten
    minutes or more while the server is unreachable (and a hung local JVM holds a Py4J call
    the same way). Held there, the callback would hold the whole group's rebalance. The
    interrupt only saves the job's time; the tripped switch and the publish's serial check are
    what keep a revoked split from being published. The thread ends after a quiet spell and
    starts again on the next request."""

    IDLE_S = 30.0

    def __init__(self, sessions: SessionSource) -> None:
        self._sessions = sessions
        self._tags: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._calling = False
        _interrupters.add(self)

    @property
    def busy(self) -> bool:
        """An interrupt call is running (it may be retrying an unreachable server)."""
        return self._calling

    def request(self, tag: str) -> None:
        """Never blocks."""
        self._tags.put(tag)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="spark-interrupt", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                tag = self._tags.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._tags.empty():
                        self._thread = None
                        return
                continue
            session = self._sessions.peek()
            if session is None:  # stopped: its jobs ended with it
                continue
            self._calling = True
            try:
                # The current session: one replaced since the job started was closed, its jobs with it.
                interrupt_tag(session, tag)
            except Exception as exc:  # the session may be stopping; the kill switch still holds
                log.warning("spark_interrupt_failed", tag=tag, error=str(exc))
            finally:
                self._calling = False


_interrupters: weakref.WeakSet[JobInterrupts] = weakref.WeakSet()


def spark_connect_events_counter(registry: CollectorRegistry) -> Counter:
    """``ingest_spark_connect_events_total{source, event}`` in ``registry``: one series for every
    role whose session a :func:`session_source` owns (a worker, a compactor), so the alerts and
    dashboard panels on it cover them all."""
    return Counter(
        "ingest_spark_connect_events",
        "Under Spark Connect: calls that gave up on an unreachable server, sessions the server "
        "lost, sessions re-created",
        ["source", "event"],
        registry=registry,
    )


def is_connect(master: str) -> bool:
    return master.startswith("sc://")


def session_conf(master: str, extra_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings the worker's session is created with. Anything else (jars such as
    hadoop-aws, fs.s3a.* credentials) comes from spark-defaults.conf in SPARK_CONF_DIR when
    this process is the driver (local, spark://), or from the Connect server's command line.
    A driver this process launches, and its executors, get :data:`JVM_OPTIONS_CONF` (a Connect
    server has its own JVM: those go on its command line)."""
    if is_connect(master):
        conf = {k: v for k, v in BASE_CONF.items() if k not in SERVER_ONLY_CONF}
    else:
        conf = dict(BASE_CONF)
        if master.startswith("local"):
            conf.update(LOCAL_DRIVER_CONF)
        conf["spark.driver.memory"] = os.environ.get("INGEST_SPARK_DRIVER_MEMORY", "2g")
        conf.update(JVM_OPTIONS_CONF)
    extra = dict(extra_conf or {})
    for key in set(JVM_OPTIONS_CONF) & set(conf) & set(extra):  # the caller's own go after ours
        extra[key] = f"{conf[key]} {extra[key]}"
    conf.update(extra)
    return conf
