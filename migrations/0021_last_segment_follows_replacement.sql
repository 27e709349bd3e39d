-- A partition's last_segment_id follows segment replacements (compaction).
--
-- last_segment_id names the segment of a partition's last publish: status shows it (and the
-- last event time through ingest_partition_status), a reset records it as the end of the
-- partition's epoch. Once compaction replaced that segment, `ingest segments` no longer lists
-- it; the replacement covers the same last range (and every offset before it that the old
-- segments held), so the replacement re-points last_segment_id to itself in its transaction.
-- Epoch bounds stay right: the replacement's id is above every segment published before it
-- and below every one published after it, like the id it takes over; its ranges keep their
-- epoch (0017).
--
-- Partitions that point to an already replaced segment are moved along the replacement chain
-- to the current segment once, here.
WITH RECURSIVE chain (start_id, id, replaced_by) AS (
    SELECT s.id, s.id, s.replaced_by FROM ingest_segments s
    WHERE s.replaced_by IS NOT NULL AND s.id IN (SELECT p.last_segment_id FROM ingest_partitions p)
  UNION ALL
    SELECT c.start_id, s.id, s.replaced_by FROM chain c JOIN ingest_segments s ON s.id = c.replaced_by
)
UPDATE ingest_partitions p SET last_segment_id = c.id
FROM chain c
WHERE p.last_segment_id = c.start_id AND c.replaced_by IS NULL;

-- Unchanged from 0019 but for the last statement before the result (last_segment_id re-pointed).
CREATE OR REPLACE FUNCTION ingest_replace_segments(
    p_source text, p_split_id uuid, p_worker text, p_old_ids bigint[], p_location text, p_files text[],
    p_row_count bigint, p_size_bytes bigint)
