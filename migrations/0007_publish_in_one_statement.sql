-- The publish transaction as one statement: a worker sends one call and waits for one reply,
-- instead of a round trip per step (BEGIN, lock, check, insert, ranges, offsets, COMMIT).
-- Each round trip also makes the publishing thread win the Python GIL back from the
-- consumer thread, which cost milliseconds per step on a busy worker.

-- Lock the partition rows of the ranges (fixed order: (topic, partition), the order every
-- locking statement uses, so concurrent publishes never deadlock), then return every range
-- whose check fails, in the same order:
--   missing: the partition has no row (expected: the caller's serial);
--   serial:  the stored serial is not the one the caller saw at assign (expected, stored);
--   offset:  the range does not start at the stored next offset (expected: the range's
--            start, actual: the stored offset). A partition that never published has no
--            stored offset: its first range may start anywhere.
-- No rows returned: every range may be published while the locks are held.
CREATE OR REPLACE FUNCTION ingest_lock_ranges(
    p_source text, p_topics text[], p_partitions integer[], p_serials bigint[], p_starts bigint[])
RETURNS TABLE (reason text, topic text, partition integer, expected bigint, actual bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM ingest_partitions p
    WHERE p.source = p_source
      AND (p.topic, p.partition) IN (SELECT t, n FROM unnest(p_topics, p_partitions) AS u(t, n))
    ORDER BY p.topic, p.partition
    FOR UPDATE;
    -- A new statement (READ COMMITTED): it sees the rows as locked, not as of the call.
    RETURN QUERY
    SELECT CASE WHEN p.serial IS NULL THEN 'missing' WHEN p.serial <> r.serial THEN 'serial' ELSE 'offset' END,
           r.topic, r.partition,
           CASE WHEN p.serial IS NULL OR p.serial <> r.serial THEN r.serial ELSE r.start END,
           CASE WHEN p.serial IS NULL THEN NULL WHEN p.serial <> r.serial THEN p.serial ELSE p.next_offset END
    FROM unnest(p_topics, p_partitions, p_serials, p_starts) AS r(topic, partition, serial, start)
    LEFT JOIN ingest_partitions p
        ON p.source = p_source AND p.topic = r.topic AND p.partition = r.partition
    WHERE p.serial IS NULL OR p.serial <> r.serial OR (p.next_offset IS NOT NULL AND p.next_offset <> r.start)
    ORDER BY r.topic, r.partition;
END;
$$;

-- The serial-guarded publish of one segment. Every check passes: the segment and its
-- ranges are inserted, the partitions' offsets advanced, and the segment's id returned
-- (the other columns NULL). A check fails: nothing of the segment is written, the first
-- failing range is recorded in ingest_publish_conflicts and returned (segment_id NULL).
-- Called as a statement of its own on an autocommit connection, it is one transaction.
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
    new_id bigint;
BEGIN
    SELECT * INTO conflict FROM ingest_lock_ranges(p_source, p_topics, p_partitions, p_serials, p_starts) LIMIT 1;
    IF FOUND THEN
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
