"""The peer a PySpark user would pick: Spark Structured Streaming, Kafka source -> Parquet file sink.

Runs as a plain script in a subprocess of the project's Python (bench/peers/spark.py), on the
product's own pyspark with Spark's Kafka source from the project's pinned jar set; it imports
nothing from ``bench`` or ``ingest``, so it is set up the way a PySpark user would write it.

    python bench/peers/spark_app.py --bootstrap H:P --topic T --starting-offsets JSON
        --schema JSON --jars A.jar,B.jar --out DIR --checkpoint DIR --expected N
        (--available-now | --processing-time S) --result FILE [--ready FILE] [--avro-schema JSON]

Values are JSON parsed with ``from_json``, or with ``--avro-schema`` Avro in the Confluent wire
format, parsed with ``from_avro`` after a ``substring`` drops the 5-byte header.

In ``--processing-time`` mode the row count to wait for may come later, in ``--expected-file``,
or the query runs until ``--stop-file`` exists (the freshness run, bench/freshness/phase.py).
The query is exactly-once by Spark's own means: offsets in the checkpoint, output files made
visible by the sink's ``_spark_metadata`` log.  ``--available-now`` reads everything up to the
log ends at start and stops (the throughput run); ``--processing-time`` runs micro-batches every
S seconds until ``--expected`` rows have been committed (the produce-to-visible run), writing
``--ready`` once the first (empty) batch has completed so the bench starts producing after it.

Writes one JSON object to ``FILE``: wall times around the query, rows committed (read back
through ``_spark_metadata``), files and bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _ddl(schema: dict[str, str]) -> str:
    # `ts` etc. as Spark DDL: the bench's schema uses Spark's own type names.
    return ", ".join(f"`{name}` {kind}" for name, kind in schema.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark_app")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--starting-offsets", required=True, help='Spark JSON: {"topic": {"0": 0, ...}}')
    parser.add_argument("--schema", required=True, help="JSON object: field -> Spark type name")
    parser.add_argument("--jars", required=True, help="comma-separated: the Kafka connector and its dependencies")
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--expected", type=int, help="rows the run must commit")
    parser.add_argument(
        "--expected-file", help="(--processing-time) holds the rows to commit once the bench has produced them"
    )
    parser.add_argument("--avro-schema", help="values are Avro in the Confluent wire format, of this writer schema")
    parser.add_argument("--stop-file", help="(--processing-time) run until this file exists")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--available-now", action="store_true")
    mode.add_argument("--processing-time", type=float, help="trigger interval, seconds")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument(
        "--dictionary-page-bytes", type=int, help="parquet.dictionary.page.size of the output (default Parquet's)"
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--result", required=True)
    parser.add_argument("--ready", help="written once the query's first batch completed (--processing-time)")
    args = parser.parse_args(argv)
    if [args.expected is not None, args.expected_file is not None, args.stop_file is not None].count(True) != 1:
        parser.error("exactly one of --expected, --expected-file and --stop-file")
    if args.stop_file and args.processing_time is None:
        parser.error("--stop-file needs --processing-time")

    from pyspark.sql import SparkSession  # type: ignore[import-not-found,unused-ignore]
    from pyspark.sql import functions as F  # type: ignore[import-not-found,unused-ignore]

    launched = time.time()
    builder = (
        SparkSession.builder.master(args.master)
        .appName("bench-peer-spark")
        .config("spark.jars", args.jars)
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # The same Parquet output the workers write: zstd, microsecond timestamps.
        .config("spark.sql.parquet.compression.codec", "zstd")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        # One partition of output per Kafka partition, as Spark plans it: no shuffle anywhere.
        .config("spark.sql.shuffle.partitions", "2")
    )
    if args.dictionary_page_bytes:
        builder = builder.config("spark.hadoop.parquet.dictionary.page.size", str(args.dictionary_page_bytes))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    session_ready = time.time()
    schema = _ddl(json.loads(args.schema))
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .option("failOnDataLoss", "true")
        .load()
    )
    if args.avro_schema:
        from pyspark.sql.avro.functions import from_avro  # type: ignore[import-not-found,unused-ignore]

        # The Confluent wire format: a magic byte and a 4-byte schema id, then the Avro body,
        # written with the one writer schema given (no registry look-up per record).
        body = F.expr("substring(value, 6, length(value) - 5)")
        record = from_avro(body, args.avro_schema).alias("r")
    else:
        record = F.from_json(F.col("value").cast("string"), schema).alias("r")
    parsed = source.select(
        record,
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        F.col("timestamp").alias("_timestamp"),
    ).select("r.*", "_partition", "_offset", "_timestamp")
    writer = (
        parsed.writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint)
        .outputMode("append")
    )
    writer = (
        writer.trigger(availableNow=True)
        if args.available_now
        else writer.trigger(processingTime=f"{args.processing_time} seconds")
    )
    started = time.time()
    query = writer.start()
    deadline = started + args.timeout
    committed = 0
    ready_written = False
    timed_out = False
    while query.isActive:
        if time.time() > deadline:
            timed_out = True
            query.stop()
            break
        if args.stop_file:
            # No progress polling here: each call is a Py4J round trip costing the measured run CPU.
            if Path(args.stop_file).exists():
                query.stop()
                break
            time.sleep(0.2)
            continue
        if args.processing_time is not None:
            progress = query.recentProgress
            if progress and not ready_written and args.ready:
                Path(args.ready).write_text("ready")
                ready_written = True
            committed = sum(int(p["numInputRows"]) for p in progress) if progress else committed
            if args.expected is None and args.expected_file and Path(args.expected_file).exists():
                args.expected = int(Path(args.expected_file).read_text())
            if args.expected is not None and committed >= args.expected:
                query.stop()
                break
        time.sleep(0.05)
    if not timed_out:
        query.awaitTermination()
    finished = time.time()
    error = query.exception()
    # Read back through the sink's metadata log: only committed files count.
    rows = spark.read.parquet(args.out).count() if Path(args.out, "_spark_metadata").exists() else 0
    files = [p for p in Path(args.out).glob("*.parquet")]
    result: dict[str, Any] = {
        "ok": error is None and not timed_out and (rows == args.expected or args.stop_file is not None),
        "expected": args.expected,
        "error": None if error is None else str(error)[:2000],
        "timed_out": timed_out,
        "launched_at": launched,
        "session_ready_at": session_ready,
        "query_started_at": started,
        "query_finished_at": finished,
        "rows": rows,
        "files": len(files),
        "file_bytes": sum(p.stat().st_size for p in files),
        "spark_version": spark.version,
    }
    Path(args.result).write_text(json.dumps(result))
    spark.stop()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
