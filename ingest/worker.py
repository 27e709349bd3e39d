"""One worker process: wires settings, metastore, Spark, the build and publish stages, the
group member and the loop."""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial
from types import TracebackType
from typing import Any

import structlog
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from ingest.builder.job import BuilderFactory, SegmentBuilder
from ingest.builder.kafka_read import KafkaReader
from ingest.builder.queue import BuildQueue
from ingest.builder.registration import Registrar
from ingest.builder.start import spark_reader, start_spark_builder
from ingest.builder.warm_up import warm_up, warm_up_splits
from ingest.config import (
    KafkaConf,
    Settings,
    admin_config,
    consumer_config,
    incremental_assignment,
    kafka_client,
    validator_config,
)
from ingest.consume.assignment import Assignment
from ingest.consume.background import Background
from ingest.consume.context import LoopContext
from ingest.consume.group_offsets import GroupOffsets
from ingest.consume.heartbeats import WorkerRegistry
from ingest.consume.kafka import ConfluentConsumer, commit_callback
from ingest.consume.log_offsets import AdminLogOffsets, LogOffsets
from ingest.consume.loop import ConsumeLoop, LoopOptions
from ingest.consume.rebalance import RebalanceHandler
from ingest.consume.topic_watch import TopicWatch, admin_metadata
from ingest.consume.validator import ConfluentValidator
from ingest.errors import KafkaUnavailable
from ingest.kafka_auth import ErrorWatch
from ingest.kafka_java import java_client_properties, java_secret_values
from ingest.ops.endpoints import Endpoints
from ingest.ops.metrics import Metrics
from ingest.publish.publisher import Publisher
from ingest.publish.queue import PublishQueue
from ingest.spec.holder import SpecHolder
from ingest.spec.model import SourceSpec
from ingest.topics import fetch_source_topics
from ingest_common.model import TopicPartition, WorkerState
from ingest_common.redact import register_secrets
from metastore import Metastore, SourceTerminated
from metastore.errors import MetastoreUnavailable
from metastore.listener import ControlListener
from metastore.migrations import require_current_schema

log = structlog.get_logger(__name__)

# How long a starting worker waits for its first heartbeat to read the source's controls,
# and a stopping one for its last heartbeat to be written.
_STARTUP_CONTROLS_WAIT_S = 10.0
_SHUTDOWN_WAIT_S = 5.0
# How long the warm-up waits for its source's log ends.
_WARM_UP_QUERY_S = 10.0


def load_source(store: Metastore, name: str) -> tuple[int, SourceSpec]:
    version, doc = store.latest_spec(name)
    return version, SourceSpec.from_json(doc)


def polled_consumer(settings: Settings, conf: KafkaConf, client: str) -> Any:
    """A librdkafka consumer the polling thread polls: a refusal of its credentials raises out of
    its poll (ingest.kafka_auth.ErrorWatch), and the worker stops with it instead of retrying
    as if Kafka were down."""
    return kafka_client(Consumer, {**conf, "error_cb": ErrorWatch(settings.kafka_bootstrap, client)})


def _callback_deadline_s(settings: Settings, spec: SourceSpec) -> float:
    """How long a rebalance callback may wait on the metastore: a quarter of the poll interval
    (the member must poll again within it), at most 30 s."""
    return min(30.0, int(consumer_config(settings, spec.group_id)["max.poll.interval.ms"]) / 1000 / 4)


