-- What a worker holds back while the schema registry does not answer: the partitions whose
-- splits wait to be built (paused, nothing rejected or skipped; they resume once it answers)
-- and the registry's last error. Written with every heartbeat; `ingest status` shows them.

ALTER TABLE ingest_workers
    ADD COLUMN registry_waiting text[] NOT NULL DEFAULT '{}',
    ADD COLUMN registry_error   text;

COMMENT ON COLUMN ingest_workers.registry_waiting IS
    'partitions (topic[partition]) paused while their splits wait for the schema registry';
COMMENT ON COLUMN ingest_workers.registry_error IS 'the schema registry''s last error while partitions wait for it';
