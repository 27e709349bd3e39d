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
}
# Static settings of the Spark application itself: under Spark Connect the driver is the
# server, which owns them (they are set on its command line), and a client that tries to
# set them only gets a CANNOT_MODIFY_CONFIG warning.
SERVER_ONLY_CONF = frozenset({"spark.ui.enabled", "spark.ui.showConsoleProgress"})
# Only meaningful when the driver runs here; loopback only.
LOCAL_DRIVER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def create_session(master: str = "local[2]", app_name: str = "ingest",
                   extra_conf: Mapping[str, str] | None = None) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    conf = dict(BASE_CONF)
    if is_connect(master):
        # Everything left in conf is a runtime SQL setting, applied to this client's own
        # server-side session (several workers can share one server without interfering).
        builder = builder.remote(master)
        conf = {k: v for k, v in conf.items() if k not in SERVER_ONLY_CONF}
    else:
        builder = builder.master(master)
        conf.update(LOCAL_DRIVER_CONF)
        conf["spark.driver.memory"] = os.environ.get("INGEST_SPARK_DRIVER_MEMORY", "2g")
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not is_connect(master):  # a Connect session has no SparkContext
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def is_connect(master: str) -> bool:
    return master.startswith("sc://")
