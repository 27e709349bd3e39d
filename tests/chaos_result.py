"""What a chaos run found: each injected fault with its recovery time, and the result with
its verdict (ok) and its printed summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ingest_dev.verify import Verification
from tests.chaos_config import UNOWNED_BOUND_S, ChaosConfig


@dataclass
class Fault:
    kind: str
    target: str
    started: float
    ended: float = 0.0
    # Published offsets when the fault ended; recovered once every partition moved past them.
    baseline: dict[int, int] = field(default_factory=dict)
    recovered: float | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered is None else max(0.0, self.recovered - self.ended)


@dataclass
class ChaosResult:
    config: ChaosConfig
    produced: int
    verification: Verification
    payload_rows: int
    payload_errors: list[str]
    caught_up: bool
    faults: list[Fault]
    conflicts: dict[str, int]
    splits_killed: Counter[str]
    unplanned_exits: int
    health_restarts: int
    producer_errors: list[str]
    elapsed_s: float
    broker: str = ""
    # Builds the final gc could not sweep (it must sweep every one).
    final_gc_problems: list[str] = field(default_factory=list)
    # The longest a partition with lag had no live owner while live workers were in the group:
    # (seconds, partition, seconds since the start when it began).
    unowned_worst: tuple[float, int, float] = (0.0, -1, 0.0)
    ownership_samples: int = 0
    # With the table on: rows the tables hold and what is wrong with them (nothing, when exactly once).
    table_rows: int = 0
    table_errors: list[str] = field(default_factory=list)
    # With the compactor on: segments replaced by compaction during the run, and what went wrong
    # around it (a file a current segment lists deleted by gc, a compactor that exited on its own).
    replaced: int = 0
    compact_problems: list[str] = field(default_factory=list)
    # ``ingest audit SOURCE --files`` at the end, run as an operator would: its exit code and lines.
    audit_code: int | None = None
    audit_lines: list[str] = field(default_factory=list)
    # On a secured broker: how many process logs and outputs were searched for the password,
    # and the ones it showed in (none, when it is handled as a secret).
    secret_checked: int = 0
    secret_shown: list[str] = field(default_factory=list)

    @property
    def ownership_ok(self) -> bool:
        return self.ownership_samples > 0 and self.unowned_worst[0] <= UNOWNED_BOUND_S

    @property
    def secret_ok(self) -> bool:
        """No password to keep (PLAINTEXT), or one searched for in every log and shown in none."""
        return self.config.kafka_security == "plaintext" or (self.secret_checked > 0 and not self.secret_shown)

    @property
    def ok(self) -> bool:
        return (
            self.verification.ok
            and not self.payload_errors
            and self.caught_up
            and not self.producer_errors
            and self.verification.rows == self.produced
            and self.ownership_ok
            and not self.final_gc_problems
            and not self.table_errors
            and not self.compact_problems
            and self.audit_code == 0
            and self.secret_ok
        )

    def summary(self) -> str:
        kinds = Counter(f.kind for f in self.faults)
        lines = [
            f"chaos run seed={self.config.seed} group protocol {self.config.group_protocol}, "
            f"{self.config.store} store, {self.config.format} records, Spark {self.config.spark}, "
            f"Kafka {self.config.kafka_security}: "
            f"{'OK' if self.ok else 'FAILED'} in {self.elapsed_s:.0f}s",
            f"  records produced {self.produced}, published rows {self.verification.rows}, "
            f"segments {self.verification.segments}, payloads checked {self.payload_rows}",
            f"  exactly-once: {self.verification.summary()}",
            f"  payload mismatches {len(self.payload_errors)}"
            + (f": {self.payload_errors[:3]}" if self.payload_errors else ""),
            f"  broker: {self.broker}",
            f"  caught up: {self.caught_up}; producer errors: {len(self.producer_errors)}"
            + (f": {self.producer_errors[:2]}" if self.producer_errors else ""),
            f"  longest a lagging partition had no live owner: {self.unowned_worst[0]:.1f}s "
            + (
                f"(partition {self.unowned_worst[1]} from t={self.unowned_worst[2]:.1f}s; "
                if self.unowned_worst[1] >= 0
                else "("
            )
            + f"bound {UNOWNED_BOUND_S:.0f}s, {self.ownership_samples} samples of the group): "
            + ("ok" if self.ownership_ok else "EXCEEDED"),
            f"  final gc (no grace) could not sweep: {self.final_gc_problems or 'none'}",
            *(
                [
                    f"  SCRAM password shown in: {', '.join(self.secret_shown) or 'none'} "
                    f"(of {self.secret_checked} process logs and outputs)"
                ]
                if self.config.kafka_security != "plaintext"
                else []
            ),
            *(
                [f"  iceberg table: {self.table_rows} rows; " + ("; ".join(self.table_errors) or "exactly once")]
                if self.config.table
                else []
            ),
            *(
                [f"  compaction: {self.replaced} segments replaced; " + ("; ".join(self.compact_problems) or "ok")]
                if self.config.compact
                else []
            ),
            f"  ingest audit --files: exit {self.audit_code}"
            + ": "
            + " | ".join(self.audit_lines[-1:] if self.audit_code == 0 else self.audit_lines[:20]),
            "  faults injected: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())),
            "  publish conflicts rejected: "
            + (", ".join(f"{k}={n}" for k, n in sorted(self.conflicts.items())) or "0"),
            "  splits killed: " + (", ".join(f"{k}={n}" for k, n in sorted(self.splits_killed.items())) or "0"),
            f"  workers restarted by the supervisor: exited on their own {self.unplanned_exits}, "
            f"unhealthy {self.health_restarts}",
            "  recovery after each fault:",
        ]
        for f in self.faults:
            rec = f"{f.recovery_s:.1f}s" if f.recovery_s is not None else "not measured (no progress seen)"
            lines.append(
                f"    t={f.started:6.1f}s {f.kind:<10} {f.target:<10} lasted {f.ended - f.started:5.1f}s, "
                f"recovered in {rec}"
            )
        if not self.verification.ok:
            v = self.verification

            def head(d: dict[tuple[str, int], list[int]]) -> dict[str, str]:
                return {f"{t}[{p}]": f"{len(o)} from {o[0]}" for (t, p), o in list(d.items())[:4] if o}

            lines.append(
                f"  first problems: missing={head(v.missing)} duplicates={head(v.duplicates)} "
                f"{v.range_errors[:3]} {v.offset_errors[:3]}"
            )
        return "\n".join(lines)
