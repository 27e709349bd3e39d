"""Build: sealed splits and the Spark job that turns a batch of them into Parquet files.

A split is sealed from a partition's buffer (its offsets tile the partition with no gap and
no overlap); a build registers its directories and splits in the metastore, stages each
split, runs one Spark job over the batch and tells the output files apart by their footers.

Invariants: nothing here makes data visible: a build is registered before it writes anything
and its files become a segment only when :mod:`ingest.publish` commits them; a sealed split
is immutable, only its kill switch changes; every failure deletes what the build wrote. This
package knows neither the consumer nor the published offsets: it imports only the shared
modules, :mod:`metastore` and :mod:`ingest_common`.
"""
