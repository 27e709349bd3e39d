# The worker image: the same steps scripts/setup.sh runs on a fresh Debian 12 machine.

# The project's Spark jars (the S3 connector and committer binding, Spark's Kafka source,
# spark-avro, Iceberg's runtime, PostgreSQL's JDBC driver) from Maven Central, pinned by
# scripts/spark-jars/pom.xml: loaded by the workers' local Spark when a segment store is s3a://,
# and always by the Spark Connect service.
FROM maven:3.9.9-eclipse-temurin-17 AS spark-jars
COPY scripts/spark-jars/pom.xml /build/pom.xml
RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -DoutputDirectory=/build/libs

FROM python:3.11.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependencies first, in a layer that changes only with pyproject.toml (pyspark alone is
# hundreds of MB): the project's pinned runtime dependencies, read from its metadata.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt
# The code last, as a regular (non-editable) install: the wheel carries the SQL and the
# migrations (metastore/schema links to migrations/), so `ingest migrate` works from it.
COPY ingest ./ingest
COPY ingest_common ./ingest_common
COPY metastore ./metastore
COPY migrations ./migrations
RUN pip install --no-cache-dir --no-deps . && rm -rf build

COPY --from=spark-jars /build/libs /opt/ingest/spark-jars

RUN useradd --create-home --uid 10001 ingest && mkdir -p /data/segments && chown ingest /data/segments
USER ingest

ENV INGEST_SPARK_JARS_DIR=/opt/ingest/spark-jars \
    INGEST_METRICS_HOST=0.0.0.0 \
    INGEST_METRICS_PORT=9400 \
    INGEST_LOG_FORMAT=json
EXPOSE 9400
ENTRYPOINT ["ingest"]
CMD ["worker", "clicks"]
