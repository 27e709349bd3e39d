"""Starting a role's Spark session: local, standalone (``spark://``) or Spark Connect
(``sc://``), within a bound, and its one owner (a :class:`ingest.spark.session.SessionSource`).
The session's settings and the owner types are ``ingest.spark.session``'s; the Connect client's
are ``ingest.spark.connect``'s: this module is the one that knows both."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ingest.abandoned import abandon
from ingest.spark.session import (
    FixedSession,
    SessionSource,
    is_connect,
    jars_conf,
    object_store_conf,
    session_conf,
)
from ingest_common.model import SparkConnectEvent

if TYPE_CHECKING:
    from ingest.config import Settings

_START_THREAD = "spark-start"
_CONNECT_START_MARGIN_S = 5.0


def create_session(
    master: str = "local[2]",
    app_name: str = "ingest",
    extra_conf: Mapping[str, str] | None = None,
    stores: Iterable[str] = (),
    connectors: bool = False,
    connect_retry_s: float | None = None,
    connect_wait_s: float | None = None,
) -> Any:
    """``stores``: the segment stores the session will write. A local or standalone driver
    loads the pinned jar set (:func:`jars_conf`) when a store is s3a:// or ``connectors`` asks
    for it (Spark's Kafka source, Avro, reading the Iceberg tables); a Connect server has its
    own classpath. A Connect session's calls retry an unreachable server for at most
    ``connect_retry_s`` (ingest.spark.connect; default CONNECT_RETRY_S), its first call (the
    settings) for ``connect_wait_s`` (default: the same)."""
    conf = session_conf(master, extra_conf)
    if is_connect(master):
        from ingest.spark.connect import CONNECT_RETRY_S, connect_session

        # Everything in session_conf is a runtime SQL setting, applied to this client's own
        # server-side session (several workers share one server without interfering).
        retry_s = CONNECT_RETRY_S if connect_retry_s is None else connect_retry_s
        settings = {"spark.app.name": app_name, **conf}
        return connect_session(master, settings, retry_s, wait_s=retry_s if connect_wait_s is None else connect_wait_s)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master)
    stores_conf = object_store_conf(stores)
    jars = jars_conf() if stores_conf or connectors else {}
    for key, value in {**jars, **stores_conf, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def create_session_within(
    timeout_s: float,
    master: str,
    app_name: str,
    stores: Iterable[str] = (),
    connectors: bool = False,
    connect_retry_s: float | None = None,
) -> Any:
    """``create_session`` that gives up after ``timeout_s`` with ``TimeoutError``. The attempt
    goes on in a daemon thread (neither a JVM start nor a gRPC retry can be interrupted); the
    caller is expected to exit, which ends it. A Connect server is waited for that long too
    (it may be starting beside the worker); the session's later calls retry ``connect_retry_s``."""
    outcome: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=1)

    def start() -> None:
        try:
            session = create_session(
                master,
                app_name,
                stores=stores,
                connectors=connectors,
                connect_retry_s=connect_retry_s,
                # A little longer than the start's own bound, which is what ends a start on an
                # unreachable server (its error names INGEST_SPARK_START_TIMEOUT_S); the thread ends soon after.
                connect_wait_s=timeout_s + _CONNECT_START_MARGIN_S,
            )
            outcome.put((session, None))
        except BaseException as exc:  # handed to the caller, which raises it
            outcome.put((None, exc))

    thread = threading.Thread(target=start, name=_START_THREAD, daemon=True)
    thread.start()
    try:
        session, error = outcome.get(timeout=timeout_s)
    except queue.Empty:
        abandon(thread)
        raise TimeoutError(f"no session within {timeout_s:g} s (INGEST_SPARK_START_TIMEOUT_S)") from None
    if error is not None:
        raise error
    return session


def session_source(
    master: str,
    app_name: str,
    first: Any,
    *,
    retry_s: float,
    on_event: Callable[[SparkConnectEvent], None] = lambda _event: None,
) -> SessionSource:
    """The one owner of a role's Spark session (a worker's builds, a compactor's jobs), given
    the session ``first`` made for ``master``: under Spark Connect one that replaces a session
    the server lost (ingest.spark.connect.ConnectSessions, its calls bounded by ``retry_s``);
    otherwise the driver's own, kept for the process's life (:class:`FixedSession`)."""
    if not is_connect(master):
        return FixedSession(first)
    from ingest.spark.connect import ConnectSessions  # the Connect client and grpc: for sc:// only

    return ConnectSessions(master, app_name, retry_s=retry_s, first=first, on_event=on_event)


def open_session_source(
    settings: Settings,
    app_name: str,
    stores: Iterable[str],
    *,
    connectors: bool = False,
    on_event: Callable[[SparkConnectEvent], None] = lambda _event: None,
) -> SessionSource:
    """A role's Spark session as the role's settings say (master, start bound, Connect retry
    bound), started now: :func:`create_session_within`, then its one owner
    (:func:`session_source`). Raises what the start raises (``TimeoutError`` past the bound)."""
    first = create_session_within(
        settings.spark_start_timeout_s,
        settings.spark_master,
        app_name,
        stores=stores,
        connectors=connectors,
        connect_retry_s=settings.spark_connect_retry_s,
    )
    return session_source(
        settings.spark_master, app_name, first, retry_s=settings.spark_connect_retry_s, on_event=on_event
    )
