"""The chaos run's configuration: the fault kinds, the bounds it checks and ChaosConfig (its
full-size default and the CI variant)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FAULT_KINDS = ("kill", "stop", "add", "term", "pg_restart", "pg_outage", "spark", "gc", "table_kill", "compact_kill")
SESSION_TIMEOUT_S = 6.0
# The bound on how long a partition with lag may go without a live owner while live workers
# are in the group: the session timeout (a SIGKILLed or frozen owner is noticed) plus one
# rebalance (two rounds with cooperative-sticky) plus the assign callback's metastore
# transaction, with room for a loaded 2-core machine.
UNOWNED_BOUND_S = SESSION_TIMEOUT_S + 24.0


@dataclass(frozen=True)
class ChaosConfig:
    records: int = 500_000
    duration_s: float = 300.0
    workers: int = 3
    partitions: int = 6
    seed: int = 1
    faults: tuple[str, ...] = FAULT_KINDS
    # How many faults to inject (kinds cycled in a seeded order) and the gap between them.
    fault_count: int = 14
    gap_s: tuple[float, float] = (10.0, 20.0)
    catchup_timeout_s: float = 600.0
    # Before each fault: how long to wait for the fleet to own every partition again.
    settle_timeout_s: float = 90.0
    max_records_per_split: int = 20_000
    workdir: Path | None = None
    # The consumer group protocol: "classic" (cooperative-sticky) or "consumer" (KIP-848).
    group_protocol: str = "classic"
    # The segment store: "file" (a local directory) or "s3" (an S3 API the run starts, moto).
    store: str = "file"
    # The Iceberg table on: committers beside the workers, checked at the end (tests/chaos_table.py).
    table: bool = False
    # The source's start_from. "latest": records produced before the fleet starts must never be
    # published, and everything produced after the first claim must be, exactly once.
    start_from: str = "earliest"
    # The records' format: "json", or "avro" through a local schema registry (three writer
    # schema versions, in turn over the production).
    format: str = "json"
    # The workers' Spark: "local" (a JVM in each worker) or "connect" (one Spark Connect server
    # the run starts, ``local[2]``; the workers are thin clients).
    spark: str = "local"
    # A compactor beside the workers (tests/chaos_compact.py), its replacements checked at the end.
    compact: bool = True
    # How every client reaches the broker (tests/chaos_kafka.py): "plaintext", or "sasl_ssl"
    # (SCRAM-SHA-512 over TLS; the password must then show in no process's log).
    kafka_security: str = "plaintext"

    def __post_init__(self) -> None:
        # Without committers (a compactor) there is nothing for table_kill (compact_kill) to hit.
        off = {"table_kill"} if not self.table else set()
        off |= {"compact_kill"} if not self.compact else set()
        object.__setattr__(self, "faults", tuple(f for f in self.faults if f not in off))

    @classmethod
    def quick(
        cls,
        seed: int = 1,
        workdir: Path | None = None,
        store: str = "file",
        table: bool = False,
        start_from: str = "earliest",
        format: str = "json",
        spark: str = "local",
        kafka_security: str = "plaintext",
    ) -> ChaosConfig:
        """The CI variant: ~20k records, one fault of each kind, a few minutes on a loaded 2-core machine."""
        # Production spans most of the faults (a worker restart with Spark takes ~10-30 s
        # here), so they meet partitions with lag and the ownership bound is exercised; the
        # whole run stays within the CI budget (~3 min each variant on 2 cores).
        return cls(
            records=20_000,
            duration_s=85.0,
            workers=2,
            partitions=4,
            seed=seed,
            faults=("kill", "stop", "term", "add", "pg_outage", "spark", "pg_restart", "gc", "compact_kill")
            + (("table_kill",) if table else ()),
            fault_count=10 if table else 9,
            gap_s=(2.0, 4.0),
            catchup_timeout_s=240.0,
            max_records_per_split=2_000,
            workdir=workdir,
            store=store,
            table=table,
            start_from=start_from,
            format=format,
            spark=spark,
            kafka_security=kafka_security,
        )
