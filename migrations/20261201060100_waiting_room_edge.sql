-- Per-deal waiting-room terms for API clients and the waiting page: the proof-of-work
-- difficulty asked when joining (0: none) and the checkout a waiting page hands the pass to.
ALTER TABLE deals
    ADD COLUMN wr_pow_bits     INTEGER NOT NULL DEFAULT 0
        CHECK (wr_pow_bits BETWEEN 0 AND 32),
    ADD COLUMN wr_checkout_url TEXT
        CHECK (wr_checkout_url IS NULL OR length(wr_checkout_url) BETWEEN 1 AND 2000);
