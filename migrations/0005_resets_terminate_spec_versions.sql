-- Operating a source: audited offset resets, terminated sources, spec versions seen by
-- workers, and NOTIFY on every control change (workers LISTEN; the heartbeat poll stays
-- as the fallback).

-- terminating: like draining without --stay, then `terminated` (set by `ingest terminate`
-- once every worker drained). Workers of a terminating or terminated source exit after
-- publishing what they hold and refuse to start.
ALTER TABLE ingest_sources DROP CONSTRAINT ingest_sources_desired_state_check;
ALTER TABLE ingest_sources
    ADD CONSTRAINT ingest_sources_desired_state_check
        CHECK (desired_state IN ('running', 'suspended', 'draining', 'terminating', 'terminated')),
    ADD COLUMN terminated_at timestamptz,
    -- Bumped by every `ingest reset`: workers that see it change re-claim their reset partitions.
    ADD COLUMN reset_generation bigint NOT NULL DEFAULT 0;

-- One row per `ingest reset` that changed something.
CREATE TABLE ingest_resets (
    id          bigserial PRIMARY KEY,
    source      text NOT NULL REFERENCES ingest_sources (name),
    actor       text NOT NULL,
    reason      text NOT NULL DEFAULT '',
    target      text NOT NULL,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ingest_resets_source_idx ON ingest_resets (source, id DESC);

-- Per partition of a reset: the stored offset before and after, and what it skipped
-- ([skipped_start, skipped_end): never published) or replays ([replayed_start,
-- replayed_end): published once already, published again after the reset).
-- last_segment_id: the partition's last segment before the reset; its later segments
-- belong to the new epoch (the exactly-once checker verifies each epoch on its own).
CREATE TABLE ingest_reset_partitions (
    reset_id         bigint NOT NULL REFERENCES ingest_resets (id),
    topic            text NOT NULL,
    partition        integer NOT NULL,
    old_offset       bigint,
    new_offset       bigint NOT NULL CHECK (new_offset >= 0),
    old_serial       bigint NOT NULL,
    new_serial       bigint NOT NULL,
    last_segment_id  bigint,
    skipped_start    bigint,
    skipped_end      bigint,
    replayed_start   bigint,
    replayed_end     bigint,
    PRIMARY KEY (reset_id, topic, partition)
);

-- The spec version each worker builds with (status shows a fleet mid-upgrade).
ALTER TABLE ingest_workers ADD COLUMN spec_version integer;

-- Every change of a source row (apply, suspend/resume/drain/terminate, reset) notifies
-- channel ingest_control with the source's name; delivered when the transaction commits.
CREATE FUNCTION ingest_notify_control() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ingest_control', NEW.name);
    RETURN NULL;
END;
$$;

CREATE TRIGGER ingest_sources_notify AFTER INSERT OR UPDATE ON ingest_sources
    FOR EACH ROW EXECUTE FUNCTION ingest_notify_control();

-- Epochs: a reset starts a new epoch of each partition it changes. A replay publishes the
-- same offsets again, so the "no two ranges start at the same offset" second line of
-- defence (behind the next_offset check) holds per epoch. A range takes its partition's
-- epoch when inserted (the publish holds the partition row locked, so it cannot change).
ALTER TABLE ingest_partitions ADD COLUMN epoch integer NOT NULL DEFAULT 0;
ALTER TABLE ingest_segment_ranges ADD COLUMN epoch integer NOT NULL DEFAULT 0;
DROP INDEX ingest_segment_ranges_start_idx;
CREATE UNIQUE INDEX ingest_segment_ranges_start_idx
    ON ingest_segment_ranges (source, topic, partition, epoch, start_offset);

CREATE FUNCTION ingest_range_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT p.epoch INTO NEW.epoch FROM ingest_partitions p
    WHERE p.source = NEW.source AND p.topic = NEW.topic AND p.partition = NEW.partition;
    NEW.epoch := coalesce(NEW.epoch, 0);
    RETURN NEW;
END;
$$;

CREATE TRIGGER ingest_segment_ranges_epoch BEFORE INSERT ON ingest_segment_ranges
    FOR EACH ROW EXECUTE FUNCTION ingest_range_epoch();
