-- Live workers: each registers itself and heartbeats; rows whose heartbeat is older than
-- the expiry (status uses 30 s) are dead workers.
CREATE TABLE ingest_workers (
    worker        text PRIMARY KEY,
    source        text NOT NULL,
    host          text NOT NULL,
    pid           integer NOT NULL,
    version       text NOT NULL,
    state         text NOT NULL,
    partitions    text[] NOT NULL DEFAULT '{}',
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ingest_workers_source_idx ON ingest_workers (source, heartbeat_at);

-- Errors workers hit, newest first in status (`recent_errors`).
CREATE TABLE ingest_errors (
    id        bigserial PRIMARY KEY,
    source    text NOT NULL,
    worker    text NOT NULL,
    kind      text NOT NULL,
    message   text NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ingest_errors_source_idx ON ingest_errors (source, id DESC);
