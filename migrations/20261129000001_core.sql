-- Core schema: deals, their inventory split over bucket rows, orders with expiring
-- reservations, and the per-user unit counters that enforce purchase limits.

CREATE TABLE deals (
    id                       TEXT PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9._-]{1,64}$'),
    name                     TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    stock_total              BIGINT NOT NULL CHECK (stock_total >= 0),
    bucket_count             INTEGER NOT NULL CHECK (bucket_count BETWEEN 1 AND 1024),
    unit_price_minor         BIGINT NOT NULL CHECK (unit_price_minor >= 0),
    currency                 TEXT NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    per_user_limit           INTEGER NOT NULL CHECK (per_user_limit >= 1),
    reservation_ttl_seconds  INTEGER NOT NULL CHECK (reservation_ttl_seconds BETWEEN 1 AND 86400),
    starts_at                TIMESTAMPTZ,
    ends_at                  TIMESTAMPTZ,
    created_at               TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (starts_at IS NULL OR ends_at IS NULL OR starts_at < ends_at)
);

-- One row per bucket. A reservation is a conditional decrement of `available` on one or
-- more rows; units move available -> reserved -> sold, or back to available on release.
CREATE TABLE inventory_buckets (
    deal_id    TEXT NOT NULL REFERENCES deals (id),
    bucket     INTEGER NOT NULL CHECK (bucket >= 0),
    available  BIGINT NOT NULL CHECK (available >= 0),
    reserved   BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    sold       BIGINT NOT NULL DEFAULT 0 CHECK (sold >= 0),
    PRIMARY KEY (deal_id, bucket)
);

CREATE TABLE orders (
    id                   UUID PRIMARY KEY,
    user_id              TEXT NOT NULL,
    deal_id              TEXT NOT NULL REFERENCES deals (id),
    idempotency_key      TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    -- Hash of what the request asked for; a replayed key with another request is a conflict.
    request_fingerprint  BYTEA NOT NULL,
    status               TEXT NOT NULL CHECK (status IN (
        'PENDING_PAYMENT', 'PAID', 'EXPIRED', 'CANCELLED', 'REFUND_PENDING', 'REFUNDED')),
    quantity             INTEGER NOT NULL CHECK (quantity >= 1),
    -- Price snapshot taken from the deal when the order was placed.
    unit_price_minor     BIGINT NOT NULL CHECK (unit_price_minor >= 0),
    amount_minor         BIGINT NOT NULL CHECK (amount_minor = unit_price_minor * quantity),
    currency             TEXT NOT NULL,
    expires_at           TIMESTAMPTZ NOT NULL,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (user_id, idempotency_key)
);

-- The sweeper's work queue: only orders still holding stock are indexed.
CREATE INDEX orders_pending_expiry ON orders (expires_at) WHERE status = 'PENDING_PAYMENT';
CREATE INDEX orders_deal_status ON orders (deal_id, status);

-- Which buckets an order's units came from, so release returns them to the same rows.
CREATE TABLE reservation_lines (
    order_id  UUID NOT NULL REFERENCES orders (id),
    deal_id   TEXT NOT NULL,
    bucket    INTEGER NOT NULL,
    quantity  INTEGER NOT NULL CHECK (quantity >= 1),
    PRIMARY KEY (order_id, bucket),
    FOREIGN KEY (deal_id, bucket) REFERENCES inventory_buckets (deal_id, bucket)
);

-- Units a user holds in a deal (pending or paid). The per-user limit is enforced here by a
-- guarded upsert, so concurrent requests of one user cannot pass it together.
CREATE TABLE user_deal_units (
    deal_id     TEXT NOT NULL REFERENCES deals (id),
    user_id     TEXT NOT NULL,
    units       INTEGER NOT NULL CHECK (units >= 0),
    limit_units INTEGER NOT NULL CHECK (limit_units >= 1),
    PRIMARY KEY (deal_id, user_id),
    CHECK (units <= limit_units)
);
