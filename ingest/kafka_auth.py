"""A broker that refuses the worker's credentials (a wrong SASL password, a broker certificate
the worker does not trust, a client certificate the broker rejects) is a setting to fix, not an
outage to wait out: librdkafka retries such a connection forever, and the worker would look as
if Kafka were down. So a refusal is :class:`KafkaUnavailable` (exit 4) in one line, with
librdkafka's reason, and is never retried:

- at start, :func:`cluster_metadata` (the source's topics, asked before anything else of Kafka)
  fails at the first refusal, within a second, instead of waiting out its timeout;
- later, every client the polling thread polls (the group member, the validator) reports its
  errors through :class:`ErrorWatch` (its ``error_cb``): a refusal raises out of the poll
  (confluent-kafka re-raises what a callback raises), so the worker stops instead of looping;
- Spark's reader (the Java client) refusing at the warm-up build stops the start too
  (:func:`java_refusal`, ingest.builder.warm_up).

What is a refusal: librdkafka's ``_AUTHENTICATION`` (SASL) and ``_SSL`` (the TLS handshake
failed: the broker's certificate is not trusted, or does not match the host), and a
``_TRANSPORT`` error carrying a TLS alert (the broker rejected the client certificate: with TLS
1.3 the client learns it only on its first read).

A broker with an authorizer that accepts the credentials may still refuse the principal a topic
or the group (Kafka's ACLs): ``TOPIC_AUTHORIZATION_FAILED`` and ``GROUP_AUTHORIZATION_FAILED``
are "not authorized" (:func:`topic_not_authorized`, :func:`group_not_authorized`, exit 4),
naming the ACL the worker's principal lacks, never "does not exist". What a worker needs:
READ on each of its topics (READ includes DESCRIBE: metadata, the log ends) and READ on its
consumer group (which includes DESCRIBE: the group's coordinator, ``ingest check``'s describe).
A principal that may not describe a topic is not told whether it exists: the cluster's metadata
just leaves it out, and :func:`describe_refused` asks for that topic alone to tell the two apart.
"""

from __future__ import annotations

import re
import time
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from ingest.config import Settings, admin_config, kafka_client, kafka_error
from ingest.errors import KafkaUnavailable

log = structlog.get_logger(__name__)

_TLS_ALERT = re.compile(r"ssl/tls alert|SSL alert number", re.IGNORECASE)
# The Java client's exceptions for the same refusals (org.apache.kafka.common.errors).
_JAVA_REFUSAL = re.compile(r"\b(?:Sasl|Ssl)?AuthenticationException\b[^\n]*")
# How often the start's metadata request is asked again, and its errors looked at, while no
# answer came: librdkafka reconnects (and logs a failure) every few tens of milliseconds.
_METADATA_STEP_S = 0.1


def refusal(error: KafkaError) -> str | None:
    """librdkafka's text for an error that is a refusal of the credentials, else None."""
    code = error.code()
    if code in (KafkaError._AUTHENTICATION, KafkaError._SSL):
        return str(error.str())
    if code == KafkaError._TRANSPORT and _TLS_ALERT.search(error.str()):
        return str(error.str())
    return None


def refused(bootstrap: str, reason: str, client: str = "the worker") -> KafkaUnavailable:
    return KafkaUnavailable(
        f"Kafka at {bootstrap} refused {client}'s credentials (not retried: fix the SASL credentials"
        f" or TLS certificates): {reason}"
    )


def java_refusal(text: str) -> str | None:
    """The Java client's authentication exception in an error text (Spark's reader), else None."""
    found = _JAVA_REFUSAL.search(text)
    return found.group(0).strip()[:300] if found else None


def spark_reader_refused(reason: str) -> KafkaUnavailable:
    return KafkaUnavailable(
        "Kafka refused the credentials of Spark's Kafka reader (not retried: fix the Kafka settings it is"
        f" derived from, or INGEST_SPARK_KAFKA_PROP_*): {reason}"
    )


