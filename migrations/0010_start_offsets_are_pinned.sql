-- A claimed partition always has a stored offset before anything of it is published.
--
-- A partition with nothing stored used to be read from its source's start position (earliest
-- or latest) every time it was positioned, and its first publish was accepted at any start:
-- "latest" resolved again after a failed first split, a re-assignment or a resume skipped
-- what had been produced meanwhile. The claimer now resolves the start position once, from the
-- log, and stores it under its claim (metastore/queries.sql, pin_start_offsets) before it
-- reads a record; so a publish must start exactly at the stored offset, which is never NULL
-- for a partition that was read from. A NULL offset refuses the publish ('offset', actual
-- NULL).
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
    WHERE p.serial IS NULL OR p.serial <> r.serial OR p.next_offset IS DISTINCT FROM r.start
    ORDER BY r.topic, r.partition;
END;
$$;

COMMENT ON COLUMN ingest_partitions.next_offset IS
    'The first offset not yet published. NULL only until the partition''s first claim pins its start position.';
