"""Exactly-once Kafka ingestion workers.

The protocol is visible from the module list:

- ``loop``        polls Kafka, routes records into per-partition buffers, pauses on backpressure
- ``rebalance``   assign / revoke / lost callbacks: claim partitions, trip kill switches
- ``split``       per-partition buffers, sealed splits and their kill switches
- ``pipeline``    builds sealed splits concurrently and publishes them in offset order
- ``builder``     Spark turns a sealed split into Parquet files (invisible until published)
- ``publisher``   the serial-guarded metastore transaction that makes a segment visible
"""

__version__ = "0.1.0"