RETURNS TABLE (segment_id bigint, reason text, detail text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    old record;
    bad record;
    new_id bigint;
    split_state text;
BEGIN
    -- Share: ordered after an apply or a reset of the source (they take the row for update),
    -- while publishes (a key share) go on.
    PERFORM 1 FROM ingest_sources s WHERE s.name = p_source FOR SHARE;
    -- Fixed order: two replacements of overlapping segments never deadlock; the later one
    -- waits, then sees the old segments replaced.
    PERFORM 1 FROM ingest_segments s WHERE s.id = ANY(p_old_ids) ORDER BY s.id FOR UPDATE;

    SELECT s.id INTO new_id FROM ingest_segments s WHERE s.split_id = p_split_id AND s.source = p_source;
    IF new_id IS NOT NULL THEN
        RETURN QUERY SELECT new_id, NULL::text, NULL::text;
        RETURN;
    END IF;

    SELECT count(*) AS n,
           count(*) FILTER (WHERE s.replaced_by IS NULL) AS current,
           count(DISTINCT s.spec_version) AS versions,
           min(s.spec_version) AS spec_version,
           coalesce(sum(s.row_count), 0) AS row_count,
           coalesce(sum(s.rejects_count), 0) AS rejects_count,
           coalesce(sum(s.skipped_count), 0) AS skipped_count,
           min(s.min_event_time) AS min_event_time,
           max(s.max_event_time) AS max_event_time,
           CASE WHEN count(DISTINCT s.rejects_location) = 1 THEN min(s.rejects_location) END AS rejects_location
    INTO old
    FROM ingest_segments s WHERE s.id = ANY(p_old_ids) AND s.source = p_source;

    IF cardinality(p_old_ids) = 0 OR old.n <> (SELECT count(DISTINCT u) FROM unnest(p_old_ids) AS u) THEN
        RETURN QUERY SELECT NULL::bigint, 'missing'::text,
            format('%s of %s old segments are segments of %s', old.n, cardinality(p_old_ids), p_source);
        RETURN;
    END IF;
    IF old.current <> old.n THEN
        RETURN QUERY SELECT NULL::bigint, 'replaced'::text,
            format('%s of the %s old segments are no longer current', old.n - old.current, old.n);
        RETURN;
    END IF;
    IF old.versions > 1 THEN
        RETURN QUERY SELECT NULL::bigint, 'spec_version'::text,
            format('the old segments were written under %s spec versions', old.versions);
        RETURN;
    END IF;
    IF old.row_count <> p_row_count THEN
        RETURN QUERY SELECT NULL::bigint, 'row_count'::text,
            format('the new files hold %s rows, the old segments %s', p_row_count, old.row_count);
        RETURN;
    END IF;

    -- Per partition, the old ranges must follow each other without gap or overlap, in one epoch.
    SELECT g.topic, g.partition, g.start_offset, g.prev_end, g.min_epoch, g.max_epoch INTO bad
    FROM (SELECT r.topic, r.partition, r.start_offset,
                 lag(r.end_offset) OVER w AS prev_end,
                 min(r.epoch) OVER p AS min_epoch, max(r.epoch) OVER p AS max_epoch
          FROM ingest_segment_ranges r WHERE r.segment_id = ANY(p_old_ids)
          WINDOW p AS (PARTITION BY r.topic, r.partition),
                 w AS (PARTITION BY r.topic, r.partition ORDER BY r.start_offset)) g
    WHERE g.min_epoch <> g.max_epoch OR (g.prev_end IS NOT NULL AND g.prev_end <> g.start_offset)
    LIMIT 1;
    IF FOUND THEN
        RETURN QUERY SELECT NULL::bigint, 'ranges'::text,
            CASE WHEN bad.min_epoch <> bad.max_epoch
                 THEN format('the old ranges of %s/%s span epochs %s to %s', bad.topic, bad.partition,
                             bad.min_epoch, bad.max_epoch)
                 ELSE format('the old ranges of %s/%s are not contiguous: one ends at %s, the next starts at %s',
                             bad.topic, bad.partition, bad.prev_end, bad.start_offset) END;
        RETURN;
    END IF;

    -- Locks the split's row: gc's abandon and this replacement are serialized on it.
    UPDATE ingest_splits s SET state = 'published', settled_at = now()
    WHERE s.split_id = p_split_id AND s.source = p_source AND s.state = 'building'
    RETURNING s.state INTO split_state;
    IF split_state IS NULL THEN
        SELECT s.state INTO split_state FROM ingest_splits s WHERE s.split_id = p_split_id AND s.source = p_source;
        RETURN QUERY SELECT NULL::bigint,
            CASE WHEN split_state IS NULL THEN 'unregistered' ELSE 'abandoned' END,
            format('the compaction''s split %s is %s', p_split_id, coalesce(split_state, 'not registered'));
        RETURN;
    END IF;

    INSERT INTO ingest_segments (
        source, split_id, spec_version, worker, location, files, row_count, size_bytes,
        min_event_time, max_event_time, rejects_location, rejects_files, rejects_count, skipped_count)
    VALUES (
        p_source, p_split_id, old.spec_version, p_worker, p_location, p_files, p_row_count, p_size_bytes,
        old.min_event_time, old.max_event_time, old.rejects_location,
        coalesce((SELECT array_agg(f ORDER BY s.id, u.n) FROM ingest_segments s, unnest(s.rejects_files)
                  WITH ORDINALITY AS u(f, n) WHERE s.id = ANY(p_old_ids)), '{}'),
        old.rejects_count, old.skipped_count)
    RETURNING id INTO new_id;

    -- The old ranges leave the unique index before the new ones enter it.
    UPDATE ingest_segment_ranges r SET replaced_by = new_id WHERE r.segment_id = ANY(p_old_ids);
    INSERT INTO ingest_segment_ranges (segment_id, source, topic, partition, start_offset, end_offset, epoch)
    SELECT new_id, p_source, r.topic, r.partition, min(r.start_offset), max(r.end_offset), min(r.epoch)
    FROM ingest_segment_ranges r WHERE r.segment_id = ANY(p_old_ids)
    GROUP BY r.topic, r.partition;
    UPDATE ingest_segments s SET replaced_by = new_id, replaced_at = now() WHERE s.id = ANY(p_old_ids);

    -- A partition whose last segment was replaced points to the replacement, which covers its
    -- last published range. Rows locked in a fixed order; a publish that moved the pointer
    -- first (it holds the row until it commits) is left alone by the recheck of the condition.
    PERFORM 1 FROM ingest_partitions p
    WHERE p.source = p_source AND p.last_segment_id = ANY(p_old_ids)
    ORDER BY p.topic, p.partition FOR UPDATE;
    UPDATE ingest_partitions p SET last_segment_id = new_id
    WHERE p.source = p_source AND p.last_segment_id = ANY(p_old_ids);

    RETURN QUERY SELECT new_id, NULL::text, NULL::text;
END;
$$;
