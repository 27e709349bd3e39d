"""What the worker's Spark session is created with, per kind of master; store URIs for pyarrow."""

from __future__ import annotations

import pytest

from ingest.segments.store import arrow_uri
from ingest.spark.session import BASE_CONF, SERVER_ONLY_CONF, session_conf


def test_local_binds_the_driver_to_loopback_and_sizes_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_SPARK_DRIVER_MEMORY", "768m")
    conf = session_conf("local[2]")
    assert conf["spark.driver.host"] == "127.0.0.1" and conf["spark.driver.memory"] == "768m"
    assert conf.items() >= BASE_CONF.items()


def test_a_standalone_cluster_leaves_the_driver_address_to_spark() -> None:
    # Executors elsewhere must reach the driver: a loopback address would strand them.
    conf = session_conf("spark://master:7077")
    assert "spark.driver.host" not in conf and "spark.driver.bindAddress" not in conf
    assert conf.items() >= BASE_CONF.items()


def test_connect_sends_only_runtime_settings() -> None:
    conf = session_conf("sc://spark-connect:15002", {"spark.sql.shuffle.partitions": "8"})
    assert not set(conf) & SERVER_ONLY_CONF
    assert not any(k.startswith("spark.driver.") for k in conf)
    assert conf["spark.sql.session.timeZone"] == "UTC" and conf["spark.sql.shuffle.partitions"] == "8"


def test_s3a_store_uris_name_the_same_objects_for_pyarrow() -> None:
    assert arrow_uri("s3a://bucket/ingest/segments") == "s3://bucket/ingest/segments"
    assert arrow_uri("file:///mnt/segments") == "file:///mnt/segments"
    assert arrow_uri("s3://bucket/x") == "s3://bucket/x"
