"""Benchmark of the ingest workers against a raw ceiling and peers, on one broker and one data set.

``python -m bench --help`` for the flags; ``bench/cli.py`` runs the phases in order:

1. pre-produce the data set once (keyed ~200-byte JSON over N partitions, ``bench/data.py``);
2. raw baseline (``bench/peers/raw.py``, its own process): confluent-kafka + pyarrow JSON + Parquet,
   no guarantees;
3. peer (``bench/peers/quix_app.py``, its own virtualenv): Quix Streams with its local Parquet file sink;
4. Spark Structured Streaming (``bench/peers/spark_app.py``), availableNow;
5. ingest with one worker, then with N workers (``bench/ingest_runs.py``), each from a fresh source;
6. latency under a steady produce rate (publish transaction, produce-to-visible);

then prints one table (``bench/report.py``), writes ``results.json`` and draws ``chart.png``.
``--freshness``, ``--profile`` and ``--fleet`` add the phases below; ``--format avro`` makes the
records Avro in the Confluent wire format (``bench/avro_wire.py``).

The packages, by what they measure:

- ``bench/peers/``: the systems compared with the workers (raw baseline, Quix Streams, Spark
  Structured Streaming);
- ``bench/freshness/``: equal freshness, the highest rate each system keeps within a
  produce-to-visible bound (alone: ``python -m bench.freshness``);
- ``bench/profiling/``: where one worker's CPU goes (alone: ``python -m bench.worker_profile``),
  and ``jfr_top`` for a Flight Recorder recording of any Spark JVM.

Beside them, commands of their own: ``python -m bench.fleet`` (N thin workers on one Spark
Connect server beside N workers with local Spark) and ``python -m bench.compaction`` (small
segments, then one ``ingest compact``: files, sizes and CPU seconds per GB). Shared by all:
``procs`` (process trees, CPU, RSS), ``stats``, ``console``, ``data``, ``ingest_runs`` (the
workers' runs and the exactly-once check).
"""
