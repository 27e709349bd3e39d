-- KIP-320 truncation detection: a partition's stored position is next_offset together with the
-- Kafka leader epoch of the record at next_offset - 1 (the last one published), so a worker can
-- ask the broker (OffsetForLeaderEpoch, through librdkafka's seek) whether the log it resumes in
-- is still the one that record came from. NULL: no epoch known (nothing published since a pin,
-- a reset or a skipped gap; a split ending on offsets without records; published by a worker
-- of an earlier release): the position is then used without validation.
ALTER TABLE ingest_partitions ADD COLUMN leader_epoch integer;
COMMENT ON COLUMN ingest_partitions.leader_epoch IS
    'Kafka leader epoch of the record at next_offset - 1, set by the publish that stored next_offset; NULL when unknown (pins, resets, skipped gaps).';

-- Why a range of offsets was lost: retention (offset out of range below the log start) or a log
-- truncation (an unclean leader election, a lost broker log: the records published at these
-- offsets are no longer the log's, which holds other records there now).
ALTER TABLE ingest_offset_gaps ADD COLUMN reason text NOT NULL DEFAULT 'retention'
    CHECK (reason IN ('retention', 'log_truncated'));

-- The publish stores each range's leader epoch with its end (p_leader_epochs, NULL elements
-- allowed). Every check is the one of migration 0011, unchanged.
CREATE FUNCTION ingest_publish_segment(
    p_source text, p_split_id uuid, p_spec_version integer, p_worker text, p_location text, p_files text[],
    p_row_count bigint, p_size_bytes bigint, p_min_event_time timestamptz, p_max_event_time timestamptz,
    p_rejects_location text, p_rejects_files text[], p_rejects_count bigint, p_skipped_count bigint,
    p_topics text[], p_partitions integer[], p_serials bigint[], p_starts bigint[], p_ends bigint[], p_leader_epochs integer[])
RETURNS TABLE (segment_id bigint, reason text, topic text, partition integer, expected bigint, actual bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    conflict record;
    split_state text;
    refused boolean;
    new_id bigint;
BEGIN
    SELECT * INTO conflict FROM ingest_lock_ranges(p_source, p_topics, p_partitions, p_serials, p_starts) LIMIT 1;
    refused := FOUND;

    -- Already published (a retry after a lost reply): its id, whatever the checks say now.
    SELECT s.id INTO new_id FROM ingest_segments s WHERE s.split_id = p_split_id AND s.source = p_source;
    IF new_id IS NOT NULL THEN
        RETURN QUERY SELECT new_id, NULL::text, NULL::text, NULL::integer, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;

    IF NOT refused THEN
        -- Locks the split's row: gc's abandon and this publish are serialized on it.
        UPDATE ingest_splits s SET state = 'published', settled_at = now()
        WHERE s.split_id = p_split_id AND s.source = p_source AND s.state = 'building'
        RETURNING s.state INTO split_state;
        IF split_state IS NULL THEN
            SELECT s.state INTO split_state FROM ingest_splits s
            WHERE s.split_id = p_split_id AND s.source = p_source;
            IF split_state IS NOT NULL OR cardinality(p_files) > 0 OR cardinality(p_rejects_files) > 0 THEN
                SELECT CASE WHEN split_state IS NULL THEN 'unregistered' ELSE 'abandoned' END AS reason,
                       p_topics[1] AS topic, p_partitions[1] AS partition, NULL::bigint AS expected,
                       NULL::bigint AS actual
                INTO conflict;
                refused := true;
            END IF;
        END IF;
    END IF;
    IF refused THEN
        INSERT INTO ingest_publish_conflicts (source, topic, partition, reason, worker, split_id, expected, actual)
        VALUES (p_source, conflict.topic, conflict.partition, conflict.reason, p_worker, p_split_id,
                conflict.expected, conflict.actual);
        RETURN QUERY SELECT NULL::bigint, conflict.reason, conflict.topic, conflict.partition,
                            conflict.expected, conflict.actual;
        RETURN;
    END IF;

    INSERT INTO ingest_segments (
        source, split_id, spec_version, worker, location, files, row_count, size_bytes,
        min_event_time, max_event_time, rejects_location, rejects_files, rejects_count, skipped_count)
    VALUES (
        p_source, p_split_id, p_spec_version, p_worker, p_location, p_files, p_row_count, p_size_bytes,
        p_min_event_time, p_max_event_time, p_rejects_location, p_rejects_files, p_rejects_count, p_skipped_count)
    RETURNING id INTO new_id;

    INSERT INTO ingest_segment_ranges (segment_id, source, topic, partition, start_offset, end_offset)
    SELECT new_id, p_source, r.topic, r.partition, r.start, r.stop
    FROM unnest(p_topics, p_partitions, p_starts, p_ends) AS r(topic, partition, start, stop);

    UPDATE ingest_partitions p
    SET next_offset = r.stop, leader_epoch = r.leader_epoch, last_publish_at = now(), last_segment_id = new_id
    FROM unnest(p_topics, p_partitions, p_ends, p_leader_epochs) AS r(topic, partition, stop, leader_epoch)
    WHERE p.source = p_source AND p.topic = r.topic AND p.partition = r.partition;

    RETURN QUERY SELECT new_id, NULL::text, NULL::text, NULL::integer, NULL::bigint, NULL::bigint;
END;
$$;

-- The signature of 0011, for a worker of the previous release during a rolling upgrade: its
-- publishes store no epoch, so the partition's position is used unvalidated afterwards (an
-- epoch left from an earlier publish would not belong to the new next_offset).
CREATE OR REPLACE FUNCTION ingest_publish_segment(
    p_source text, p_split_id uuid, p_spec_version integer, p_worker text, p_location text, p_files text[],
    p_row_count bigint, p_size_bytes bigint, p_min_event_time timestamptz, p_max_event_time timestamptz,
    p_rejects_location text, p_rejects_files text[], p_rejects_count bigint, p_skipped_count bigint,
    p_topics text[], p_partitions integer[], p_serials bigint[], p_starts bigint[], p_ends bigint[])
RETURNS TABLE (segment_id bigint, reason text, topic text, partition integer, expected bigint, actual bigint)
LANGUAGE sql AS $$
    SELECT * FROM ingest_publish_segment(
        p_source, p_split_id, p_spec_version, p_worker, p_location, p_files, p_row_count, p_size_bytes,
        p_min_event_time, p_max_event_time, p_rejects_location, p_rejects_files, p_rejects_count,
        p_skipped_count, p_topics, p_partitions, p_serials, p_starts, p_ends,
        array_fill(NULL::integer, ARRAY[cardinality(p_topics)]));
$$;
