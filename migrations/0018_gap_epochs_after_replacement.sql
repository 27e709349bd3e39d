-- A skipped gap takes its partition's epoch from the trigger it shares with the ranges
-- (ingest_range_epoch, 0013). Since 0017 that trigger fills an epoch only when none is given,
-- so the column must have no default: with DEFAULT 0 every gap skipped after a reset would
-- land in epoch 0 and `ingest audit` would find it outside its epoch.
ALTER TABLE ingest_offset_gaps ALTER COLUMN epoch DROP DEFAULT;
