"""``python -m ingest_dev.fetch``: what scripts/setup.sh fetches from Maven Central into the
cache (ingest_dev.maven), each with what it needs to run (a Java for the registry and Nessie,
the registry's class-data archive)."""

from __future__ import annotations

import sys

from ingest_dev.maven import (
    fetch_kafka,
    fetch_nessie,
    fetch_schema_registry,
    fetch_spark_jars,
    kafka_version,
    nessie_version,
    schema_registry_version,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m ingest_dev.fetch fetch-kafka | fetch-spark-jars | fetch-schema-registry | fetch-nessie``:
    fetch jars from Maven Central into the cache (scripts/setup.sh). The registry's fetch also
    makes sure a Java runtime it can run on is there (:func:`ingest_dev.java.ensure_java`) and
    records its class-data archive (:func:`ingest_dev.registry.build_class_archive`)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["fetch-kafka"]:
        libs = fetch_kafka()
        print(f"Apache Kafka {kafka_version(libs)}: {libs}")
        return 0
    if args == ["fetch-spark-jars"]:
        jars = fetch_spark_jars()
        print(f"Spark's jars ({len(jars)}): {jars[0].parent}")
        return 0
    if args == ["fetch-schema-registry"]:
        from ingest_dev.java import ensure_java
        from ingest_dev.registry import REGISTRY_MIN_JAVA, build_class_archive

        home = fetch_schema_registry()
        java = ensure_java(REGISTRY_MIN_JAVA)
        archive = build_class_archive()
        print(f"Apicurio Registry {schema_registry_version(home)}: {home} (Java: {java}; class data: {archive.name})")
        return 0
    if args == ["fetch-nessie"]:
        from ingest_dev.java import ensure_java
        from ingest_dev.nessie import NESSIE_MIN_JAVA

        jar = fetch_nessie()
        java = ensure_java(NESSIE_MIN_JAVA)
        print(f"Project Nessie {nessie_version(jar)}: {jar} (Java: {java})")
        return 0
    usage = "usage: python -m ingest_dev.fetch fetch-kafka | fetch-spark-jars | fetch-schema-registry | fetch-nessie"
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
