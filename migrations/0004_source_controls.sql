-- What operators ask of a source's workers; workers poll it with their heartbeat.
-- running: consume; suspended: publish what is held, then pause (stay in the group);
-- draining: publish everything held, report drained, then exit (or stay idle: drain_stay).
ALTER TABLE ingest_sources
    ADD COLUMN desired_state text NOT NULL DEFAULT 'running'
        CHECK (desired_state IN ('running', 'suspended', 'draining')),
    ADD COLUMN drain_stay boolean NOT NULL DEFAULT false,
    ADD COLUMN control_changed_at timestamptz;
