"""The CI variants of the chaos run (``python -m tests.chaos --quick``): a seeded short schedule
of faults against worker processes, then every published Parquet file is checked. On a local
directory the Iceberg table is on (``--table``): two committers beside the workers through
every fault and a SIGKILLed committer, and the table must hold every record exactly once; that
variant's source starts at ``latest`` after records were produced, which must stay out, and its
workers are thin clients of one Spark Connect server (``--spark connect``: the ``spark`` fault
kills that server and starts a new one). The S3 variant's records are Avro through a local
schema registry, three writer schema versions in turn while the faults go on
(``--format avro``), built by a Spark JVM in each worker, and every client of the run (its
producer, admin calls and end-offset reads, the workers' group members, admin clients and
validators, Spark's Kafka reader, the compactor, the audit) reaches the broker on SASL_SSL with
SCRAM-SHA-512 over TLS (``--kafka-security sasl_ssl``), the password a secret file the workers
read, which shows in no process's log. In both a compactor replaces small segments beside the
workers (``compact_kill`` SIGKILLs it inside a job) and the run ends with ``ingest audit
--files``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import run
from tests.chaos_config import ChaosConfig


@pytest.mark.parametrize(
    ("store", "table", "start_from", "format", "spark", "kafka_security"),
    [
        ("file", True, "latest", "json", "connect", "plaintext"),
        ("s3", False, "earliest", "avro", "local", "sasl_ssl"),
    ],
    ids=["file-table-latest-connect", "s3-avro"],
)
def test_quick_chaos_run_loses_and_duplicates_nothing(
    tmp_path: Path, store: str, table: bool, start_from: str, format: str, spark: str, kafka_security: str
) -> None:
    """On a local directory (Spark Connect) and on an S3 API (Spark through S3A and its magic
    committer) with every Kafka client on SASL_SSL."""
    config = ChaosConfig.quick(
        seed=7,
        workdir=tmp_path,
        store=store,
        table=table,
        start_from=start_from,
        format=format,
        spark=spark,
        kafka_security=kafka_security,
    )
    result = run(config, log=print)
    print(result.summary())
    assert len(result.faults) == config.fault_count
    assert {fault.kind for fault in result.faults} == set(config.faults)
    # Under SIGKILL, SIGSTOP, SIGTERM and added workers no lagging partition stays without a
    # live owner longer than the session timeout plus one rebalance (tests.chaos_config.UNOWNED_BOUND_S).
    assert result.ownership_samples > 0
    assert result.ownership_ok, result.summary()
    if table:
        assert "table_kill" in config.faults
        assert result.table_errors == [], result.summary()
        assert result.table_rows == result.produced
    # A compactor replaced segments all through the run, one SIGKILLed inside a job; the run
    # ends with ``ingest audit --files`` passing over what it left.
    assert "compact_kill" in config.faults
    assert result.replaced > 0, result.summary()
    assert result.audit_code == 0, result.summary()
    if kafka_security != "plaintext":
        # The SCRAM password was searched for in every process's log (each worker's, each
        # compactor's) and the audit's output, and shown in none.
        assert result.secret_checked > config.workers, result.summary()
        assert result.secret_shown == [], result.summary()
        assert "clients on SASL_SSL" in result.broker, result.broker
    if format == "avro":
        # Every record of every writer version decoded (none rejected) with its payload intact.
        assert result.payload_rows == result.produced, result.summary()
    assert result.ok, result.summary()
