-- Upsert tables (a spec's [table] mode = "upsert"): the data table is the current state per key,
-- each published segment's changes merged into it once (ingest.table.upsert). Its progress is
-- not a set of segments held (a merge copies rows, it registers no segment file) but, per
-- partition, the next offset whose change is not merged yet: a compaction that replaces merged
-- and unmerged segments by one changes nothing of it. The committer advances it with the
-- commit seq, in the catalog's swap (the metastore's catalog) or right after it (another
-- catalog; the table's properties carry the same offsets for the reconcile).
ALTER TABLE ingest_tables
    ADD COLUMN upsert_offsets jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN cross_partition_keys bigint NOT NULL DEFAULT 0 CHECK (cross_partition_keys >= 0);

COMMENT ON COLUMN ingest_tables.upsert_offsets IS
    'upsert tables: {"topic/partition": next offset not merged yet}, as of committed_seq';
COMMENT ON COLUMN ingest_tables.cross_partition_keys IS
    'upsert tables: keys seen on more than one partition (their order is undefined), counted per commit';
