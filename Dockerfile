# The worker image: the same steps scripts/setup.sh runs on a fresh Debian 12 machine.
FROM python:3.11.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY ingest ./ingest
COPY metastore ./metastore
COPY migrations ./migrations
# Editable, so that `ingest migrate` finds migrations/ beside the package (pins come from pyproject.toml).
RUN pip install --no-cache-dir -e '.[embedded]'

RUN useradd --create-home --uid 10001 ingest && mkdir -p /data/segments && chown ingest /data/segments
USER ingest

ENV INGEST_METRICS_HOST=0.0.0.0 \
    INGEST_METRICS_PORT=9400 \
    INGEST_LOG_FORMAT=json
EXPOSE 9400
ENTRYPOINT ["ingest"]
CMD ["worker", "clicks"]
