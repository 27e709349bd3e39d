-- Every statement the metastore runs, under `-- name: NAME` headers, loaded once by queries.py.
-- Parameters are always bound (%(name)s); identifiers are never built from input.

-- name: session_setup
-- Every connection's bounds and who it is on the server (metastore.connection): the session a
-- statement whose outcome is unknown may still run on, ended before that outcome is looked up.
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('lock_timeout', %(lock_timeout)s, false),
       pg_backend_pid() AS pid,
       (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()) AS started;

-- name: end_session
-- A session whose connection the client gave up (no reply in time): told to end, so that a
-- statement it still runs, or has yet to receive, cannot commit after the client looked its
-- outcome up. No row: it is gone, with its transaction. (A role may end its own sessions.)
SELECT pg_terminate_backend(pid) AS signalled FROM pg_stat_activity
WHERE pid = %(pid)s AND backend_start = %(started)s;

-- name: upsert_source
INSERT INTO ingest_sources (name, version) VALUES (%(name)s, 1)
ON CONFLICT (name) DO UPDATE SET version = ingest_sources.version + 1, updated_at = now()
RETURNING version;

-- name: lock_applies
-- Serializes applies (rare) so that checks across sources (overlapping stores) see every
-- other apply that committed before this one.
SELECT pg_advisory_xact_lock(hashtext('ingest_source_apply'));

-- name: lock_source
-- Applies and resets lock the source row before any partition row; publishes and claims lock
-- partition rows only, always in (topic, partition) order: no lock cycle.
SELECT version, desired_state FROM ingest_sources WHERE name = %(name)s FOR UPDATE;

-- name: reactivate_source
UPDATE ingest_sources
SET desired_state = 'running', drain_stay = false, terminated_at = NULL, control_changed_at = now()
WHERE name = %(name)s;

-- name: list_versions
SELECT version, spec, applied_at FROM ingest_source_versions WHERE source = %(name)s ORDER BY version;

-- name: latest_spec
SELECT v.version, v.spec, v.spec_text
FROM ingest_sources s JOIN ingest_source_versions v ON v.source = s.name AND v.version = s.version
WHERE s.name = %(name)s;

-- name: insert_source_version
INSERT INTO ingest_source_versions (source, version, spec, spec_text)
VALUES (%(name)s, %(version)s, %(spec)s, %(spec_text)s);

-- name: list_sources
SELECT name, version, desired_state, terminated_at, created_at, updated_at FROM ingest_sources ORDER BY name;

-- name: register_partitions
-- Partitions known when a topic is first seen start at the source's start position;
-- rows that exist are left alone.
INSERT INTO ingest_partitions (source, topic, partition, initial_position)
SELECT %(source)s, %(topic)s, p, %(initial_position)s FROM unnest(%(partitions)s::int[]) AS u(p)
ON CONFLICT (source, topic, partition) DO NOTHING;

-- name: claim_partitions
-- A partition with no row appeared after its topic was registered (the topic grew): it
-- starts from earliest so none of its records are skipped.
-- topic_ids: Kafka's id of each partition's topic, asked before this claim (NULL: not known).
-- It is recorded where none is (migrations/0027), or where nothing was read yet (no stored
-- offset); a stored id is never replaced here: the caller compares it with Kafka's. A retired
-- partition's row keeps its own (a topic of that name now is another log).
INSERT INTO ingest_partitions (source, topic, partition, initial_position, serial, owner, assigned_at, topic_id)
SELECT %(source)s, t, p, 'earliest', 1, %(worker)s, now(), i
FROM unnest(%(topics)s::text[], %(partitions)s::int[], %(topic_ids)s::text[]) AS u(t, p, i)
ORDER BY t, p
ON CONFLICT (source, topic, partition) DO UPDATE
SET serial = ingest_partitions.serial + 1, owner = EXCLUDED.owner, assigned_at = now(),
    topic_id = CASE
        WHEN ingest_partitions.retired_at IS NULL
             AND (ingest_partitions.topic_id IS NULL OR ingest_partitions.next_offset IS NULL)
        THEN coalesce(EXCLUDED.topic_id, ingest_partitions.topic_id)
        ELSE ingest_partitions.topic_id END
RETURNING topic, partition, serial, next_offset, initial_position, leader_epoch, retired_at, topic_id;

