"""The systems the workers are measured against, each in a process of its own.

- the raw baseline: ``raw`` (confluent-kafka + pyarrow JSON + Parquet, no guarantees; run as
  ``python -m bench.peers.raw``), started and read back by ``raw_run``;
- Quix Streams: ``quix_app`` (a plain script in the peer's own virtualenv), found, set up and run
  by ``quix``;
- Spark Structured Streaming: ``spark_app`` (a plain script on the project's pyspark), run by
  ``spark``.

The two scripts run from this directory, which is then first on their ``sys.path``: no module
here may be named like a standard library module (tests/unit/test_bench_module_names.py).
"""
