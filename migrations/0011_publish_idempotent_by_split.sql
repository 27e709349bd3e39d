-- A publish is idempotent by split id: publishing a split that is already published answers
-- with its segment's id, writes nothing and records no conflict.
--
-- A worker whose connection breaks while its publish waits on the server (for a partition's
-- row lock, say) leaves a server session that goes on and may commit after the worker looked
-- the split up and found nothing. The worker's retry must then learn that its split is
-- published, not be refused as an 'offset' conflict (the orphan advanced next_offset): a
-- refused split's files would be deleted and its records read again.
--
-- The lookup comes after ingest_lock_ranges has locked the partition rows: a publish of the
-- same split that held them committed before they were granted, and this function's next
-- statement (READ COMMITTED, volatile) sees its segment. A publish of the same split still
-- waiting for them comes after this one and finds this one's segment.
--
-- Every other check is the one of migration 0008 (serial and offset under the locks, the split
-- registered by this source and still 'building'), unchanged.
CREATE OR REPLACE FUNCTION ingest_publish_segment(
    p_source text, p_split_id uuid, p_spec_version integer, p_worker text, p_location text, p_files text[],
    p_row_count bigint, p_size_bytes bigint, p_min_event_time timestamptz, p_max_event_time timestamptz,
    p_rejects_location text, p_rejects_files text[], p_rejects_count bigint, p_skipped_count bigint,
    p_topics text[], p_partitions integer[], p_serials bigint[], p_starts bigint[], p_ends bigint[])
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
    SET next_offset = r.stop, last_publish_at = now(), last_segment_id = new_id
    FROM unnest(p_topics, p_partitions, p_ends) AS r(topic, partition, stop)
    WHERE p.source = p_source AND p.topic = r.topic AND p.partition = r.partition;

    RETURN QUERY SELECT new_id, NULL::text, NULL::text, NULL::integer, NULL::bigint, NULL::bigint;
END;
$$;
