-- The metastore: the single source of truth for offsets and for which segments exist.

CREATE TABLE ingest_sources (
    name        text PRIMARY KEY,
    version     integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Every applied version of a source's spec; segments record the version that built them.
CREATE TABLE ingest_source_versions (
    source      text NOT NULL REFERENCES ingest_sources (name),
    version     integer NOT NULL,
    spec        jsonb NOT NULL,
    spec_text   text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, version)
);

-- One row per (source, topic, partition).
-- next_offset: the first offset not yet published (NULL: nothing published; start at initial_position).
-- serial: bumped by every assign; a publish must present the serial it saw at assign.
CREATE TABLE ingest_partitions (
    source            text NOT NULL REFERENCES ingest_sources (name),
    topic             text NOT NULL,
    partition         integer NOT NULL CHECK (partition >= 0),
    next_offset       bigint CHECK (next_offset >= 0),
    initial_position  text NOT NULL CHECK (initial_position IN ('earliest', 'latest')),
    serial            bigint NOT NULL DEFAULT 0,
    owner             text,
    assigned_at       timestamptz,
    last_publish_at   timestamptz,
    last_segment_id   bigint,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, topic, partition)
);

CREATE TABLE ingest_segments (
    id                bigserial PRIMARY KEY,
    source            text NOT NULL REFERENCES ingest_sources (name),
    split_id          uuid NOT NULL UNIQUE,
    spec_version      integer NOT NULL,
    worker            text NOT NULL,
    location          text NOT NULL,
    files             text[] NOT NULL,
    row_count         bigint NOT NULL CHECK (row_count >= 0),
    size_bytes        bigint NOT NULL CHECK (size_bytes >= 0),
    min_event_time    timestamptz,
    max_event_time    timestamptz,
    rejects_location  text,
    rejects_files     text[] NOT NULL DEFAULT '{}',
    rejects_count     bigint NOT NULL DEFAULT 0 CHECK (rejects_count >= 0),
    skipped_count     bigint NOT NULL DEFAULT 0 CHECK (skipped_count >= 0),
    published_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ingest_segments_source_idx ON ingest_segments (source, id);

-- The offsets [start_offset, end_offset) of each partition a segment covers.
CREATE TABLE ingest_segment_ranges (
    segment_id    bigint NOT NULL REFERENCES ingest_segments (id),
    source        text NOT NULL,
    topic         text NOT NULL,
    partition     integer NOT NULL,
    start_offset  bigint NOT NULL CHECK (start_offset >= 0),
    end_offset    bigint NOT NULL,
    CHECK (end_offset > start_offset),
    PRIMARY KEY (segment_id, topic, partition)
);
-- No two published ranges of one partition may start at the same offset: a second line
-- of defence behind the next_offset check.
CREATE UNIQUE INDEX ingest_segment_ranges_start_idx ON ingest_segment_ranges (source, topic, partition, start_offset);

-- Publishes the metastore refused (zombie or stale workers): kept for status and audits.
CREATE TABLE ingest_publish_conflicts (
    id            bigserial PRIMARY KEY,
    source        text NOT NULL,
    topic         text NOT NULL,
    partition     integer NOT NULL,
    reason        text NOT NULL CHECK (reason IN ('serial', 'offset', 'missing')),
    worker        text NOT NULL,
    split_id      uuid NOT NULL,
    expected      bigint,
    actual        bigint,
    detected_at   timestamptz NOT NULL DEFAULT now()
);
