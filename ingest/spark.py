"""The worker's one long-lived SparkSession: local, standalone (``spark://``) or Spark
Connect (``sc://``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# What every build relies on: UTC, microsecond timestamps, no _SUCCESS or .crc litter.
BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.file.impl.disable.cache": "true",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    # A batch build reads one staged file per split and tells output files apart by split:
    # a file's open cost equal to the partition size keeps every staged file in a task of
    # its own (Spark would otherwise pack small files together).
    "spark.sql.files.maxPartitionBytes": "134217728",
    "spark.sql.files.openCostInBytes": "134217728",
}
# Static settings of the Spark application itself: under Spark Connect the driver is the
# server, which owns them (they are set on its command line), and a client that tries to
# set them only gets a CANNOT_MODIFY_CONFIG warning.
SERVER_ONLY_CONF = frozenset({"spark.ui.enabled", "spark.ui.showConsoleProgress"})
# Only for local[N]: the executors live in this JVM, so the driver needs no address others can
# reach. A standalone cluster's executors must connect back, so Spark picks the address there.
LOCAL_DRIVER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def create_session(master: str = "local[2]", app_name: str = "ingest",
                   extra_conf: Mapping[str, str] | None = None) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    # Under Connect, everything in session_conf is a runtime SQL setting, applied to this
    # client's own server-side session (several workers share one server without interfering).
    builder = builder.remote(master) if is_connect(master) else builder.master(master)
    for key, value in session_conf(master, extra_conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not is_connect(master):  # a Connect session has no SparkContext
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def is_connect(master: str) -> bool:
    return master.startswith("sc://")


def session_conf(master: str, extra_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings the worker's session is created with. Anything else (jars such as
    hadoop-aws, fs.s3a.* credentials) comes from spark-defaults.conf in SPARK_CONF_DIR when
    this process is the driver (local, spark://), or from the Connect server's command line."""
    if is_connect(master):
        conf = {k: v for k, v in BASE_CONF.items() if k not in SERVER_ONLY_CONF}
    else:
        conf = dict(BASE_CONF)
        if master.startswith("local"):
            conf.update(LOCAL_DRIVER_CONF)
        conf["spark.driver.memory"] = os.environ.get("INGEST_SPARK_DRIVER_MEMORY", "2g")
    conf.update(extra_conf or {})
    return conf