def _kafka_clients(
    settings: Settings,
    spec: SourceSpec,
    metrics: Metrics,
    group_offsets: GroupOffsets,
    closes: contextlib.ExitStack,
) -> tuple[ConfluentConsumer, AdminLogOffsets, ConfluentValidator]:
    """The worker's own Kafka clients, each closed by ``closes``: the group member (made now,
    though it joins the group only when it subscribes after Spark has started, so that a
    property librdkafka refuses fails at once, not a minute later), the admin client that asks
    where each partition's log ends (safe from every thread) and KIP-320's validator."""
    conf = consumer_config(settings, spec.group_id)
    if spec.topic_pattern:
        # How soon a topic that starts (or stops) matching is seen (ingest.consume.topic_watch).
        conf["topic.metadata.refresh.interval.ms"] = int(settings.topic_refresh_s * 1000)
    consumer = ConfluentConsumer(
        polled_consumer(
            settings,
            {
                **conf,
                "on_commit": commit_callback(group_offsets.committed),
                "stats_cb": metrics.kafka_statistics("member"),
            },
            "group member",
        ),
        incremental=incremental_assignment(conf),
    )
    closes.callback(consumer.close)
    offsets = AdminLogOffsets(kafka_client(AdminClient, admin_config(settings)))
    closes.callback(offsets.close)
    validator = ConfluentValidator(
        polled_consumer(
            settings,
            {
                **validator_config(settings, f"{spec.group_id}-validator"),
                "stats_cb": metrics.kafka_statistics("validator"),
            },
            "validator",
        )
    )
    closes.callback(validator.close)
    return consumer, offsets, validator


