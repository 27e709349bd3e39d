-- `ingest audit` (ingest/ops/audit.py): what it needs to prove, from the metastore alone, that
-- each epoch of each partition is tiled by its current segments' ranges and its skipped gaps
-- with no hole and no overlap, and a record of each audit's result (exported as metrics).
--
-- Where each epoch of a partition starts:
-- - epoch 0 at start_offset, the offset its first claim pinned (0010); NULL while nothing is
--   pinned, and for a partition reset before its first claim (its epoch 0 holds nothing);
-- - epoch N > 0 at the new_offset of the partition's N-th row in ingest_reset_partitions (a
--   reset that changes a partition bumps its epoch by one in the same transaction).
-- Where it ends: the next reset's old_offset, or next_offset for the current epoch.
ALTER TABLE ingest_partitions ADD COLUMN start_offset bigint CHECK (start_offset >= 0);
COMMENT ON COLUMN ingest_partitions.start_offset IS
    'Where epoch 0 starts: the offset the first claim pinned. Never changed afterwards (a reset starts a new epoch at its ingest_reset_partitions.new_offset).';

-- A skipped gap belongs to the epoch its partition was in when it was written, as a range does
-- (the same trigger function: the partition's row is locked by skip_gap's lock_ranges).
ALTER TABLE ingest_offset_gaps ADD COLUMN epoch integer NOT NULL DEFAULT 0;
CREATE TRIGGER ingest_offset_gaps_epoch BEFORE INSERT ON ingest_offset_gaps
    FOR EACH ROW EXECUTE FUNCTION ingest_range_epoch();

-- Gaps written before this migration: the resets of their partition that came before them.
UPDATE ingest_offset_gaps g SET epoch = (
    SELECT count(*) FROM ingest_reset_partitions rp JOIN ingest_resets r ON r.id = rp.reset_id
    WHERE r.source = g.source AND rp.topic = g.topic AND rp.partition = g.partition
      AND r.at < coalesce(g.skipped_at, g.detected_at));

-- Partitions pinned before this migration: the lowest offset epoch 0 covers (a range or a
-- skipped gap), else where epoch 0 ended (its first reset's old_offset), else next_offset
-- while still in epoch 0 (nothing published yet). The audit cannot see a hole before the
-- first range of such a partition.
UPDATE ingest_partitions p SET start_offset = coalesce(
    (SELECT min(lo) FROM (
        SELECT min(r.start_offset) AS lo FROM ingest_segment_ranges r
        WHERE r.source = p.source AND r.topic = p.topic AND r.partition = p.partition AND r.epoch = 0
        UNION ALL
        SELECT min(g.from_offset) FROM ingest_offset_gaps g
        WHERE g.source = p.source AND g.topic = p.topic AND g.partition = p.partition AND g.epoch = 0
          AND g.skipped) AS lows),
    (SELECT rp.old_offset FROM ingest_reset_partitions rp JOIN ingest_resets r ON r.id = rp.reset_id
     WHERE r.source = p.source AND rp.topic = p.topic AND rp.partition = p.partition
     ORDER BY rp.reset_id LIMIT 1),
    CASE WHEN p.epoch = 0 THEN p.next_offset END)
WHERE p.next_offset IS NOT NULL;

-- One row per `ingest audit` run: its result in numbers and its first findings. Workers export
-- the newest of their source's as ingest_audit_findings / ingest_audit_last_run_timestamp_seconds.
CREATE TABLE ingest_audits (
    id           bigserial PRIMARY KEY,
    source       text NOT NULL REFERENCES ingest_sources (name),
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    files        boolean NOT NULL,
    tables       boolean NOT NULL,
    partitions   integer NOT NULL CHECK (partitions >= 0),
    segments     integer NOT NULL CHECK (segments >= 0),
    files_read   integer NOT NULL CHECK (files_read >= 0),
    findings     integer NOT NULL CHECK (findings >= 0),
    by_kind      jsonb NOT NULL DEFAULT '{}',
    first_lines  text[] NOT NULL DEFAULT '{}'
);
CREATE INDEX ingest_audits_source_idx ON ingest_audits (source, id DESC);
