-- Waiting room: per-deal settings of the queue that admits buyers at a controlled rate.
-- The queue itself lives in Redis; these columns only say whether a deal has one and how
-- it behaves. Deals created before this migration have no waiting room.
ALTER TABLE deals
    ADD COLUMN wr_enabled           BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN wr_admit_per_second  INTEGER NOT NULL DEFAULT 100
        CHECK (wr_admit_per_second BETWEEN 1 AND 100000),
    ADD COLUMN wr_max_active        INTEGER NOT NULL DEFAULT 1000
        CHECK (wr_max_active BETWEEN 1 AND 10000000),
    ADD COLUMN wr_pass_ttl_seconds  INTEGER NOT NULL DEFAULT 120
        CHECK (wr_pass_ttl_seconds BETWEEN 1 AND 86400),
    ADD COLUMN wr_queue_order       TEXT NOT NULL DEFAULT 'fifo'
        CHECK (wr_queue_order IN ('fifo', 'random')),
    ADD COLUMN wr_prequeue_opens_at TIMESTAMPTZ;

-- The advancer reads the deals whose line it must move.
CREATE INDEX deals_waiting_room ON deals (id) WHERE wr_enabled;
