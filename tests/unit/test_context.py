"""The loop context's one failure handler for background metastore calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from ingest.consume.background import Background
from ingest.consume.context import LoopContext
from metastore.errors import MetastoreUnavailable
from tests.fake_metastore import MemoryMetastore
from tests.loop_harness import context


@pytest.fixture
def ctx() -> Iterator[LoopContext]:
    background = Background("test-context")
    yield context(MemoryMetastore(), background)
    background.close()


def errors_counted(ctx: LoopContext) -> float:
    return float(ctx.metrics.metastore_errors.labels("src")._value.get())


def test_a_metastore_error_releases_is_counted_and_logged(ctx: LoopContext) -> None:
    released: list[str] = []
    failed = ctx.on_failure("thing_failed", release=lambda: released.append("busy cleared"), partition="t[0]")
    with capture_logs() as logs:
        failed(MetastoreUnavailable("down"))
    assert released == ["busy cleared"] and errors_counted(ctx) == 1
    assert logs == [
        {
            "event": "thing_failed",
            "log_level": "warning",
            "source": "src",
            "worker": "w1",
            "error": "down",
            "partition": "t[0]",
        }
    ]


def test_anything_else_is_a_bug_raised_on_the_polling_thread_after_the_release(ctx: LoopContext) -> None:
    released: list[str] = []
    failed = ctx.on_failure("thing_failed", release=lambda: released.append("busy cleared"))
    with pytest.raises(ZeroDivisionError):
        failed(ZeroDivisionError("a bug"))
    assert released == ["busy cleared"] and errors_counted(ctx) == 0
