-- The gap ledger is keyed by epoch: a partition stops or skips at a given offset once per epoch.
-- After an `ingest reset` replays a partition (a new epoch), the same offsets may be lost again;
-- that is a gap of the new epoch, with a row of its own. Keyed without the epoch, a skip in
-- the new epoch moved the earlier epoch's row into it (`ingest audit` then found a hole in the
-- earlier epoch), and a stop in the new epoch ("fail") met the earlier skipped row and wrote
-- nothing. Every row already here satisfies the wider key. A row moved to a later epoch
-- before this migration stays there: `ingest audit` reports the hole it left, and the
-- ledger cannot tell which epoch it first came from.
ALTER TABLE ingest_offset_gaps DROP CONSTRAINT ingest_offset_gaps_source_topic_partition_from_offset_key;
ALTER TABLE ingest_offset_gaps ADD CONSTRAINT ingest_offset_gaps_epoch_from_offset_key
    UNIQUE (source, topic, partition, epoch, from_offset);
