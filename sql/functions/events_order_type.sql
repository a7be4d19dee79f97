-- events_order_type: the current definition. PostgreSQL runs exactly this text after every
-- migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- The event type a new order status announces (order.reserved for PENDING_PAYMENT, ...).
CREATE OR REPLACE FUNCTION events_order_type(p_status text) RETURNS text
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