class Worker:
    """Runs until ``stop`` is set (SIGTERM/SIGINT in the CLI), then publishes what it holds,
    leaves the group and releases everything."""

    def __init__(
        self,
        settings: Settings,
        source: str,
        *,
        builder_factory: BuilderFactory | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.source = source
        self.metrics = metrics or Metrics(source)
        self._builder_factory = builder_factory
        self.assignment = Assignment()
        self.loop: ConsumeLoop | None = None
        self.metrics_port: int | None = None
        self.ready = threading.Event()

    def healthy(self) -> tuple[bool, str]:
        """Alive: the loop has polled within the last 30 s (a hung loop gets restarted),
        splits do not keep failing (a dead Spark session or an unwritable store) and no
        publish is stuck (a metastore that stopped answering)."""
        loop = self.loop
        if loop is None:
            return False, "starting"
        if (reason := loop.unhealthy_reason or loop.publish_stall) is not None:
            return False, reason
        stalled = time.monotonic() - loop.last_step_at
        return (stalled < 30.0), f"last poll {stalled:.1f}s ago"

    def ready_check(self) -> tuple[bool, str]:
        """Ready: alive and consuming assigned partitions, or idle by design (the group gave
        this worker no partition: more workers than partitions). Not ready while partitions
        wait for the schema registry (alive all the same: /healthz stays ok)."""
        ok, reason = self.healthy()
        if not ok:
            return ok, reason
        assert self.loop is not None
        if (waiting := self.loop.registry_wait) is not None:
            return False, waiting
        owned = len(self.assignment)
        if owned:
            return True, f"{owned} partition(s) assigned"
        waited = time.monotonic() - self.loop.started_at
        return (waited > 15.0), "no partition assigned" + (" (idle by design)" if waited > 15.0 else " yet")

    @staticmethod
    def _warm_up(
        builder: SegmentBuilder,
        spec: SourceSpec,
        offsets: LogOffsets,
        tps: list[TopicPartition],
        records: int,
        reader: KafkaReader | None = None,
    ) -> None:
        """Before joining the group: a cold JVM makes the first splits slow, and a failure
        here (e.g. an unwritable store) is reported by the real builds, with retries; Kafka
        refusing the reader's credentials stops the start (KafkaUnavailable)."""
        if records == 0:
            return
        try:
            query = offsets.query(tps)
            query.wait(_WARM_UP_QUERY_S)
            ends, _errors = query.result()
            # Every topic's id in the reads' group id from the start (ingest.builder.kafka_read):
            # the consumers the warm-up pools serve the real reads.
            ids = {tp.topic: e.topic_id for tp, e in ends.items() if e.topic_id is not None}
            if reader is not None:
                reader.topics.know(ids)
            splits = warm_up_splits({tp: (e.earliest, e.stable) for tp, e in ends.items()}, records, topic_ids=ids)
            if not splits:
                log.info("spark_warm_up_skipped", source=spec.name, reason="no records in the source's topics")
                return
            seconds = warm_up(builder, spec, splits)
        except KafkaUnavailable:
            raise  # Kafka refused Spark's reader's credentials: builds would only retry it
        except Exception as exc:
            log.warning("spark_warm_up_failed", source=spec.name, error=str(exc))
        else:
            log.info("spark_warmed_up", source=spec.name, records=records, seconds=round(seconds, 2))

    @staticmethod
    def _last_words(
        background: Background,
        registry: WorkerRegistry,
        _type: type[BaseException] | None,
        exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        """The failure (if any) and the last heartbeat reach the metastore before the
        connection closes, within a bound: a dead metastore must not hold the exit."""
        if exc is not None:
            registry.error("WORKER_FAILED", f"{type(exc).__name__}: {exc}")
        final_state = WorkerState.FAILED if exc is not None else WorkerState.STOPPED
        try:
            background.wait(_SHUTDOWN_WAIT_S)
            registry.beat(final_state, [], force=True)
            if not background.wait(_SHUTDOWN_WAIT_S):
                log.warning("final_heartbeat_not_written", timeout_s=_SHUTDOWN_WAIT_S)
        except Exception as exc:  # the worker is stopping either way: report, do not mask the cause
            log.warning("final_heartbeat_failed", error=str(exc))

    def _stopped(self, exc: BaseException | None) -> None:
        self.metrics.worker_up.labels(self.source).set(0)
        self.metrics.set_worker_state(WorkerState.FAILED if exc is not None else WorkerState.STOPPED)

    def run(self, stop: threading.Event) -> None:
        """Everything opened on the way in is closed on the way out, last opened first (one
        ExitStack), whatever the start got to; one order is the protocol's: the consumer leaves
        the group (its revoke callback kills what is in flight) before the pipeline closes."""
        settings = self.settings
        worker_id = settings.worker_id
        # Spark's reader's Kafka (Java) client properties: what cannot be derived from the
        # worker's, or a certificate that cannot be read, fails here, before anything starts.
        reader_properties = java_client_properties(settings.kafka_properties, settings.spark_reader_properties)
        register_secrets(java_secret_values(reader_properties))
        with contextlib.ExitStack() as stack:
            stack.callback(log.info, "worker_stopped", source=self.source, worker=worker_id)
            stack.push(lambda _type, exc, _tb: self._stopped(exc))
            store = stack.enter_context(Metastore(settings.database_url))
            publish_store = stack.enter_context(Metastore(settings.database_url))
            # Build threads register builds on a connection of their own (ingest.builder.registration).
            register_store = stack.enter_context(Metastore(settings.database_url))
            # The background thread's (ingest.consume.background): heartbeats, controls, rewinds, gaps.
            task_store = stack.enter_context(Metastore(settings.database_url))
            # The Kafka clients and the metrics endpoint: closed before the pipeline (moved above it
            # once it exists), or wherever a failed start got to.
            first_out = stack.enter_context(contextlib.ExitStack())
            require_current_schema(settings.database_url)
            version, spec = load_source(store, self.source)
            desired = store.control(spec.name).desired_state
            if desired.terminal:
                raise SourceTerminated(spec.name, desired)
            # The source's topics now (a pattern may match none yet: ingest.topics).
            counts = fetch_source_topics(settings, spec)
            # Made now (it joins the group only when it subscribes, after Spark has started) so
            # that a property librdkafka refuses fails at once, not a minute later.
            group_offsets = GroupOffsets(spec.name, self.metrics)
            consumer, offsets, validator = _kafka_clients(settings, spec, self.metrics, group_offsets, first_out)
            for topic, count in counts.items():
                store.register_partitions(spec.name, topic, range(count), spec.start_from)
            if settings.metrics_port is not None:
                # Bound before Spark starts (tens of seconds on a busy host): a port that is
                # taken fails the start at once, and probes get "starting" instead of no answer.
                endpoints = Endpoints(self.metrics.registry, self.healthy, self.ready_check)
                self.metrics_port = endpoints.serve(settings.metrics_host, settings.metrics_port)
                first_out.callback(endpoints.close)
                log.info("metrics_serving", host=settings.metrics_host, port=self.metrics_port)
            registrar = Registrar(
                register_store,
                worker_id,
                on_store_error=lambda _exc: self.metrics.metastore_errors.labels(spec.name).inc(),
            )
            reader = spark_reader(settings, spec, reader_properties)
            builder: SegmentBuilder
            if self._builder_factory is not None:
                builder = self._builder_factory(registrar, reader)
            else:
                events = self.metrics.spark_connect_events
                builder, sessions = start_spark_builder(
                    settings,
                    spec,
                    registrar,
                    reader,
                    on_event=lambda event: events.labels(spec.name, event.value).inc(),
                    topics=list(counts),
                )
                stack.callback(sessions.stop)
                tps = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
                self._warm_up(builder, spec, offsets, tps, settings.warm_up_records, reader)
            # Connect now, not in the first publish (whose latency would then include it); a
            # failure is the publisher's to retry.
            with contextlib.suppress(MetastoreUnavailable):
                publish_store.ping()
            publisher = Publisher(
                publish_store,
                spec.name,
                worker_id,
                on_store_error=lambda _exc: self.metrics.metastore_errors.labels(spec.name).inc(),
            )
            specs = SpecHolder(spec, version)
            builds = BuildQueue(
                builder,
                threads=settings.build_threads,
                max_batch_splits=settings.build_batch_splits,
                linger_s=settings.build_linger_s,
            )
            publishes = PublishQueue(publisher, publish_delay_s=settings.fault_publish_delay_s)
            # Last opened, first closed: kill what is in flight, resolve what was not built,
            # then let the publish thread settle the rest.
            stack.callback(publishes.stop)
            stack.callback(builds.close)
            stack.callback(publishes.close)
            # Leaving the group (the consumer's revoke callback) kills what is in flight before
            # the stages close.
            stack.enter_context(first_out.pop_all())
            background = Background(f"ingest-{self.source}-background")
            stack.callback(background.close)
            ctx = LoopContext(
                worker_id=worker_id,
                specs=specs,
                consumer=consumer,
                validator=validator,
                assignment=self.assignment,
                killer=publishes,
                store=task_store,
                claims=store,
                background=background,
                metrics=self.metrics,
            )
            topics = None
            if spec.topic_pattern:
                topics = TopicWatch(
                    source=spec.name,
                    start_from=spec.start_from,
                    metadata=admin_metadata(kafka_client(AdminClient, admin_config(settings))),
                    claims=store,
                    store=task_store,
                    background=background,
                    interval_s=settings.topic_refresh_s,
                    registered=counts,
                )
            handler = RebalanceHandler(
                ctx, watermarks=offsets, deadline_s=_callback_deadline_s(settings, spec), topics=topics
            )
            consumer.subscribe(spec.subscription, handler)
            # Controls arrive by NOTIFY within a fraction of a second; the heartbeat poll is the fallback.
            listener = ControlListener(settings.database_url, spec.name).start()
            stack.callback(listener.close)
            registry = WorkerRegistry(ctx, changed=listener.changed)
            stack.push(partial(self._last_words, background, registry))
            # The controls are known before the first poll (a worker started during a drain
            # takes nothing); the loop itself never waits for the metastore.
            registry.beat(WorkerState.STARTING, [], force=True)
            background.wait(_STARTUP_CONTROLS_WAIT_S)
            self.loop = ConsumeLoop(
                ctx,
                builds=builds,
                publishes=publishes,
                handler=handler,
                registry=registry,
                offsets=offsets,
                group_offsets=group_offsets,
                options=LoopOptions(
                    log_end_interval_s=settings.log_end_interval_s,
                    unhealthy_after_failed_splits=settings.unhealthy_after_failed_splits,
                    unhealthy_after_publish_stall_s=settings.unhealthy_after_publish_stall_s,
                    unhealthy_after_build_s=settings.build_deadline_s * 1.5,
                ),
            )
            log.info(
                "worker_started",
                source=spec.name,
                worker=worker_id,
                spec_version=version,
                topics=spec.subscription,
                matching=sorted(counts) if spec.topic_pattern else None,
                group=spec.group_id,
                spark_master=settings.spark_master,
            )
            self.ready.set()
            self.metrics.worker_up.labels(spec.name).set(1)
            self.loop.run(stop)
