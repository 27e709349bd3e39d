-- The per-partition picture for psql users: SELECT * FROM ingest_partition_status;
CREATE VIEW ingest_partition_status AS
SELECT p.source,
       p.topic,
       p.partition,
       p.next_offset,
       p.serial,
       p.owner,
       p.assigned_at,
       p.last_publish_at,
       s.max_event_time AS last_event_time,
       (SELECT count(*) FROM ingest_segment_ranges r
         WHERE r.source = p.source AND r.topic = p.topic AND r.partition = p.partition) AS segments,
       (SELECT count(*) FROM ingest_publish_conflicts c
         WHERE c.source = p.source AND c.topic = p.topic AND c.partition = p.partition) AS publish_conflicts
FROM ingest_partitions p
LEFT JOIN ingest_segments s ON s.id = p.last_segment_id;
