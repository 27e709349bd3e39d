-- The gap ledger: offsets a partition needed that the log no longer held (retention deleted
-- them, or the topic was re-created). Nothing is skipped without a row here.
-- skipped = false: the partition stopped at from_offset (on_offset_out_of_range = "fail");
-- skipped = true: next_offset was moved from from_offset to to_offset in the same transaction
-- that wrote the row (on_offset_out_of_range = "earliest"). Operators acknowledge each gap.
CREATE TABLE ingest_offset_gaps (
    id               bigserial PRIMARY KEY,
    source           text NOT NULL REFERENCES ingest_sources (name),
    topic            text NOT NULL,
    partition        integer NOT NULL CHECK (partition >= 0),
    from_offset      bigint NOT NULL CHECK (from_offset >= 0),
    to_offset        bigint NOT NULL,
    skipped          boolean NOT NULL DEFAULT false,
    worker           text NOT NULL,
    detected_at      timestamptz NOT NULL DEFAULT now(),
    skipped_at       timestamptz,
    acknowledged_at  timestamptz,
    acknowledged_by  text,
    CHECK (to_offset > from_offset),
    -- A partition stops or skips at a given offset once: detecting it again updates the row.
    UNIQUE (source, topic, partition, from_offset)
);
