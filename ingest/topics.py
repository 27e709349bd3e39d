"""A source's topics: the names it lists (``topics``) or those matching its regex
(``topic_pattern``), as the spec gives them and as the cluster's metadata has them now.

A pattern matches a topic whose whole name it matches (as the broker matches a KIP-848
member's regex, and Kafka's Java clients, Spark's ``subscribePattern`` and Connect's
``topics.regex`` do); librdkafka's classic member searches instead, so the member subscribes with
the pattern anchored at both ends (:func:`subscription_pattern`). Internal topics (names starting
with "__": the group and transaction logs) never match. Every place that needs the source's
topics asks :func:`source_topics`: the worker at start, ``ingest check``, the writer schemas
prefetched, the topic watch (ingest.consume.topic_watch).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol

from ingest.errors import ConfigError, TopicNotFound, shown

if TYPE_CHECKING:
    from ingest.config import Settings

TOPIC_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


class SourceTopics(Protocol):
    """What of a source spec (ingest.spec.SourceSpec) names its topics."""

    @property
    def topics(self) -> tuple[str, ...]: ...
    @property
    def topic_pattern(self) -> str: ...
    def matches(self, topic: str) -> bool: ...


def topics_from_dict(doc: dict[str, Any]) -> tuple[list[str], str]:
    """``topics`` (a list of names) or ``topic_pattern`` (a regex starting with "^"): exactly
    one of them, as (topics, pattern) with the other empty."""
    if ("topics" in doc) == ("topic_pattern" in doc):
        raise ConfigError("topics / topic_pattern: give exactly one (a list of topic names, or a regex)")
    if "topic_pattern" in doc:
        pattern = doc["topic_pattern"]
        if not isinstance(pattern, str) or not pattern.startswith("^"):
            raise ConfigError(
                f'topic_pattern: expected a regex starting with "^" (how Kafka clients tell a pattern '
                f"from a topic name), got {shown(pattern)}"
            )
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"topic_pattern: {shown(pattern)} is not a valid regex: {exc}") from None
        if "(?" in pattern:
            raise ConfigError(
                f"topic_pattern: {shown(pattern)}: (?...) groups (non-capturing, lookaround, flags) are not"
                " supported by librdkafka's regex"
            )
        return [], pattern
    topics = doc["topics"]
    if not isinstance(topics, list) or not topics:
        raise ConfigError(f"topics: expected a non-empty list of topic names, got {shown(topics)}")
    for topic in topics:
        if not isinstance(topic, str) or not TOPIC_NAME_RE.fullmatch(topic):
            raise ConfigError(f"topics: {shown(topic)} is not a valid Kafka topic name")
    if len(set(topics)) != len(topics):
        raise ConfigError("topics: lists a topic twice")
    return topics, ""


def topic_matches(topics: tuple[str, ...], pattern: str, topic: str) -> bool:
    """Is ``topic`` one of a source's: named in ``topics``, or matching ``pattern``."""
    if not pattern:
        return topic in topics
    return not topic.startswith("__") and re.fullmatch(pattern, topic) is not None


def subscription_pattern(pattern: str) -> str:
    """What the group member subscribes with for ``pattern``: the same regex anchored at both
    ends, so that librdkafka's classic member (which searches) and the broker (which matches
    the whole name) take the same topics as :func:`topic_matches`."""
    body = pattern[1:]
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    return f"^({body})$"


def source_topics(spec: SourceTopics, metadata: Any, bootstrap: str) -> dict[str, int]:
    """The source's topics in the cluster's metadata (confluent-kafka's ClusterMetadata) and
    their partition counts. A named topic that is missing is :class:`TopicNotFound`; a pattern
    may match none (the topics may come later). A topic the metadata carries with an error (one
    being deleted or created) is not one yet."""
    if not spec.topic_pattern:
        counts = {}
        for topic in spec.topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise TopicNotFound(f"topic {topic!r} does not exist on {bootstrap}")
            counts[topic] = len(meta.partitions)
        return counts
    return {
        name: len(meta.partitions)
        for name, meta in sorted(metadata.topics.items())
        if spec.matches(name) and meta.error is None and meta.partitions
    }


def fetch_source_topics(settings: Settings, spec: SourceTopics, timeout_s: float = 10.0) -> dict[str, int]:
    """:func:`source_topics` of the cluster's metadata asked now (ingest.kafka_auth: a refusal
    of the credentials, or no answer, is KafkaUnavailable)."""
    from ingest.kafka_auth import cluster_metadata

    return source_topics(spec, cluster_metadata(settings, timeout_s), settings.kafka_bootstrap)
