-- Payments: attempts at a provider, consumed provider events, refunds, and a transactional
-- outbox for side effects that must happen at least once outside the database.

-- What to do with money that arrives after the order stopped holding stock:
-- 'reserve_or_refund' takes the units again if any are left, else refunds;
-- 'refund' always refunds. With manual capture the authorisation is voided instead.
ALTER TABLE deals
    ADD COLUMN late_payment_policy TEXT NOT NULL DEFAULT 'reserve_or_refund'
        CHECK (late_payment_policy IN ('reserve_or_refund', 'refund')),
    ADD COLUMN capture_method TEXT NOT NULL DEFAULT 'automatic'
        CHECK (capture_method IN ('automatic', 'manual'));

-- Lines of an order that gave its units back are kept for history but marked released, so
-- a late payment can reserve the same order again without counting units twice.
ALTER TABLE reservation_lines DROP CONSTRAINT reservation_lines_pkey;
ALTER TABLE reservation_lines
    ADD COLUMN id BIGSERIAL PRIMARY KEY,
    ADD COLUMN released_at TIMESTAMPTZ;
CREATE INDEX reservation_lines_order ON reservation_lines (order_id) WHERE released_at IS NULL;

CREATE TABLE payment_attempts (
    id                   UUID PRIMARY KEY,
    order_id             UUID NOT NULL REFERENCES orders (id),
    provider             TEXT NOT NULL,
    -- Known once the provider answered the create call (sent with the attempt id as key).
    provider_payment_id  TEXT,
    status               TEXT NOT NULL CHECK (status IN ('PENDING', 'SUCCEEDED', 'FAILED', 'EXPIRED')),
    amount_minor         BIGINT NOT NULL CHECK (amount_minor >= 0),
    currency             TEXT NOT NULL,
    capture_method       TEXT NOT NULL CHECK (capture_method IN ('automatic', 'manual')),
    checkout_url         TEXT,
    provider_expires_at  TIMESTAMPTZ,
    -- The client's Idempotency-Key for attempts started with POST /v1/orders/{id}/payments.
    idempotency_key      TEXT,
    -- This attempt's money paid the order (at most one per order).
    accepted             BOOLEAN NOT NULL DEFAULT false,
    -- When the sweeper may ask the provider again about a payment still in progress.
    next_check_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    checks               INTEGER NOT NULL DEFAULT 0,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (provider, provider_payment_id)
);
CREATE UNIQUE INDEX payment_attempts_one_accepted ON payment_attempts (order_id) WHERE accepted;
CREATE UNIQUE INDEX payment_attempts_key ON payment_attempts (order_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The attempt created with the order (no client key of its own): one per order.
CREATE UNIQUE INDEX payment_attempts_initial ON payment_attempts (order_id)
    WHERE idempotency_key IS NULL;
CREATE INDEX payment_attempts_pending ON payment_attempts (order_id) WHERE status = 'PENDING';

-- Each provider event is consumed once.
CREATE TABLE payment_events (
    provider             TEXT NOT NULL,
    event_id             TEXT NOT NULL,
    event_type           TEXT NOT NULL,
    provider_payment_id  TEXT,
    outcome              TEXT NOT NULL,
    provider_created_at  TIMESTAMPTZ,
    received_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);

CREATE TABLE refunds (
    id                  UUID PRIMARY KEY,
    attempt_id          UUID NOT NULL UNIQUE REFERENCES payment_attempts (id),
    order_id            UUID NOT NULL REFERENCES orders (id),
    amount_minor        BIGINT NOT NULL CHECK (amount_minor >= 0),
    currency            TEXT NOT NULL,
    reason              TEXT NOT NULL,
    status              TEXT NOT NULL CHECK (status IN ('PENDING', 'SUCCEEDED')),
    provider_refund_id  TEXT,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Side effects written in the same transaction as the state change that causes them and
-- carried out at least once by a worker; every consumer is idempotent.
CREATE TABLE outbox (
    id            BIGSERIAL PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('order_paid', 'refund', 'capture', 'void')),
    dedupe_key    TEXT NOT NULL UNIQUE,
    payload       JSONB NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    available_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    done_at       TIMESTAMPTZ,
    last_error    TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX outbox_due ON outbox (available_at) WHERE done_at IS NULL;