-- name: pin_start_offsets
-- A claimed partition with nothing stored gets the start offset its claim resolved from the
-- log (start_from's earliest or latest, asked of Kafka once), only while that claim is the
-- current one; a stored offset is never replaced. Rows are locked first (lock_partitions,
-- fixed order) in the same transaction.
-- start_offset records where epoch 0 starts, for `ingest audit` (migrations/0013).
UPDATE ingest_partitions p
SET next_offset = coalesce(p.next_offset, u.o),
    leader_epoch = CASE WHEN p.next_offset IS NULL THEN NULL ELSE p.leader_epoch END,
    start_offset = CASE WHEN p.next_offset IS NULL AND p.start_offset IS NULL THEN u.o ELSE p.start_offset END
FROM unnest(%(topics)s::text[], %(partitions)s::int[], %(serials)s::bigint[], %(offsets)s::bigint[]) AS u(t, part, s, o)
WHERE p.source = %(source)s AND p.topic = u.t AND p.partition = u.part AND p.serial = u.s
RETURNING p.topic, p.partition, p.serial, p.next_offset, p.initial_position, p.leader_epoch, p.topic_id;

-- name: retire_topic
-- The topic was deleted from Kafka: its partitions are retired (migrations/0024), once.
UPDATE ingest_partitions SET retired_at = now(), owner = NULL
WHERE source = %(source)s AND topic = %(topic)s AND retired_at IS NULL
RETURNING partition;

-- name: live_topics
-- The topics of a source with a partition that is not retired.
SELECT DISTINCT topic FROM ingest_partitions WHERE source = %(source)s AND retired_at IS NULL ORDER BY topic;

-- name: release_partition
UPDATE ingest_partitions SET owner = NULL
WHERE source = %(source)s AND topic = %(topic)s AND partition = %(partition)s
  AND serial = %(serial)s AND owner = %(worker)s;

-- name: lock_partitions
-- Fixed lock order (topic, partition) so concurrent publishes never deadlock.
SELECT topic, partition, serial, next_offset
FROM ingest_partitions
WHERE source = %(source)s
  AND (topic, partition) IN (SELECT t, p FROM unnest(%(topics)s::text[], %(partitions)s::int[]) AS u(t, p))
ORDER BY topic, partition
FOR UPDATE;

-- name: publish_segment
-- The whole publish transaction (migrations/0007, 0008, 0011, 0020, 0028): lock, check, insert, advance;
-- a split already published answers with its segment. One row:
-- segment_id set, or the first failing check (reason, topic, partition, expected, actual).
SELECT * FROM ingest_publish_segment(
    p_source => %(source)s, p_split_id => %(split_id)s, p_spec_version => %(spec_version)s,
    p_worker => %(worker)s, p_location => %(location)s, p_files => %(files)s::text[],
    p_row_count => %(row_count)s, p_size_bytes => %(size_bytes)s,
    p_min_event_time => %(min_event_time)s::timestamptz, p_max_event_time => %(max_event_time)s::timestamptz,
    p_rejects_location => %(rejects_location)s::text, p_rejects_files => %(rejects_files)s::text[],
    p_rejects_count => %(rejects_count)s, p_skipped_count => %(skipped_count)s,
    p_topics => %(topics)s::text[], p_partitions => %(partitions)s::int[], p_serials => %(serials)s::bigint[],
    p_starts => %(starts)s::bigint[], p_ends => %(ends)s::bigint[], p_leader_epochs => %(leader_epochs)s::int[],
    p_holes => %(holes)s::bigint);

-- name: lock_ranges
-- Lock the ranges' partition rows and return the checks that fail (none: go ahead).
SELECT * FROM ingest_lock_ranges(%(source)s, %(topics)s::text[], %(partitions)s::int[], %(serials)s::bigint[],
                                 %(starts)s::bigint[]);

-- name: segment_for_split
SELECT id FROM ingest_segments WHERE split_id = %(split_id)s;

-- name: list_segments
-- A source's current segments (replaced ones are no longer, migrations/0017), oldest first: all
-- of them (since and limit NULL), or for `ingest segments --since --limit` the newest `limit`
-- published at or after `since`. Each range with its epoch.
SELECT * FROM (
SELECT s.id, s.split_id, s.spec_version, s.worker, s.location, s.files, s.row_count, s.size_bytes,
       s.min_event_time, s.max_event_time, s.rejects_location, s.rejects_files, s.rejects_count,
       s.skipped_count, s.published_at,
       coalesce(json_agg(json_build_object('topic', r.topic, 'partition', r.partition,
                                           'start', r.start_offset, 'end', r.end_offset, 'epoch', r.epoch)
                         ORDER BY r.topic, r.partition) FILTER (WHERE r.segment_id IS NOT NULL), '[]') AS ranges
FROM ingest_segments s LEFT JOIN ingest_segment_ranges r ON r.segment_id = s.id
WHERE s.source = %(source)s AND s.replaced_by IS NULL
  AND (%(since)s::timestamptz IS NULL OR s.published_at >= %(since)s::timestamptz)
GROUP BY s.id
ORDER BY s.id DESC
LIMIT %(limit)s
) newest ORDER BY id;

-- name: list_partitions
SELECT p.topic, p.partition, p.next_offset, p.initial_position, p.serial, p.owner, p.assigned_at,
       p.last_publish_at, p.last_segment_id, p.leader_epoch, p.epoch, p.retired_at, p.topic_id
FROM ingest_partitions p
WHERE p.source = %(source)s
ORDER BY p.topic, p.partition;

-- name: conflict_counts
SELECT reason, count(*) AS n FROM ingest_publish_conflicts WHERE source = %(source)s GROUP BY reason;

-- name: partition_state
SELECT serial, next_offset FROM ingest_partitions
WHERE source = %(source)s AND topic = %(topic)s AND partition = %(partition)s;

-- name: stored_position
-- Where a rewind re-reads from: the stored offset and the leader epoch of the record before it,
-- and the id of the topic whose log it is in (migrations/0027).
SELECT serial, next_offset, leader_epoch, topic_id FROM ingest_partitions
WHERE source = %(source)s AND topic = %(topic)s AND partition = %(partition)s;

-- name: record_topic_id
-- Kafka's id of the partition's topic, recorded while the claim's serial is the current one
-- where no id is stored, or where nothing lies below the stored offset (0: no log's records
-- are behind it, so the new topic's are all ahead). Another stored id is left alone: the
-- topic was re-created (the caller records that). Returns the id stored now; no row: fenced.
UPDATE ingest_partitions
SET topic_id = CASE WHEN topic_id IS NULL OR coalesce(next_offset, 0) = 0 THEN %(topic_id)s ELSE topic_id END
WHERE source = %(source)s AND topic = %(topic)s AND partition = %(partition)s AND serial = %(serial)s
RETURNING topic_id;

-- name: heartbeat
-- A worker id is reused by the next process (a Kubernetes pod's container restart keeps the pod
-- name, the host name and pid 1): the row describes the process that beats now, so its host,
-- pid, version and start time are replaced too (started_at NULL: the first beat's time, kept).
INSERT INTO ingest_workers (worker, source, host, pid, version, state, partitions, spec_version, started_at,
                            registry_waiting, registry_error)
VALUES (%(worker)s, %(source)s, %(host)s, %(pid)s, %(version)s, %(state)s, %(partitions)s, %(spec_version)s,
        coalesce(%(started_at)s::timestamptz, now()), %(registry_waiting)s, %(registry_error)s)
ON CONFLICT (worker) DO UPDATE
SET source = EXCLUDED.source, host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version,
    started_at = coalesce(%(started_at)s::timestamptz, ingest_workers.started_at),
    state = EXCLUDED.state, partitions = EXCLUDED.partitions, spec_version = EXCLUDED.spec_version,
    registry_waiting = EXCLUDED.registry_waiting, registry_error = EXCLUDED.registry_error,
    heartbeat_at = now();

-- name: live_workers
SELECT worker, host, pid, version, state, partitions, spec_version, started_at, heartbeat_at,
       registry_waiting, registry_error
FROM ingest_workers
WHERE source = %(source)s AND heartbeat_at > now() - make_interval(secs => %(expiry_s)s)
  AND state NOT IN ('stopped', 'failed')
ORDER BY worker;

-- name: expire_workers
DELETE FROM ingest_workers WHERE heartbeat_at < now() - make_interval(secs => %(keep_s)s);

-- name: record_error
INSERT INTO ingest_errors (source, worker, kind, message) VALUES (%(source)s, %(worker)s, %(kind)s, %(message)s);

-- name: recent_errors
SELECT worker, kind, message, at FROM ingest_errors WHERE source = %(source)s ORDER BY id DESC LIMIT %(limit)s;

-- name: partition_status
SELECT topic, partition, last_event_time, segments, publish_conflicts
FROM ingest_partition_status WHERE source = %(source)s ORDER BY topic, partition;

-- name: set_control
-- A terminated source stays terminated until `ingest source apply --reactivate`; while it is
-- terminating, only terminate itself applies (suspend, resume or drain would undo the drain).
UPDATE ingest_sources SET desired_state = %(state)s, drain_stay = %(stay)s, control_changed_at = now()
WHERE name = %(name)s
  AND (desired_state NOT IN ('terminated', 'terminating') OR (desired_state = 'terminating' AND %(state)s = 'terminating'))
RETURNING name;

-- name: mark_terminated
UPDATE ingest_sources SET desired_state = 'terminated', terminated_at = now(), control_changed_at = now()
WHERE name = %(name)s AND desired_state = 'terminating'
RETURNING terminated_at;

-- name: get_control
-- With the source's last `ingest audit` (its findings and end; NULL: never audited), which
-- workers export as metrics.
SELECT s.desired_state, s.drain_stay, s.reset_generation, s.version, s.terminated_at,
       a.findings AS audit_findings, a.finished_at AS audit_finished_at
FROM ingest_sources s
LEFT JOIN LATERAL (SELECT findings, finished_at FROM ingest_audits
                   WHERE source = s.name ORDER BY id DESC LIMIT 1) a ON true
WHERE s.name = %(name)s;

-- name: lock_source_partitions
SELECT topic, partition, serial, next_offset, initial_position, last_segment_id, topic_id
FROM ingest_partitions
WHERE source = %(source)s
ORDER BY topic, partition
FOR UPDATE;

-- name: reset_partition
-- The serial bump fences every publish in flight for the partition (it presents the old serial).
-- No leader epoch is known for the new position: it is read from without validation.
-- A retired partition (its topic deleted, then re-created) is live again in the new epoch.
-- topic_id: Kafka's id of the topic the new offset is in, as the reset asked it (NULL: not
-- known; the next claim records it): a re-created topic is read from here on (migrations/0027).
UPDATE ingest_partitions
SET next_offset = %(new_offset)s, leader_epoch = NULL, serial = serial + 1, epoch = epoch + 1, retired_at = NULL,
    topic_id = %(topic_id)s
WHERE source = %(source)s AND topic = %(topic)s AND partition = %(partition)s
RETURNING serial;

-- name: bump_reset_generation
UPDATE ingest_sources SET reset_generation = reset_generation + 1, control_changed_at = now()
WHERE name = %(name)s;

-- name: insert_reset
INSERT INTO ingest_resets (source, actor, reason, target) VALUES (%(source)s, %(actor)s, %(reason)s, %(target)s)
RETURNING id, at;

-- name: insert_reset_partition
INSERT INTO ingest_reset_partitions (
    reset_id, topic, partition, old_offset, new_offset, old_serial, new_serial, last_segment_id,
    skipped_start, skipped_end, replayed_start, replayed_end)
VALUES (
    %(reset_id)s, %(topic)s, %(partition)s, %(old_offset)s, %(new_offset)s, %(old_serial)s, %(new_serial)s,
    %(last_segment_id)s, %(skipped_start)s, %(skipped_end)s, %(replayed_start)s, %(replayed_end)s);

-- name: recent_resets
SELECT r.id, r.actor, r.reason, r.target, r.at,
       json_agg(json_build_object(
           'topic', p.topic, 'partition', p.partition, 'old_offset', p.old_offset, 'new_offset', p.new_offset,
           'old_serial', p.old_serial, 'new_serial', p.new_serial, 'last_segment_id', p.last_segment_id,
           'skipped_start', p.skipped_start, 'skipped_end', p.skipped_end,
           'replayed_start', p.replayed_start, 'replayed_end', p.replayed_end)
           ORDER BY p.topic, p.partition) AS partitions
FROM ingest_resets r JOIN ingest_reset_partitions p ON p.reset_id = r.id
WHERE r.source = %(source)s
GROUP BY r.id
ORDER BY r.id DESC
LIMIT %(limit)s;

-- name: reclaim_partitions
-- After a reset: a partition whose serial moved while this worker is still its recorded
-- owner was reset (a claim by another worker would have changed the owner). Bump the serial
-- again (a claim of our own) and read the offset the reset stored. Rows are locked first
-- (lock_partitions, fixed order) in the same transaction.
UPDATE ingest_partitions p SET serial = p.serial + 1, assigned_at = now()
FROM unnest(%(topics)s::text[], %(partitions)s::int[], %(serials)s::bigint[]) AS u(t, part, s)
WHERE p.source = %(source)s AND p.topic = u.t AND p.partition = u.part
  AND p.owner = %(worker)s AND p.serial <> u.s
RETURNING p.topic, p.partition, p.serial, p.next_offset, p.initial_position, p.leader_epoch, p.topic_id;

-- name: listen_controls
LISTEN ingest_control;

-- name: record_gap
-- The partition stopped at from_offset in its current epoch (the row's epoch is filled by
-- the ingest_offset_gaps_epoch trigger, before the conflict is looked for). Seen again in
-- that epoch (a restart, retention moving on): the lost range only grows; a skipped gap is
-- never reopened. Another epoch's row at the same offset is never touched (migration 0022).
INSERT INTO ingest_offset_gaps (source, topic, partition, from_offset, to_offset, worker)
VALUES (%(source)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(worker)s)
ON CONFLICT (source, topic, partition, epoch, from_offset) DO UPDATE
SET to_offset = greatest(ingest_offset_gaps.to_offset, EXCLUDED.to_offset), worker = EXCLUDED.worker
WHERE NOT ingest_offset_gaps.skipped
RETURNING id;

-- name: record_truncation
-- The log was truncated below the stored offset (migrations/0020): the records published at
-- [from_offset, to_offset) are no longer the log's. Recorded, never skipped (the partition
-- stays stopped); seen again in the same epoch, the same row is updated.
INSERT INTO ingest_offset_gaps (source, topic, partition, from_offset, to_offset, worker, reason)
VALUES (%(source)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(worker)s, 'log_truncated')
ON CONFLICT (source, topic, partition, epoch, from_offset) DO UPDATE
SET to_offset = greatest(ingest_offset_gaps.to_offset, EXCLUDED.to_offset), worker = EXCLUDED.worker,
    reason = 'log_truncated'
WHERE NOT ingest_offset_gaps.skipped
RETURNING id;

-- name: record_topic_recreation
-- The partition's topic was deleted and re-created (migrations/0027): Kafka's id for it is not
-- the one stored with next_offset. The new log's offsets [from_offset, to_offset) hold records
-- never read, and the records published there are no longer the log's. Recorded with both ids,
-- never skipped (the partition stays stopped); seen again in the same epoch, the same row.
INSERT INTO ingest_offset_gaps (source, topic, partition, from_offset, to_offset, worker, reason,
                                old_topic_id, new_topic_id)
VALUES (%(source)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(worker)s, 'topic_recreated',
        %(old_topic_id)s, %(new_topic_id)s)
ON CONFLICT (source, topic, partition, epoch, from_offset) DO UPDATE
SET to_offset = greatest(ingest_offset_gaps.to_offset, EXCLUDED.to_offset), worker = EXCLUDED.worker,
    reason = 'topic_recreated', old_topic_id = EXCLUDED.old_topic_id, new_topic_id = EXCLUDED.new_topic_id
WHERE NOT ingest_offset_gaps.skipped
RETURNING id;

-- name: insert_skipped_gap
-- Runs inside the transaction that moves next_offset past the gap (skip_offsets), with the
-- partition's row locked, so the epoch the trigger fills is the partition's. A stop recorded
-- at that offset in the same epoch becomes this skip; another epoch's row stays its own.
INSERT INTO ingest_offset_gaps (source, topic, partition, from_offset, to_offset, worker, skipped, skipped_at)
VALUES (%(source)s, %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(worker)s, true, now())
ON CONFLICT (source, topic, partition, epoch, from_offset) DO UPDATE
SET to_offset = EXCLUDED.to_offset, worker = EXCLUDED.worker, skipped = true, skipped_at = now()
RETURNING id;

-- name: skip_offsets
UPDATE ingest_partitions SET next_offset = %(to_offset)s, leader_epoch = NULL
WHERE source = %(source)s AND topic = %(topic)s AND partition = %(partition)s;

-- name: list_gaps
SELECT id, topic, partition, from_offset, to_offset, skipped, worker, detected_at, skipped_at,
       acknowledged_at, acknowledged_by, epoch, reason, old_topic_id, new_topic_id
FROM ingest_offset_gaps WHERE source = %(source)s ORDER BY id;

-- name: ack_gaps
-- ids NULL: every unacknowledged gap of the source.
UPDATE ingest_offset_gaps SET acknowledged_at = now(), acknowledged_by = %(by)s
WHERE source = %(source)s AND acknowledged_at IS NULL
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
RETURNING id;

-- name: register_build
-- Before a build writes anything (migrations/0008): its locations and its splits.
SELECT ingest_register_build(%(build_id)s, %(source)s, %(worker)s, %(staging)s, %(data)s, %(rejects)s,
                             %(split_ids)s::uuid[]);

-- name: abandon_splits
-- gc, step 1: splits still building after the grace period are given up; their publish is
-- refused from now on (the row lock orders this against a publish in progress).
UPDATE ingest_splits SET state = 'abandoned', settled_at = now()
WHERE source = %(source)s AND state = 'building' AND registered_at < now() - make_interval(secs => %(grace_s)s)
RETURNING split_id;

-- name: stale_splits
-- What abandon_splits would give up (gc --dry-run).
SELECT split_id FROM ingest_splits
WHERE source = %(source)s AND state = 'building' AND registered_at < now() - make_interval(secs => %(grace_s)s);

-- name: builds_to_sweep
-- gc, step 2 (the rule is ingest/ops/gc.py's): builds of this source not closed, with no split
-- building, whose last sweep (or registration, if never swept) is older than the grace
-- period; with the files their published segments list (everything else under their
-- locations is garbage). A split leaves 'building' only for 'published' or 'abandoned', and
-- a registration moves only splits still building: what this returns stays true.
SELECT b.id, b.staging, b.data, b.rejects, b.sweeps,
       coalesce((SELECT array_agg(f) FROM ingest_splits s
                 JOIN ingest_segments g ON g.split_id = s.split_id,
                 unnest(g.files || g.rejects_files) AS f
                 WHERE s.build_id = b.id AND s.state = 'published'), '{}') AS keep
FROM ingest_builds b
WHERE b.source = %(source)s AND b.closed_at IS NULL
  AND coalesce(b.swept_at, b.created_at) < now() - make_interval(secs => %(grace_s)s)
  AND NOT EXISTS (SELECT 1 FROM ingest_splits s WHERE s.build_id = b.id AND s.state = 'building')
ORDER BY b.created_at;

-- name: lock_build_for_sweep
-- Held for one sweep of the build (Metastore.sweep_build): another gc skips the build, and one
-- that read it before this sweep was recorded finds its sweep count changed. NO KEY UPDATE:
-- inserting a split that references the build (its own registration, retried) does not wait.
SELECT id FROM ingest_builds
WHERE id = %(build_id)s AND source = %(source)s AND sweeps = %(sweeps)s AND closed_at IS NULL
FOR NO KEY UPDATE SKIP LOCKED;

-- name: mark_swept
-- Under lock_build_for_sweep's lock. A sweep that deleted nothing and was not the build's
-- first closes it.
UPDATE ingest_builds
SET swept_at = now(), sweeps = sweeps + 1,
    closed_at = CASE WHEN sweeps >= 1 AND %(deleted)s = 0 THEN now() END
WHERE id = %(build_id)s AND source = %(source)s;

-- name: build_counts
-- gc's report: the source's builds gc will sweep later (open), those of them with a split
-- still building, those never swept, and all.
SELECT count(*) FILTER (WHERE b.closed_at IS NULL AND EXISTS (
           SELECT 1 FROM ingest_splits s WHERE s.build_id = b.id AND s.state = 'building')) AS building,
       count(*) FILTER (WHERE b.closed_at IS NULL) AS open,
       count(*) FILTER (WHERE b.swept_at IS NULL) AS unswept,
       count(*) AS total
FROM ingest_builds b WHERE b.source = %(source)s;

-- name: other_stores
-- Every segment store any version of another source named (their files stay where they
-- were written): the overlap check at apply.
SELECT DISTINCT v.source, v.spec->>'segment_store' AS segment_store
FROM ingest_source_versions v
WHERE v.source <> %(name)s
ORDER BY v.source;

-- name: other_groups
-- The consumer group of every other source's latest spec (stored as in the spec: empty
-- means the default, ingest-<name>). Terminated sources keep theirs.
SELECT DISTINCT ON (v.source) v.source, coalesce(v.spec->>'consumer_group', '') AS consumer_group
FROM ingest_source_versions v
WHERE v.source <> %(name)s
ORDER BY v.source, v.version DESC;

-- name: table_enable
-- ingest table enable: a table of this kind for the source; enabling again changes nothing
-- (the partition transform of an existing table is the table's own). A replacement running
-- meanwhile needs no ordering with it: the new table starts from the current segments.
INSERT INTO ingest_tables (source, kind, partition_by)
SELECT s.name, %(kind)s, %(partition_by)s FROM ingest_sources s WHERE s.name = %(source)s
ON CONFLICT (source, kind) DO NOTHING
RETURNING kind;

-- name: table_rows
SELECT source, kind, partition_by, enabled_at, committed_seq, last_snapshot_id, last_commit_at,
       upsert_offsets, cross_partition_keys
FROM ingest_tables WHERE source = %(source)s ORDER BY kind;

-- name: table_lock
-- One committer per source: a session lock held by the committer's own connection for as
-- long as it runs (released when the connection ends, e.g. the process dies). Its key is a
-- 64-bit hash of the source's name, given as the two-int4 form (high and low 32 bits), a key
-- space apart from the one-bigint form the other locks here use: two sources share a lock only
-- if their 64-bit hashes collide (about n^2 / 2^65 for n sources: 3e-10 for 100,000), never
-- with another lock of the metastore. The lock saves committers wasted work only; what keeps
-- a table exactly once does not depend on it (ingest/table/committer.py).
SELECT pg_try_advisory_lock((k >> 32)::int4, k::bit(32)::int4) AS locked
FROM (SELECT hashtextextended('ingest_table_commit:' || %(source)s, 0) AS k) AS key;

-- name: table_lock_row
-- Serializes recording a commit against another committer (a zombie) recording the same one.
SELECT committed_seq FROM ingest_tables WHERE source = %(source)s AND kind = %(kind)s FOR UPDATE;

-- name: table_pending
-- Current published segments the table does not hold yet, in publish order, with the files of
-- the table's kind (data files, or rejects files); after_id pages through them. A replacement
-- is pending like any current segment; table_superseded says which held segments it replaces.
SELECT s.id, s.spec_version, s.published_at,
       CASE WHEN %(kind)s = 'data' THEN s.files ELSE s.rejects_files END AS files
FROM ingest_segments s
WHERE s.source = %(source)s AND s.id > %(after_id)s AND s.replaced_by IS NULL
  AND NOT EXISTS (SELECT 1 FROM ingest_table_segments t
                  WHERE t.source = s.source AND t.kind = %(kind)s AND t.segment_id = s.id)
ORDER BY s.id
LIMIT %(limit)s;

-- name: table_behind
-- How far the table is behind the published segments: count and the oldest publish time.
SELECT count(*) AS segments, min(s.published_at) AS oldest
FROM ingest_segments s
WHERE s.source = %(source)s AND s.replaced_by IS NULL
  AND NOT EXISTS (SELECT 1 FROM ingest_table_segments t
                  WHERE t.source = s.source AND t.kind = %(kind)s AND t.segment_id = s.id);

-- name: table_record_segments
-- seq NULL: segments with no file of this kind (nothing to append, nothing to duplicate).
INSERT INTO ingest_table_segments (source, kind, segment_id, seq)
SELECT %(source)s, %(kind)s, u.id, %(seq)s FROM unnest(%(segment_ids)s::bigint[]) AS u(id)
ON CONFLICT (source, kind, segment_id) DO NOTHING;

-- name: table_refuse
-- A pending segment the table could not take because of its files (migrations/0026): its error,
-- counted per attempt.
INSERT INTO ingest_table_refusals (source, kind, segment_id, error)
VALUES (%(source)s, %(kind)s, %(segment_id)s, %(error)s)
ON CONFLICT (source, kind, segment_id) DO UPDATE
SET error = EXCLUDED.error, attempts = ingest_table_refusals.attempts + 1, last_at = now();

-- name: table_refusals
-- The segments the tables of a source refused and still lack: current, not held by that table.
SELECT r.kind, r.segment_id, r.error, r.attempts, r.first_at, r.last_at
FROM ingest_table_refusals r JOIN ingest_segments s ON s.id = r.segment_id
WHERE r.source = %(source)s AND s.replaced_by IS NULL
  AND NOT EXISTS (SELECT 1 FROM ingest_table_segments t
                  WHERE t.source = r.source AND t.kind = r.kind AND t.segment_id = r.segment_id)
ORDER BY r.kind, r.segment_id;

-- name: table_clear_refusals
-- Segments a table holds now, or that are no longer pending: no longer refused.
DELETE FROM ingest_table_refusals
WHERE source = %(source)s AND kind = %(kind)s AND segment_id = ANY(%(segment_ids)s::bigint[]);

-- name: table_superseded
-- For each of the segments ids: the segments the table holds (seq set, not removed) among those
-- it replaced, directly or through replacements the table never held, with their files of the
-- table's kind. Committing such a segment takes those files out in the same snapshot
-- (migrations/0019).
WITH RECURSIVE replaced (root, id) AS (
    SELECT o.replaced_by, o.id FROM ingest_segments o
    WHERE o.replaced_by = ANY(%(segment_ids)s::bigint[]) AND o.source = %(source)s
    UNION ALL
    SELECT r.root, o.id FROM replaced r JOIN ingest_segments o ON o.replaced_by = r.id
)
SELECT r.root, s.id,
       CASE WHEN %(kind)s = 'data' THEN s.files ELSE s.rejects_files END AS files
FROM replaced r
JOIN ingest_segments s ON s.id = r.id
JOIN ingest_table_segments t
  ON t.source = %(source)s AND t.kind = %(kind)s AND t.segment_id = r.id
 AND t.seq IS NOT NULL AND t.removed_seq IS NULL
ORDER BY r.root, s.id;

-- name: table_fence_segments
-- The segments a table commit appends, read inside the catalog's swap (metastore/tables.py,
-- fence_commit): whether each is current and whether a commit of the table holds it already.
-- Locked until that transaction ends: a replacement of them (FOR UPDATE) waits for the commit
-- and its record, then finds them held.
SELECT s.id, s.replaced_by IS NULL AS current,
       EXISTS (SELECT 1 FROM ingest_table_segments t
               WHERE t.source = s.source AND t.kind = %(kind)s AND t.segment_id = s.id
                 AND t.seq IS NOT NULL) AS held
FROM ingest_segments s
WHERE s.source = %(source)s AND s.id = ANY(%(segment_ids)s::bigint[])
ORDER BY s.id
FOR SHARE OF s;

-- name: table_record_removed
-- The segments a replacement commit took out of the table (migrations/0019).
UPDATE ingest_table_segments SET removed_seq = %(seq)s, removed_at = now()
WHERE source = %(source)s AND kind = %(kind)s AND segment_id = ANY(%(segment_ids)s::bigint[])
  AND seq IS NOT NULL AND removed_seq IS NULL;

-- name: table_held
-- `ingest audit`: every segment each table of the source holds (current, or replaced and not
-- yet taken out by the committer), with its files of the table's kind, and each table's record.
SELECT t.kind, t.segment_id, s.replaced_by IS NULL AS current,
       CASE WHEN t.kind = 'data' THEN s.files ELSE s.rejects_files END AS files
FROM ingest_table_segments t JOIN ingest_segments s ON s.id = t.segment_id
WHERE t.source = %(source)s AND t.seq IS NOT NULL AND t.removed_seq IS NULL
ORDER BY t.kind, t.segment_id;

-- name: table_held_twice
-- `ingest audit`: per table, each held segment that a segment the table also holds replaced,
-- directly or through replacements (replacement: the held one nearest up the chain). Both hold
-- the same records: the table has them twice. A committer that follows a replacement takes the
-- replaced segments out in the same commit that puts their replacement in (migrations/0019).
WITH RECURSIVE up (kind, segment_id, id) AS (
    SELECT t.kind, t.segment_id, s.replaced_by
    FROM ingest_table_segments t JOIN ingest_segments s ON s.id = t.segment_id
    WHERE t.source = %(source)s AND t.seq IS NOT NULL AND t.removed_seq IS NULL AND s.replaced_by IS NOT NULL
    UNION ALL
    SELECT u.kind, u.segment_id, s.replaced_by FROM up u JOIN ingest_segments s ON s.id = u.id
    WHERE s.replaced_by IS NOT NULL
)
SELECT DISTINCT ON (u.kind, u.segment_id) u.kind, u.segment_id, u.id AS replacement
FROM up u
JOIN ingest_table_segments t
  ON t.source = %(source)s AND t.kind = u.kind AND t.segment_id = u.id
 AND t.seq IS NOT NULL AND t.removed_seq IS NULL
ORDER BY u.kind, u.segment_id, u.id;

-- name: table_record_intent
-- A commit to a catalog outside the metastore, checked (as fence_commit checks) before its
-- catalog swap: gc keeps the files of its segments while it is live (migrations/0023).
INSERT INTO ingest_table_intents (source, kind, seq, segment_ids)
VALUES (%(source)s, %(kind)s, %(seq)s, %(segment_ids)s::bigint[]);

-- name: table_settle_intents
-- Recording commit seq settles every intent up to it: it was that commit, or another one took
-- its number and the catalog refuses it from then on (migrations/0023).
DELETE FROM ingest_table_intents WHERE source = %(source)s AND kind = %(kind)s AND seq <= %(seq)s;

-- name: table_advance
UPDATE ingest_tables
SET committed_seq = %(seq)s, last_snapshot_id = %(snapshot_id)s, last_commit_at = %(committed_at)s
WHERE source = %(source)s AND kind = %(kind)s AND committed_seq = %(seq)s - 1;

-- name: table_last_segment
SELECT max(segment_id) AS segment_id, count(*) AS segments
FROM ingest_table_segments WHERE source = %(source)s AND kind = %(kind)s AND seq IS NOT NULL;

-- name: table_published_files
-- Every data and rejects file of the source's published segments (table maintenance must
-- never delete one of them).
SELECT f FROM ingest_segments s, unnest(s.files || s.rejects_files) AS f WHERE s.source = %(source)s;

