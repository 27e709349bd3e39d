"""Build: the Spark jobs that turn batches of sealed splits into Parquet files.

The build queue takes each split and returns a future; build threads batch the splits waiting,
register each batch's directories and splits in the metastore, and run one Spark job that reads
every split's exact offsets from Kafka, parses and writes them; the output files are told
apart by their footers.

Invariants: nothing here makes data visible: a build is registered before it writes anything
and its files become a segment only when :mod:`ingest.publish` commits them; a sealed split
is immutable, only its kill switch changes; every failure deletes what the build wrote. This
package knows neither the consumer nor the published offsets: it imports only the shared
modules, the hand-off types (:mod:`ingest.splits`), the Spark session (:mod:`ingest.spark`),
the segment files' layout (:mod:`ingest.segments`), :mod:`metastore` and :mod:`ingest_common`.
"""
