"""The chaos run with the Iceberg table on (``python -m tests.chaos --quick --table``): two
``ingest table-commit`` processes beside the workers (one holds the lock, one stands by), the
``table_kill`` fault (SIGKILL one of them, start a replacement), and at the end the check that
the table holds every published record exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from ingest.table.catalog import MetastoreCatalog, identifier
from ingest.table.committer import TableCommitter
from ingest.table.config import CommitSettings, PartitionBy, RejectsMode
from ingest.table.enable import enable_table
from ingest_dev.ingest_process import IngestProcess, stop_all
from metastore.tables import TableKind
from tests.chaos_fleet import wait_started

COMMITTERS = 2


class Committers:
    """``python -m ingest table-commit SOURCE`` processes, their JSON logs in files."""

    def __init__(self, env: dict[str, str], source: str, log_dir: Path) -> None:
        self.env = env
        self.source = source
        self.log_dir = log_dir
        self.started = 0
        self.procs: list[IngestProcess] = []
        self.kills = 0

    def start(self, count: int = COMMITTERS) -> None:
        for _ in range(count):
            self.started += 1
            command = ["table-commit", self.source, "--interval", "2"]
            self.procs.append(IngestProcess(command, self.env, self.log_dir, f"committer-{self.started}").start())

    def kill_one(self) -> str:
        """SIGKILL the oldest committer (most likely the one holding the lock); start another
        and wait until it runs."""
        self.procs.pop(0).kill()
        self.kills += 1
        self.start(1)
        wait_started(self.procs[-1], ("table_committer_active", "table_committer_standby"))
        return f"committer-{self.started - COMMITTERS}"

    def exited(self) -> list[int]:
        """Exit codes of committers that ended on their own (a committer never should)."""
        return [rc for proc in self.procs if (rc := proc.poll()) is not None]

    def stop(self) -> None:
        stop_all(self.procs, timeout=60)


def enable(url: str, source: str) -> None:
    enable_table(url, source, PartitionBy.NONE, RejectsMode.TABLE)


def verify_table(url: str, source: str, expected: Mapping[tuple[str, int], list[int]]) -> tuple[int, list[str]]:
    """Commit what is still pending, then compare the tables with what was delivered: every
    record in the data or rejects table exactly once. Returns (rows held, problems)."""
    with TableCommitter(url, source, CommitSettings(interval_s=0)) as committer:
        committer.commit_all()
    catalog = MetastoreCatalog(url)
    held: Counter[tuple[str, int, int]] = Counter()
    try:
        for kind in TableKind:
            if not catalog.table_exists(identifier(source, kind)):
                continue
            scan = catalog.load_table(identifier(source, kind)).scan(
                selected_fields=("_topic", "_partition", "_offset")
            )
            table = scan.to_arrow()
            for t, p, o in zip(
                table["_topic"].to_pylist(), table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True
            ):
                held[(t, p, o)] += 1
    finally:
        catalog.close()
    want = {(t, p, o) for (t, p), offsets in expected.items() for o in offsets}
    problems = []
    duplicates = sorted(k for k, n in held.items() if n > 1)
    missing = sorted(want - set(held))
    unexpected = sorted(set(held) - want)
    for what, items in (("duplicated", duplicates), ("missing", missing), ("unexpected", unexpected)):
        if items:
            problems.append(f"{len(items)} record(s) {what} in the table, first {items[:3]}")
    return sum(held.values()), problems
