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
from collections.abc import Callable
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
        # First: Python warns of what it reads as a nested set ([[:alpha:]]), which this refuses.
        problem = dialect_problem(pattern)
        if problem is not None:
            raise ConfigError(f"topic_pattern: {shown(pattern)}: {problem}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"topic_pattern: {shown(pattern)} is not a valid regex: {exc}") from None
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


_POSIX_CLASS = re.compile(r"\[[:=.]")


def dialect_problem(pattern: str) -> str | None:
    r"""Why ``pattern`` may be read otherwise by one of the three engines that match it, or None.

    The worker checks topics with Python's ``re``; librdkafka's classic member matches with the
    C library's POSIX extended regex (there ``\d`` is the letter d and a backslash inside a
    bracket is a backslash); a KIP-848 member's pattern is matched by the broker (RE2/J). So a
    pattern keeps to what all three read alike: literal characters, ``.``, ``^``, ``$``, ``|``,
    groups ``( )``, brackets such as ``[a-z0-9._-]`` or ``[^.]`` with no backslash or
    ``[:class:]`` in them, the greedy quantifiers ``* + ? {n} {n,} {n,m}``, and a backslash
    before punctuation only (``\.``). ``[0-9]`` reads as Python's ``\d`` does."""
    if "(?" in pattern:
        return "(?...) groups (non-capturing, lookaround, flags) are read by no POSIX regex (librdkafka's)"
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt.isalnum():
                return (
                    f"\\{nxt} means another thing to POSIX regex (librdkafka's classic member: \\d is the letter d)"
                    " than to Python and the broker: use a bracket such as [0-9] or [A-Za-z0-9_]"
                )
            i += 2
            continue
        if c == "[":
            end = i + 1
            if pattern.startswith("^", end):
                end += 1
            if pattern.startswith("]", end):  # a ] first in a bracket is one of its characters
                end += 1
            close = pattern.find("]", end)
            inside = pattern[i + 1 : close if close >= 0 else n]
            if "\\" in inside:
                return (
                    "a backslash inside [...] is a backslash to POSIX regex (librdkafka's), an escape to Python:"
                    " leave it out (a - goes last, a ] first)"
                )
            if _POSIX_CLASS.search(inside):
                return "[:class:] names are POSIX only (Python reads them as characters): use ranges such as [0-9a-z]"
            i = close + 1 if close >= 0 else n
            continue
        if c in "*+?}" and pattern[i + 1 : i + 2] in ("?", "+"):
            return "lazy or possessive quantifiers (*? +? ?? *+ ...) are not POSIX regex (librdkafka's)"
        i += 1
    return None


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


def source_topics(
    spec: SourceTopics, metadata: Any, bootstrap: str, refused: Callable[[str], bool] | None = None
) -> dict[str, int]:
    """The source's topics in the cluster's metadata (confluent-kafka's ClusterMetadata) and
    their partition counts. A named topic that is missing is :class:`TopicNotFound`; a pattern
    may match none (the topics may come later). A topic the metadata carries with an error (one
    being deleted or created) is not one yet. A named topic Kafka may not show the principal is
    "not authorized" (KafkaUnavailable: ingest.kafka_auth), not missing: the metadata carries it
    with TOPIC_AUTHORIZATION_FAILED, or leaves it out and ``refused`` (asked of such a topic:
    ingest.kafka_auth.describe_refused) says so."""
    if not spec.topic_pattern:
        counts = {}
        for topic in spec.topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                from ingest.kafka_auth import refuses_topic, topic_not_authorized

                if refuses_topic(meta.error) if meta is not None else refused is not None and refused(topic):
                    raise topic_not_authorized(topic, bootstrap)
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
    of the credentials, of a topic, or no answer, is KafkaUnavailable)."""
    from ingest.kafka_auth import cluster_metadata, describe_refused

    metadata = cluster_metadata(settings, timeout_s)
    return source_topics(spec, metadata, settings.kafka_bootstrap, lambda t: describe_refused(settings, t, timeout_s))


def kafka_topic_id(description: Any) -> str | None:
    """A TopicDescription's (``AdminClient.describe_topics``) topic id (KIP-516) as Kafka prints
    it (base64, 22 characters); None for the all-zero id of a cluster that gives topics none."""
    uuid = getattr(description, "topic_id", None)
    if uuid is None or (uuid.get_most_significant_bits() == 0 and uuid.get_least_significant_bits() == 0):
        return None
    return str(uuid)
