"""The one line an operator reads of an error: a Spark failure's root cause, not Py4J's
"An error occurred while calling o123.parquet."."""

from __future__ import annotations

from ingest_common.errors import cause_line, first_line

PY4J = """An error occurred while calling o412.parquet.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 7.0 failed 1 times
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)
\tat scala.collection.immutable.List.foreach(List.scala:334)
Caused by: org.apache.spark.SparkException: Writing job aborted
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.jobAbortedError(QueryExecutionErrors.scala:123)
Caused by: org.apache.spark.sql.kafka010.KafkaIllegalStateException: Cannot fetch records in [10, 100) of t-0: \
Some data may have been lost because they are not available in Kafka any more
\tat org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer.reportDataLoss0(KafkaDataConsumer.scala:722)
"""

CONNECT = """(org.apache.spark.sql.kafka010.KafkaIllegalStateException) Cannot fetch records in [10, 100) of t-0

JVM stacktrace:
org.apache.spark.sql.kafka010.KafkaIllegalStateException: Cannot fetch records in [10, 100) of t-0
\tat org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer.reportDataLoss0(KafkaDataConsumer.scala:722)
"""


def test_a_py4j_failure_reads_as_its_root_cause() -> None:
    line = cause_line(RuntimeError(PY4J))
    assert line.startswith("org.apache.spark.sql.kafka010.KafkaIllegalStateException: Cannot fetch records")
    assert first_line(RuntimeError(PY4J)) == "An error occurred while calling o412.parquet."


def test_a_connect_failure_and_a_one_line_error_read_as_their_first_line() -> None:
    assert cause_line(RuntimeError(CONNECT)).startswith("(org.apache.spark.sql.kafka010.KafkaIllegalStateException)")
    assert cause_line(ValueError("bad value")) == "bad value"
    assert cause_line(ValueError()) == "ValueError"
