-- A pattern source's partitions of a topic deleted from Kafka (spec topic_pattern): retired, not
-- dropped. Their rows keep next_offset, epochs and segments, so `ingest audit` checks their
-- published ranges as any other's; `ingest status` shows them RETIRED (no lag, never stuck).
-- A worker of the source's group that finds the topic gone from the cluster's metadata sets
-- retired_at (ingest.consume.topic_watch; idempotent: an unretired row only). A reset clears it
-- (a topic re-created under the same name is read again only after `ingest reset`).
ALTER TABLE ingest_partitions ADD COLUMN retired_at timestamptz;

COMMENT ON COLUMN ingest_partitions.retired_at IS
    'when a worker found this partition''s topic deleted (pattern sources); NULL while live';
