"""Benchmark of the ingest workers against a raw ceiling and a peer, on one broker and one data set.

``python -m bench --help`` for the flags; ``bench/cli.py`` runs the phases in order:

1. pre-produce the data set once (keyed ~200-byte JSON over N partitions);
2. raw baseline (``bench/raw.py``, its own process): confluent-kafka + pyarrow JSON + Parquet, no guarantees;
3. peer (``bench/peer_quix.py``, its own virtualenv): Quix Streams with its local Parquet file sink;
4. ingest with one worker, then with N workers (``python -m ingest worker``), each from a fresh source;
5. latency under a steady produce rate on the N-worker fleet (publish transaction, produce-to-visible);

then prints one table, writes ``results.json`` and draws ``chart.png``. With ``--freshness``, then
the equal-freshness phase (``bench/freshness.py``; alone: ``python -m bench.freshness``); with
``--format avro`` the records are Avro in the Confluent wire format (``bench/avro_wire.py``).
``python -m bench.worker_profile`` profiles one worker per thread and function (``bench/profile_agent.py``).

Beside it, modules run on their own (``python -m bench.NAME``): ``publish``, ``fleet`` (N thin
workers on one Spark Connect server beside N workers with local Spark), and ``compaction``
(small segments, then one ``ingest compact``: files, sizes and CPU seconds per GB).
"""