-- name: current_segments
-- THE current segments of a source, for `ingest audit` (ingest/ops/audit.py, ingest/table/audit.py):
-- the segments readers see, with their ranges and the tables that record them as held. This
-- WHERE clause is the one place that says which segments are current (every published one
-- until compaction marks segments it replaced).
SELECT s.id, s.location, s.files, s.rejects_files, s.row_count, s.rejects_count, s.skipped_count, s.holes,
       coalesce((SELECT json_agg(json_build_object('topic', r.topic, 'partition', r.partition, 'epoch', r.epoch,
                                                  'start', r.start_offset, 'end', r.end_offset)
                                 ORDER BY r.topic, r.partition)
                 FROM ingest_segment_ranges r WHERE r.segment_id = s.id), '[]') AS ranges,
       ARRAY(SELECT t.kind FROM ingest_table_segments t
             WHERE t.source = s.source AND t.segment_id = s.id AND t.seq IS NOT NULL ORDER BY t.kind) AS tables
FROM ingest_segments s
WHERE s.source = %(source)s AND s.replaced_by IS NULL
ORDER BY s.id;

-- name: audit_partitions
-- Each partition's current epoch and its bounds (migrations/0013): epoch 0 starts at
-- start_offset; epoch N > 0 starts at the new_offset of its N-th reset (starts, in reset
-- order) and epoch N - 1 ends at that reset's old_offset (ends); the current one at next_offset.
SELECT p.topic, p.partition, p.next_offset, p.epoch, p.start_offset,
       coalesce(array_agg(rp.new_offset ORDER BY rp.reset_id) FILTER (WHERE rp.reset_id IS NOT NULL), '{}') AS starts,
       coalesce(array_agg(rp.old_offset ORDER BY rp.reset_id) FILTER (WHERE rp.reset_id IS NOT NULL), '{}') AS ends
