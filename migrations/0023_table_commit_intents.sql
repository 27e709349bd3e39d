-- Iceberg tables in a catalog outside the metastore (a spec's [table] catalog: REST, Glue, Hive...).
--
-- The metastore's own catalog swaps a table's metadata pointer in a transaction of this
-- database, and the commit is recorded in that same transaction (metastore/tables.py,
-- fence_commit). Another catalog's swap is no transaction of this database: the committer
-- records the commit after it. Before it, in one transaction, the committer checks its batch
-- as the fence does (the table's recorded commit is one short, each segment it appends is
-- current and held by no commit, the held segments it takes out are exactly those its segments
-- replaced) and records an intent: the commit's number and the segments it appends. The check
-- locks those segments (FOR SHARE), so a replacement of them is ordered after the intent.
--
-- An intent is live while its table's recorded commit (ingest_tables.committed_seq) is below
-- its seq. gc never deletes the files of a segment a live intent names (queries.sql,
-- replaced_to_delete and lock_replaced_for_delete): a committer frozen between its intent and
-- its catalog swap may still put them in the table when it wakes. Once the table's commit seq is
-- recorded, the intent is settled: either it was this commit (its segments are held, and kept
-- as any held segment) or another commit took that number, after which the catalog refuses this
-- one (it asserts the table's branch head it was built on, and every commit moves it). Settled
-- intents are deleted when a commit is recorded. A committer that never wakes leaves at worst
-- the files of its segments undeleted until the table's next commit: never a row in the table.
CREATE TABLE ingest_table_intents (
    id           bigserial PRIMARY KEY,
    source       text NOT NULL,
    kind         text NOT NULL,
    seq          bigint NOT NULL CHECK (seq > 0),
    segment_ids  bigint[] NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (source, kind) REFERENCES ingest_tables (source, kind)
);
CREATE INDEX ingest_table_intents_seq_idx ON ingest_table_intents (source, kind, seq);

COMMENT ON TABLE ingest_table_intents IS
    'table commits to an external catalog chosen and checked, not yet recorded: gc keeps their segments'' files';
