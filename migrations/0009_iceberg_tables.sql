-- Published segments as Apache Iceberg tables (ingest/table/), per source, off by default.
--
-- The Iceberg catalog is pyiceberg's SQL catalog in this database: its two tables are created
-- here (pyiceberg's schema v1, column for column) so that the catalog never runs DDL itself.
-- A table's current metadata file is the row's metadata_location; a commit replaces it with a
-- compare-and-swap on the old value (a concurrent commit makes the other one fail).
CREATE TABLE IF NOT EXISTS iceberg_tables (
    catalog_name                varchar(255) NOT NULL,
    table_namespace             varchar(255) NOT NULL,
    table_name                  varchar(255) NOT NULL,
    metadata_location           varchar(1000),
    previous_metadata_location  varchar(1000),
    iceberg_type                varchar(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name)
);

CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
    catalog_name    varchar(255) NOT NULL,
    namespace       varchar(255) NOT NULL,
    property_key    varchar(255) NOT NULL,
    property_value  varchar(1000) NOT NULL,
    PRIMARY KEY (catalog_name, namespace, property_key)
);

-- One row per Iceberg table a source feeds: 'data' (the segments' files) and, when rejects go
-- to a table, 'rejects' (the segments' rejects files). committed_seq is the number of the last
-- Iceberg commit the committer recorded; the table's own property `ingest.commit-seq` is the
-- number of the last commit the table holds. They differ by at most one, only after a crash
-- between the two writes, and the committer reconciles before it appends anything.
CREATE TABLE ingest_tables (
    source           text NOT NULL REFERENCES ingest_sources (name),
    kind             text NOT NULL CHECK (kind IN ('data', 'rejects')),
    partition_by     text NOT NULL CHECK (partition_by IN ('none', 'hour', 'day', 'month', 'year')),
    enabled_at       timestamptz NOT NULL DEFAULT now(),
    committed_seq    bigint NOT NULL DEFAULT 0 CHECK (committed_seq >= 0),
    last_snapshot_id bigint,
    last_commit_at   timestamptz,
    PRIMARY KEY (source, kind)
);

-- Every segment a table holds (or that had no file of the table's kind: seq NULL). A set, not
-- a high-water mark: segment ids are taken when a publish transaction inserts and become
-- visible when it commits, so a smaller id can appear after a larger one was committed.
CREATE TABLE ingest_table_segments (
    source        text NOT NULL,
    kind          text NOT NULL,
    segment_id    bigint NOT NULL REFERENCES ingest_segments (id),
    seq           bigint,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, kind, segment_id),
    FOREIGN KEY (source, kind) REFERENCES ingest_tables (source, kind)
);
CREATE INDEX ingest_table_segments_seq_idx ON ingest_table_segments (source, kind, seq);