FROM ingest_partitions p
LEFT JOIN (ingest_reset_partitions rp JOIN ingest_resets r ON r.id = rp.reset_id AND r.source = %(source)s)
    ON rp.topic = p.topic AND rp.partition = p.partition
WHERE p.source = %(source)s
GROUP BY p.source, p.topic, p.partition
ORDER BY p.topic, p.partition;

-- name: record_audit
INSERT INTO ingest_audits (source, started_at, files, tables, partitions, segments, files_read, findings, by_kind,
                           first_lines)
VALUES (%(source)s, %(started_at)s, %(files)s, %(tables)s, %(partitions)s, %(segments)s, %(files_read)s,
        %(findings)s, %(by_kind)s, %(first_lines)s)
RETURNING id, finished_at;

-- name: last_audit
SELECT id, started_at, finished_at, files, tables, partitions, segments, files_read, findings, by_kind, first_lines
FROM ingest_audits WHERE source = %(source)s ORDER BY id DESC LIMIT 1;

-- name: replace_segments
-- Compaction (migrations/0017): the old segments replaced by one of the new files, in one
-- transaction; one row: segment_id set, or why nothing was written (reason, detail).
SELECT * FROM ingest_replace_segments(
    p_source => %(source)s, p_split_id => %(split_id)s, p_worker => %(worker)s,
    p_old_ids => %(old_ids)s::bigint[], p_location => %(location)s, p_files => %(files)s::text[],
    p_row_count => %(row_count)s, p_size_bytes => %(size_bytes)s);

