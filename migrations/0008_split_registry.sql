-- The metastore knows every file before it is written.
--
-- A build (one Spark job over a batch of splits) registers the locations it will write to
-- and the splits it builds before it writes anything. A split is 'building' until its
-- publish moves it to 'published' in the publish transaction itself; gc moves splits that
-- stayed 'building' past the grace period to 'abandoned' first, after which their publish is
-- refused (the records are read again), and only then deletes files, and only under the
-- locations of builds of its own source. Nothing no registration names is ever deleted.

CREATE TABLE ingest_builds (
    id          uuid PRIMARY KEY,
    source      text NOT NULL REFERENCES ingest_sources (name),
    worker      text NOT NULL,
    -- Canonical URIs (ingest/store_uri.py) of the directories the build writes.
    staging     text NOT NULL,
    data        text NOT NULL,
    rejects     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Set by gc once it deleted every file under the locations that no published segment
    -- lists (no split of the build was still building then).
    swept_at    timestamptz
);
CREATE INDEX ingest_builds_unswept_idx ON ingest_builds (source, created_at) WHERE swept_at IS NULL;

CREATE TABLE ingest_splits (
    split_id       uuid PRIMARY KEY,
    source         text NOT NULL REFERENCES ingest_sources (name),
    -- The build that last took the split (a failed build is retried by a new one).
    build_id       uuid NOT NULL REFERENCES ingest_builds (id),
    state          text NOT NULL DEFAULT 'building' CHECK (state IN ('building', 'published', 'abandoned')),
    registered_at  timestamptz NOT NULL DEFAULT now(),
    settled_at     timestamptz
);
CREATE INDEX ingest_splits_building_idx ON ingest_splits (source, registered_at) WHERE state = 'building';
CREATE INDEX ingest_splits_build_idx ON ingest_splits (build_id);

-- 'abandoned': gc gave the split up before its publish came; 'unregistered': a split with
-- files that no build registered (a worker older than this migration).
ALTER TABLE ingest_publish_conflicts DROP CONSTRAINT ingest_publish_conflicts_reason_check;
ALTER TABLE ingest_publish_conflicts
    ADD CONSTRAINT ingest_publish_conflicts_reason_check
    CHECK (reason IN ('serial', 'offset', 'missing', 'abandoned', 'unregistered'));

-- Register a build and its splits, idempotently (a retry after a lost reply registers the
-- same build again). A split already registered moves to this build while still building;
-- one already published or abandoned stays as it is (its publish will be refused).
CREATE OR REPLACE FUNCTION ingest_register_build(
    p_build_id uuid, p_source text, p_worker text, p_staging text, p_data text, p_rejects text,
    p_split_ids uuid[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO ingest_builds (id, source, worker, staging, data, rejects)
    VALUES (p_build_id, p_source, p_worker, p_staging, p_data, p_rejects)
    ON CONFLICT (id) DO NOTHING;
    INSERT INTO ingest_splits (split_id, source, build_id)
    SELECT s, p_source, p_build_id FROM unnest(p_split_ids) AS s
    ON CONFLICT (split_id) DO UPDATE
        SET build_id = EXCLUDED.build_id, registered_at = now()
        WHERE ingest_splits.state = 'building' AND ingest_splits.source = EXCLUDED.source;
$$;

-- The publish of migration 0007, and one more check, under the same locks: the split must
-- be registered by this source and still 'building'; it becomes 'published' in the same
-- transaction. A split without files (offsets without records) writes nothing and needs no
-- registration.
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
