"""A topic_pattern reads alike in every engine that matches it: Python's ``re`` (the worker's
checks, ``ingest check``), the C library's POSIX extended regex (librdkafka's classic member;
called here through ctypes, the same regcomp/regexec) and the broker's (KIP-848). Apply refuses
the constructs where Python and POSIX part ways."""

from __future__ import annotations

import ctypes
import ctypes.util
import re

import pytest

from ingest.errors import ConfigError
from ingest.topics import subscription_pattern, topics_from_dict

TOPICS = ["X.1", "X.12", "X.d", "X.dd", "Xa1", "X\\1", "orders.eu", "orders.us", "orders.", "a]b", "a-b", "a_b", "ab"]
_REG_EXTENDED, _REG_NOSUB = 1, 8


def posix_matches(pattern: str, topic: str) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    regex = ctypes.create_string_buffer(256)  # regex_t is 64 bytes with glibc
    assert libc.regcomp(regex, pattern.encode(), _REG_EXTENDED | _REG_NOSUB) == 0, pattern
    try:
        return bool(libc.regexec(regex, topic.encode(), 0, None, 0) == 0)
    finally:
        libc.regfree(regex)


ALLOWED = [r"^X\.[0-9]+$", r"^orders\.(eu|us)$", r"^orders\..*", r"^X.[0-9]{1,2}", r"^a[]_-]b", r"^a[^.]b$", r"^X\\"]


@pytest.mark.parametrize("pattern", ALLOWED)
def test_an_allowed_pattern_takes_the_same_topics_in_python_and_posix(pattern: str) -> None:
    [], got = topics_from_dict({"topic_pattern": pattern})
    python = [t for t in TOPICS if re.fullmatch(got, t)]
    posix = [t for t in TOPICS if posix_matches(subscription_pattern(got), t)]
    assert python == posix


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"^X\.\d+$", r"\\d means another thing"),
        (r"^X\.\w+$", r"\\w means another thing"),
        (r"^a[\w-]b$", "a backslash inside"),
        (r"^a[[:alpha:]]b$", r"\[:class:\] names"),
        (r"^X\..*?$", "lazy or possessive"),
        (r"^(?:X)\..*", r"\(\?\.\.\.\) groups"),
    ],
)
def test_a_pattern_posix_reads_otherwise_is_refused_naming_the_construct(pattern: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        topics_from_dict({"topic_pattern": pattern})


def test_the_refused_constructs_do_part_ways() -> None:
    """Why each is refused, seen in the engines themselves."""
    assert re.fullmatch(r"X\.\d+", "X.1") and not posix_matches(r"^(X\.\d+)$", "X.1")
    assert posix_matches(r"^(X\.\d+)$", "X.dd") and not re.fullmatch(r"X\.\d+", "X.dd")
    assert posix_matches(r"^(a[\w-]b)$", "a\\b") and not re.fullmatch(r"a[\w-]b", "a\\b")