class ErrorWatch:
    """A librdkafka client's ``error_cb``, called on the thread that polls the client: a refusal
    raises :class:`KafkaUnavailable` out of that poll; other errors are logged (librdkafka logs
    them itself when a client has no callback) and left to librdkafka's retries."""

    def __init__(self, bootstrap: str, client: str) -> None:
        self._bootstrap = bootstrap
        self._client = client

    def __call__(self, error: KafkaError) -> None:
        reason = refusal(error)
        if reason is not None:
            raise refused(self._bootstrap, reason, f"the worker's {self._client}")
        log.warning("kafka_client_error", client=self._client, code=error.name(), error=error.str())


def cluster_metadata(settings: Settings, timeout_s: float = 10.0) -> Any:
    """The cluster's metadata (confluent-kafka's ClusterMetadata), asked with the worker's admin
    settings. A refusal raises KafkaUnavailable at once; no answer within ``timeout_s`` raises
    it naming librdkafka's last error (a refused connection, a host that does not resolve)."""
    errors: list[KafkaError] = []
    admin = kafka_client(AdminClient, {**admin_config(settings), "error_cb": errors.append})
    deadline = time.monotonic() + timeout_s
    while True:
        step = max(0.01, min(_METADATA_STEP_S, deadline - time.monotonic()))
        try:
            return admin.list_topics(timeout=step)
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback
            for error in errors:
                if (reason := refusal(error)) is not None:
                    raise refused(settings.kafka_bootstrap, reason) from exc
            if time.monotonic() >= deadline:
                failure = carried.str() if (carried := kafka_error(exc)) is not None else str(exc)
                last = [e.str() for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
                detail = f" (last error: {last[-1]})" if last else ""
                raise KafkaUnavailable(f"Kafka unreachable at {settings.kafka_bootstrap}: {failure}{detail}") from exc


def topic_not_authorized(topic: str, bootstrap: str, operation: str = "DESCRIBE") -> KafkaUnavailable:
    """Kafka refused the principal ``operation`` on ``topic`` (TOPIC_AUTHORIZATION_FAILED)."""
    whether = (
        "; a principal that may not describe a topic is not told whether it exists" if operation == "DESCRIBE" else ""
    )
    return KafkaUnavailable(
        f"topic {topic!r}: not authorized (TOPIC_AUTHORIZATION_FAILED from Kafka at {bootstrap}): the"
        f" principal the worker's Kafka properties authenticate as has no ACL allowing {operation} on topic"
        f" {topic!r} (the worker needs READ on it, which includes DESCRIBE){whether}"
    )


def group_not_authorized(group: str, bootstrap: str) -> KafkaUnavailable:
    """Kafka refused the principal the consumer group ``group`` (GROUP_AUTHORIZATION_FAILED)."""
    return KafkaUnavailable(
        f"consumer group {group!r}: not authorized (GROUP_AUTHORIZATION_FAILED from Kafka at {bootstrap}): the"
        f" principal the worker's Kafka properties authenticate as has no ACL allowing READ on group {group!r}"
        " (the worker's group member joins it; READ includes DESCRIBE)"
    )


def refuses_topic(error: KafkaError | None) -> bool:
    """Is ``error`` (a topic's in the metadata, a fetch's) an ACL's refusal of the topic."""
    return error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def not_authorized(
    error: KafkaError, bootstrap: str, *, group: str, topic: str | None = None, operation: str = "READ"
) -> KafkaUnavailable | None:
    """The "not authorized" error for a librdkafka error that is an ACL's refusal of ``topic``
    (``operation`` on it) or of ``group``, else None."""
    if refuses_topic(error) and topic is not None:
        return topic_not_authorized(topic, bootstrap, operation)
    if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return group_not_authorized(group, bootstrap)
    return None


def describe_refused(settings: Settings, topic: str, timeout_s: float = 10.0) -> bool:
    """Whether Kafka refuses the worker's principal to describe ``topic`` (a topic the
    cluster's metadata left out: missing, or not the principal's to see). Asked with
    DescribeTopics, which never creates a topic (a metadata request naming it would, from a
    client allowed to and a broker with ``auto.create.topics.enable``)."""
    admin = kafka_client(AdminClient, admin_config(settings))
    try:
        admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic].result()
    except KafkaException as exc:
        return refuses_topic(kafka_error(exc))
    return False
