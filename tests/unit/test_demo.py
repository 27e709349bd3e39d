from typing import Any

from ingest_dev.demo import waiting_for


class Workers:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def live_workers(self, source: str) -> list[dict[str, Any]]:
        return self.rows


class Proc:
    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


def test_the_demo_says_what_it_waits_for() -> None:
    joining = Workers([{"state": "starting", "partitions": []}])
    said = waiting_for(joining, [Proc(None), Proc(None), Proc(3)], 0)  # type: ignore[arg-type, list-item]
    assert "worker-2 exited with code 3 (see worker-2.log)" in said
    assert "1 worker(s) starting Spark" in said and "1 worker(s) joining the consumer group" in said
    # Mid-rebalance two workers may list one partition: it is counted once.
    running = Workers(
        [
            {"state": "running", "partitions": ["clicks[0]", "clicks[1]"]},
            {"state": "running", "partitions": ["clicks[1]"]},
        ]
    )
    assert "own 2/6 partitions" in waiting_for(running, [Proc(None)] * 2, 0)  # type: ignore[arg-type, list-item]
    assert "building the first segments" in waiting_for(running, [Proc(None)], 0)  # type: ignore[arg-type, list-item]
    assert waiting_for(running, [Proc(None)], 10) == ""  # type: ignore[arg-type, list-item]
