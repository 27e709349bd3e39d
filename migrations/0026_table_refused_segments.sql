-- Segments an Iceberg table cannot take (ingest.table.committer): the committer's append of a
-- segment failed because of the segment's files themselves (a value Iceberg's column statistics
-- cannot hold: a string that is not UTF-8, a timestamp outside years 1-9999; a file that does not
-- read as Parquet), not because a server was unreachable. Such a segment is not skipped: it stays
-- pending (no ingest_table_segments row), the committer appends the segments after it and tries
-- it again on a backoff, and `ingest status`, `ingest table`, `ingest audit` and the committer's
-- /healthz and /readyz name it with its error. Its row is deleted in the transaction that records
-- the commit appending it (metastore/tables.py, _write); a row whose segment is no longer current
-- (compaction replaced it) is shown nowhere.
CREATE TABLE ingest_table_refusals (
    source      text NOT NULL,
    kind        text NOT NULL,
    segment_id  bigint NOT NULL REFERENCES ingest_segments (id),
    error       text NOT NULL,
    attempts    integer NOT NULL DEFAULT 1 CHECK (attempts > 0),
    first_at    timestamptz NOT NULL DEFAULT now(),
    last_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, kind, segment_id),
    FOREIGN KEY (source, kind) REFERENCES ingest_tables (source, kind)
);

COMMENT ON TABLE ingest_table_refusals IS
    'published segments a table could not take because of their files: pending, retried, reported';
