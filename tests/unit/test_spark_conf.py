"""What the worker's Spark session is created with, per kind of master; store URIs for pyarrow."""

from __future__ import annotations

import pytest

from ingest.segments.store import arrow_uri
from ingest.spark.session import (
    AVRO_LIMIT_OPTIONS,
    BASE_CONF,
    JVM_OPTIONS_CONF,
    SERVER_ONLY_CONF,
    jvm_options_args,
    session_conf,
)


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
    assert not any(k.startswith(("spark.driver.", "spark.executor.")) for k in conf)
    assert conf["spark.sql.session.timeZone"] == "UTC" and conf["spark.sql.shuffle.partitions"] == "8"


@pytest.mark.parametrize("master", ["local[2]", "spark://master:7077"])
def test_a_driver_launched_here_and_its_executors_bound_avro_lengths(master: str) -> None:
    """Java options the JVMs start with (tests/integration/test_avro_poison.py: what they prevent)."""
    conf = session_conf(master)
    for key in ("spark.driver.defaultJavaOptions", "spark.executor.defaultJavaOptions"):
        assert conf[key] == AVRO_LIMIT_OPTIONS
    assert AVRO_LIMIT_OPTIONS.split() == [
        "-Dorg.apache.avro.limits.string.maxLength=67108864",
        "-Dorg.apache.avro.limits.bytes.maxLength=67108864",
        "-Dorg.apache.avro.limits.collectionItems.maxLength=10000000",
    ]
    # A caller's own options of the same key follow ours (the last -D of a property wins).
    theirs = session_conf(master, {"spark.driver.defaultJavaOptions": "-Dx=1"})["spark.driver.defaultJavaOptions"]
    assert theirs == f"{AVRO_LIMIT_OPTIONS} -Dx=1"
    assert jvm_options_args() == [a for k, v in JVM_OPTIONS_CONF.items() for a in ("--conf", f"{k}={v}")]


def test_s3a_store_uris_name_the_same_objects_for_pyarrow() -> None:
    assert arrow_uri("s3a://bucket/ingest/segments") == "s3://bucket/ingest/segments"
    assert arrow_uri("file:///mnt/segments") == "file:///mnt/segments"
    assert arrow_uri("s3://bucket/x") == "s3://bucket/x"
