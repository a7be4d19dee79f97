-- When a deal's line is in force: `always` queues every buyer as before; `when_busy` admits
-- a join at once while arrivals stay below the outflow, and queues buyers only once they go
-- past it (the state of the switch lives in Redis, with the line).
ALTER TABLE deals
    ADD COLUMN wr_activation text NOT NULL DEFAULT 'always'
        CHECK (wr_activation IN ('always', 'when_busy'));
