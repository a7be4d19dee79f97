-- The event log: what the sale did, told to the shop's systems (pushed as signed webhooks
-- to the endpoints below, or pulled from GET /admin/events).
--
-- An event exists if and only if its change committed: the rows are written by statement
-- triggers on the changed tables, inside the changing transaction. A reservation batch adds
-- one INSERT ... SELECT over the statement's new order rows (not one statement per order);
-- orders the batch refuses and deletes take their event with them in the same transaction.
--
-- Commit order: `id` is taken when the row is written, and a transaction with a lower id
-- may commit after one with a higher id. A reader following ids could step past it for
-- good. So one sequencer (src/events/sequencer.rs, under an advisory lock) gives committed
-- rows their `position` in the order it first sees them committed, and the feed and the
-- deliveries follow `position` only: a position, once given, is never given again below
-- the highest one. Two changes of one order hold its row lock one after the other, so the
-- later event has the higher id and is never positioned before the earlier one.
CREATE TABLE events (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Place in the feed, given by the sequencer after the commit; NULL until then.
    position      BIGINT,
    type          TEXT NOT NULL,
    -- The order the event is about; NULL for an event about the deal itself.
    order_id      UUID,
    deal_id       TEXT NOT NULL,
    -- 1, 2, 3... per order (or per deal, for deal events), in the order of the changes. An
    -- order's is set by its change; a deal's by the sequencer with its position (NULL until).
    sequence      INTEGER CHECK (sequence >= 1),
    -- The order's status after the change, or NULL for a deal event.
    status        TEXT,
    user_id       TEXT,
    quantity      INTEGER,
    amount_minor  BIGINT,
    currency      TEXT,
    -- Deal events: the deal's paused flag and available units after the change.
    paused        BOOLEAN,
    available     BIGINT,
    -- The changing transaction's time on the database clock.
    occurred_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX events_position ON events (position) WHERE position IS NOT NULL;
-- The sequencer's work queue: only rows still waiting for a position are indexed.
CREATE INDEX events_unpositioned ON events (id) WHERE position IS NULL;
CREATE UNIQUE INDEX events_order_sequence ON events (order_id, sequence)
    WHERE order_id IS NOT NULL;
CREATE UNIQUE INDEX events_deal_sequence ON events (deal_id, sequence)
    WHERE order_id IS NULL AND sequence IS NOT NULL;
CREATE INDEX events_occurred ON events (occurred_at) WHERE position IS NOT NULL;

-- The event type a new order status announces.
CREATE FUNCTION events_order_type(p_status text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT CASE p_status
        WHEN 'PENDING_PAYMENT' THEN 'order.reserved'
        WHEN 'PAID' THEN 'order.paid'
        WHEN 'CANCELLED' THEN 'order.cancelled'
        WHEN 'EXPIRED' THEN 'order.expired'
        WHEN 'REFUND_PENDING' THEN 'order.refund_pending'
        WHEN 'REFUNDED' THEN 'order.refunded'
        WHEN 'MANUAL_REVIEW' THEN 'order.needs_review'
    END
$fn$;

-- New orders: one INSERT ... SELECT for the whole statement; a new order's first event.
CREATE FUNCTION events_orders_inserted() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO events (type, order_id, deal_id, sequence, status, user_id, quantity,
                        amount_minor, currency)
    SELECT events_order_type(n.status), n.id, n.deal_id, 1, n.status, n.user_id, n.quantity,
           n.amount_minor, n.currency
      FROM new_rows n;
    RETURN NULL;
END
$fn$;

-- A changed status is an event; other column changes (timestamps, review notes) are not.
CREATE FUNCTION events_orders_updated() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO events (type, order_id, deal_id, sequence, status, user_id, quantity,
                        amount_minor, currency)
    SELECT events_order_type(n.status), n.id, n.deal_id,
           coalesce((SELECT max(e.sequence) FROM events e WHERE e.order_id = n.id), 0) + 1,
           n.status, n.user_id, n.quantity, n.amount_minor, n.currency
      FROM new_rows n JOIN old_rows o ON o.id = n.id
     WHERE n.status IS DISTINCT FROM o.status
     ORDER BY n.id;
    RETURN NULL;
END
$fn$;

-- An order the reservation batch inserted and then refused never existed for anyone else;
-- neither does its event.
CREATE FUNCTION events_orders_deleted() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM events e USING old_rows o WHERE e.order_id = o.id;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER events_orders_inserted AFTER INSERT ON orders
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION events_orders_inserted();
CREATE TRIGGER events_orders_updated AFTER UPDATE ON orders
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION events_orders_updated();
CREATE TRIGGER events_orders_deleted AFTER DELETE ON orders
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION events_orders_deleted();

-- Pausing and resuming a deal. The sequencer numbers deal events as it positions them,
-- together with the sold-out and reopened events it writes itself.
CREATE FUNCTION events_deals_updated() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO events (type, deal_id, paused, available)
    SELECT CASE WHEN n.paused THEN 'deal.paused' ELSE 'deal.resumed' END, n.id,
           n.paused,
           (SELECT coalesce(sum(b.available), 0) FROM inventory_buckets b WHERE b.deal_id = n.id)
      FROM new_rows n JOIN old_rows o ON o.id = n.id
     WHERE n.paused <> o.paused
     ORDER BY n.id;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER events_deals_updated AFTER UPDATE ON deals
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION events_deals_updated();

-- Where the shop wants events pushed. `position` is how far the endpoint has accepted.
CREATE TABLE event_endpoints (
    id                     UUID PRIMARY KEY,
    url                    TEXT NOT NULL,
    -- NULL: every type.
    event_types            TEXT[],
    enabled                BOOLEAN NOT NULL DEFAULT true,
    -- Raw key bytes of the `whsec_` secret; the previous one still signs until it lapses.
    secret                 BYTEA NOT NULL,
    previous_secret        BYTEA,
    previous_until         TIMESTAMPTZ,
    -- 'active', or 'failing' once deliveries failed past `events.failing_after_seconds`.
    state                  TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'failing')),
    delivered_position     BIGINT NOT NULL DEFAULT 0,
    failing_since          TIMESTAMPTZ,
    last_error             TEXT,
    created_at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at             TIMESTAMPTZ NOT NULL DEFAULT now()
);