-- name: replaced_to_delete
-- gc, step 3 (the rule is ingest/ops/gc.py's): replaced segments of the source whose files gc
-- has not deleted yet, replaced longer than the grace period ago and held by no Iceberg table
-- since at least as long (migrations/0019), nor named by a live commit intent (migrations/0023),
-- each with the files to delete:
-- those it lists that no current segment of the source lists (a replacement carries its old
-- segments' rejects files) and that lie under a directory a build of the source registered.
-- A replaced segment's files never become listed by a later segment: a replacement names
-- current segments only. dirs: the registered directories holding those files, of builds with
-- no split building: gc removes the directories its deletions left empty up to these, never
-- above (the store's shared levels) and never in a build that may still write.
WITH listed AS (
    SELECT DISTINCT f FROM ingest_segments c, unnest(c.files || c.rejects_files) AS f
    WHERE c.source = %(source)s AND c.replaced_by IS NULL
)
SELECT s.id, s.replaced_by, d.files,
       ARRAY(SELECT DISTINCT v.dir FROM ingest_builds b, LATERAL (VALUES (b.data), (b.rejects)) AS v(dir)
             WHERE b.source = s.source
               AND EXISTS (SELECT 1 FROM unnest(d.files) AS f WHERE starts_with(f, v.dir || '/'))
               AND NOT EXISTS (SELECT 1 FROM ingest_splits p WHERE p.build_id = b.id AND p.state = 'building')
             ORDER BY v.dir) AS dirs
FROM ingest_segments s
CROSS JOIN LATERAL (
    SELECT ARRAY(SELECT f FROM unnest(s.files || s.rejects_files) AS f
                 WHERE f NOT IN (SELECT l.f FROM listed l)
                   AND EXISTS (SELECT 1 FROM ingest_builds b
                               WHERE b.source = s.source
                                 AND (starts_with(f, b.data || '/') OR starts_with(f, b.rejects || '/')))) AS files
) d
WHERE s.source = %(source)s AND s.replaced_by IS NOT NULL AND s.files_deleted_at IS NULL
  AND s.replaced_at < now() - make_interval(secs => %(grace_s)s)
  AND NOT EXISTS (SELECT 1 FROM ingest_table_segments t WHERE t.segment_id = s.id AND t.seq IS NOT NULL
                  AND (t.removed_at IS NULL OR t.removed_at >= now() - make_interval(secs => %(grace_s)s)))
  AND NOT EXISTS (SELECT 1 FROM ingest_table_intents i JOIN ingest_tables t ON t.source = i.source AND t.kind = i.kind
                  WHERE i.source = s.source AND s.id = ANY(i.segment_ids) AND i.seq > t.committed_seq)
ORDER BY s.id;

-- name: lock_replaced_for_delete
-- Held while gc deletes one replaced segment's files (Metastore.delete_replaced_files): another
-- gc skips the segment. A table commit recorded since replaced_to_delete read it (a committer
-- that appended the segment just before its replacement) keeps its files, as does a live intent.
SELECT id FROM ingest_segments s
WHERE id = %(segment_id)s AND source = %(source)s AND replaced_by IS NOT NULL AND files_deleted_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM ingest_table_segments t WHERE t.segment_id = s.id AND t.seq IS NOT NULL
                  AND (t.removed_at IS NULL OR t.removed_at >= now() - make_interval(secs => %(grace_s)s)))
  AND NOT EXISTS (SELECT 1 FROM ingest_table_intents i JOIN ingest_tables t ON t.source = i.source AND t.kind = i.kind
                  WHERE i.source = s.source AND s.id = ANY(i.segment_ids) AND i.seq > t.committed_seq)
FOR NO KEY UPDATE SKIP LOCKED;

-- name: mark_files_deleted
UPDATE ingest_segments SET files_deleted_at = now() WHERE id = %(segment_id)s AND source = %(source)s;

-- name: replaced_counts
-- gc's report: replaced segments whose files are still there, and all replaced segments.
SELECT count(*) FILTER (WHERE files_deleted_at IS NULL) AS pending, count(*) AS total
FROM ingest_segments WHERE source = %(source)s AND replaced_by IS NOT NULL;

-- name: compact_lock
-- One active compactor per source (ingest/compact/runner.py): a session lock held by the
-- compactor's own connection for as long as it runs, keyed like table_lock by a 64-bit hash of
-- the source's name under a prefix of its own. It saves compactors wasted work only: two
-- replacements of the same segments are refused by the metastore whatever the lock says.
SELECT pg_try_advisory_lock((k >> 32)::int4, k::bit(32)::int4) AS locked
FROM (SELECT hashtextextended('ingest_compact:' || %(source)s, 0) AS k) AS key;

-- name: upsert_state
-- An upsert table's recorded commit, its offsets and its cross-partition keys.
SELECT committed_seq, upsert_offsets, cross_partition_keys, last_commit_at
FROM ingest_tables WHERE source = %(source)s AND kind = %(kind)s;

-- name: upsert_pending
-- The current segments' ranges with offsets an upsert table has not merged yet (per partition:
-- end beyond its next unmerged offset, absent = none merged), at most %(limit)s per partition
-- (so a long backlog on one partition never starves another), in offset order per partition.
SELECT segment_id, topic, partition, start_offset, end_offset, files, published_at
FROM (SELECT r.segment_id, r.topic, r.partition, r.start_offset, r.end_offset, s.files, s.published_at,
             row_number() OVER (PARTITION BY r.topic, r.partition ORDER BY r.start_offset) AS n
      FROM ingest_segment_ranges r JOIN ingest_segments s ON s.id = r.segment_id
      WHERE r.source = %(source)s AND s.replaced_by IS NULL
        AND r.end_offset > coalesce((%(offsets)s::jsonb ->> (r.topic || '/' || r.partition))::bigint, -1)) p
WHERE n <= %(limit)s
ORDER BY topic, partition, start_offset;

-- name: upsert_advance
-- Commit seq of an upsert table: its offsets and cross-partition keys, only onto seq - 1.
UPDATE ingest_tables
SET committed_seq = %(seq)s, upsert_offsets = %(offsets)s::jsonb,
    cross_partition_keys = cross_partition_keys + %(cross_partition_keys)s,
    last_snapshot_id = %(snapshot_id)s, last_commit_at = %(committed_at)s
WHERE source = %(source)s AND kind = %(kind)s AND committed_seq = %(seq)s - 1;
