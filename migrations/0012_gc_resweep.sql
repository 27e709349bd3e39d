-- gc sweeps a build more than once (ingest/ops/gc.py states the rule).
--
-- A build is swept once its last sweep, or its registration when it has none, is older than
-- the grace period and no split of it is building; it is closed, and never listed again, after
-- a sweep that was not its first and found nothing to delete. A file a writer puts into the
-- build's directories after one sweep (a Spark task that outlived its job, a registration
-- retried after a lost reply) is deleted by the next.

ALTER TABLE ingest_builds
    ADD COLUMN sweeps    integer NOT NULL DEFAULT 0 CHECK (sweeps >= 0),
    ADD COLUMN closed_at timestamptz;

COMMENT ON COLUMN ingest_builds.swept_at IS 'when gc last swept the build (NULL: never)';
COMMENT ON COLUMN ingest_builds.sweeps IS 'how many times gc swept the build';
COMMENT ON COLUMN ingest_builds.closed_at IS
    'when gc closed the build: after a sweep, not its first, that found nothing to delete; never swept again';

-- Builds swept before this migration were swept once, possibly while their job still wrote
-- (the earlier rule swept as soon as no split was building): each is swept again.
UPDATE ingest_builds SET sweeps = 1 WHERE swept_at IS NOT NULL;

DROP INDEX ingest_builds_unswept_idx;
CREATE INDEX ingest_builds_open_idx ON ingest_builds (source, created_at) WHERE closed_at IS NULL;
