"""`ingest reset --to`: explicit offsets are parsed without asking Kafka, and anything else is a ConfigError."""

from __future__ import annotations

import pytest

from ingest.cli.actions import _reset_targets
from ingest.config import Settings
from ingest.errors import ConfigError

# Every partition has a stored offset: Kafka is never asked.
SETTINGS = Settings.from_env({"INGEST_DATABASE_URL": "postgresql://h/db", "INGEST_KAFKA_BOOTSTRAP": "127.0.0.1:9"})


@pytest.mark.parametrize("to", ["t:0=²", "t:²=5", "t:0=-1", "t:0", "t0=5x"])
def test_reset_offsets_that_are_not_numbers_name_the_option(to: str) -> None:
    rows = [{"topic": "t", "partition": 0, "next_offset": 7}]
    with pytest.raises(ConfigError, match="--to"):
        _reset_targets(to, rows, SETTINGS)


def test_reset_offsets_parse_per_partition() -> None:
    rows = [{"topic": "t", "partition": 0, "next_offset": 7}, {"topic": "t", "partition": 1, "next_offset": 9}]
    targets, earliest = _reset_targets("t:0=3, 1=12", rows, SETTINGS)
    assert {(tp.topic, tp.partition): o for tp, o in targets.items()} == {("t", 0): 3, ("t", 1): 12}
    assert earliest == {}
