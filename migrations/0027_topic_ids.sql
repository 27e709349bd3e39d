-- A topic deleted and re-created under the same name is another log (KIP-516: Kafka gives every
-- topic an id of its own, and a new topic a new one), but its offsets start again at 0 and its
-- leader epoch too, so neither the stored offset nor its leader epoch (migration 0020) can tell
-- the new log from the old: a worker resuming at next_offset would skip the new log's records
-- below it. Each partition's row holds the id of the topic whose log next_offset is in, recorded
-- by a claim (ingest.consume.rebalance) and compared with Kafka's at every claim and every
-- log-end answer (ingest.consume.log_ends, ingest.consume.gaps): another id stops the partition
-- as a truncated log does, and `ingest reset` records the id of the topic it resumes in.
-- NULL: not known yet (a row of an earlier release, or a reset that could not ask Kafka): the
-- next claim or log-end answer records the id Kafka has then.
ALTER TABLE ingest_partitions ADD COLUMN topic_id text;
COMMENT ON COLUMN ingest_partitions.topic_id IS
    'Kafka''s id of the topic (KIP-516, as Kafka prints it) whose log next_offset is in: set by the claim that first knew it and by resets; NULL until known.';

-- The gap a re-created topic leaves: the new log's offsets [0, next_offset) hold records never
-- read, and the records published below next_offset are no longer the log's. Recorded with the
-- stored topic id and Kafka's new one, never skipped (the partition stays stopped until a reset).
ALTER TABLE ingest_offset_gaps ADD COLUMN old_topic_id text;
ALTER TABLE ingest_offset_gaps ADD COLUMN new_topic_id text;
ALTER TABLE ingest_offset_gaps DROP CONSTRAINT ingest_offset_gaps_reason_check;
ALTER TABLE ingest_offset_gaps ADD CONSTRAINT ingest_offset_gaps_reason_check
    CHECK (reason IN ('retention', 'log_truncated', 'topic_recreated'));
