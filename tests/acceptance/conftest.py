from __future__ import annotations

from collections.abc import Callable

import pytest

from ingest.builder import SegmentBuilder, SparkSegmentBuilder


@pytest.fixture
def spark_builder(spark: object) -> Callable[[], SegmentBuilder]:
    return lambda: SparkSegmentBuilder(spark)
