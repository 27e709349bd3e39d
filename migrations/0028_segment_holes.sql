-- A segment's holes: the offsets of its ranges that hold no record (transaction markers, records
-- of aborted transactions, offsets the log cleaner removed). A build observes, per split, how
-- many records Spark read and their lowest and highest offsets, and fails the split unless they
-- lie in its range [start, end) (ingest.builder.accounting); what the range holds beyond them is
-- its holes, end - start - records, so rows + rejects + skipped + holes = the offsets its ranges
-- cover, and `ingest audit` checks it. NULL: not recorded (a segment of an earlier release, or
-- a replacement of one).
ALTER TABLE ingest_segments ADD COLUMN holes bigint CHECK (holes >= 0);
COMMENT ON COLUMN ingest_segments.holes IS
    'offsets of the segment''s ranges that hold no record (transaction markers, aborted records, compacted-away offsets): the covered offsets less rows, rejects and skipped; NULL when not recorded (published by an earlier release)';

-- The publish stores the segment's holes (p_holes, NULL allowed). Every check is the one of
-- migrations 0011 and 0020, unchanged.
CREATE FUNCTION ingest_publish_segment(
    p_source text, p_split_id uuid, p_spec_version integer, p_worker text, p_location text, p_files text[],
    p_row_count bigint, p_size_bytes bigint, p_min_event_time timestamptz, p_max_event_time timestamptz,
    p_rejects_location text, p_rejects_files text[], p_rejects_count bigint, p_skipped_count bigint,
    p_topics text[], p_partitions integer[], p_serials bigint[], p_starts bigint[], p_ends bigint[],
    p_leader_epochs integer[], p_holes bigint)
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
        min_event_time, max_event_time, rejects_location, rejects_files, rejects_count, skipped_count, holes)
    VALUES (
        p_source, p_split_id, p_spec_version, p_worker, p_location, p_files, p_row_count, p_size_bytes,
        p_min_event_time, p_max_event_time, p_rejects_location, p_rejects_files, p_rejects_count, p_skipped_count,
        p_holes)
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

-- The signature of 0020, for a worker of the previous release during a rolling upgrade: its
-- segments record no holes.
CREATE OR REPLACE FUNCTION ingest_publish_segment(
    p_source text, p_split_id uuid, p_spec_version integer, p_worker text, p_location text, p_files text[],
    p_row_count bigint, p_size_bytes bigint, p_min_event_time timestamptz, p_max_event_time timestamptz,
    p_rejects_location text, p_rejects_files text[], p_rejects_count bigint, p_skipped_count bigint,
    p_topics text[], p_partitions integer[], p_serials bigint[], p_starts bigint[], p_ends bigint[],
    p_leader_epochs integer[])
RETURNS TABLE (segment_id bigint, reason text, topic text, partition integer, expected bigint, actual bigint)
LANGUAGE sql AS $$
    SELECT * FROM ingest_publish_segment(
        p_source, p_split_id, p_spec_version, p_worker, p_location, p_files, p_row_count, p_size_bytes,
        p_min_event_time, p_max_event_time, p_rejects_location, p_rejects_files, p_rejects_count,
        p_skipped_count, p_topics, p_partitions, p_serials, p_starts, p_ends, p_leader_epochs, NULL::bigint);
$$;

-- A replacement's holes are those of the segments it replaces (their ranges are its ranges), or
-- NULL when one of them has none recorded. Otherwise unchanged from 0021.
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
           CASE WHEN count(s.holes) = count(*) THEN sum(s.holes) END AS holes,
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
        min_event_time, max_event_time, rejects_location, rejects_files, rejects_count, skipped_count, holes)
    VALUES (
        p_source, p_split_id, old.spec_version, p_worker, p_location, p_files, p_row_count, p_size_bytes,
        old.min_event_time, old.max_event_time, old.rejects_location,
        coalesce((SELECT array_agg(f ORDER BY s.id, u.n) FROM ingest_segments s, unnest(s.rejects_files)
                  WITH ORDINALITY AS u(f, n) WHERE s.id = ANY(p_old_ids)), '{}'),
        old.rejects_count, old.skipped_count, old.holes)
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
