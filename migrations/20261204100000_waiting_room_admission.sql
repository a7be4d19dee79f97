-- How a waiting room sets its outflow: `fixed` admits `wr_admit_per_second` as before;
-- `adaptive` lets the advancer move the rate between `wr_min_per_second` and
-- `wr_max_per_second` from the health the instances report, cutting it when the admitted
-- buyers' order p99 passes `wr_target_p99_ms`.
ALTER TABLE deals
    ADD COLUMN wr_admission_mode text NOT NULL DEFAULT 'fixed'
        CHECK (wr_admission_mode IN ('fixed', 'adaptive')),
    ADD COLUMN wr_min_per_second int NOT NULL DEFAULT 1 CHECK (wr_min_per_second >= 1),
    ADD COLUMN wr_max_per_second int NOT NULL DEFAULT 100,
    ADD COLUMN wr_target_p99_ms int NOT NULL DEFAULT 500 CHECK (wr_target_p99_ms >= 1),
    ADD CONSTRAINT deals_wr_admission_bounds CHECK (wr_max_per_second >= wr_min_per_second);
