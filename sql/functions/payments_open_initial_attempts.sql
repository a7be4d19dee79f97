-- payments_open_initial_attempts: the current definition. PostgreSQL runs exactly this text
-- after every migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- Payments' part of placing orders: the first payment attempt of every order a batch
-- placed, written in the batch's own transaction. The order engine knows it only as a hook
-- it runs by name (`orders_place_batch(..., p_hook)`, named in `src/payments/attempts.rs`),
-- so orders does not depend on payments. PL/pgSQL, so the statement's plan is kept for the
-- connection's lifetime; the order row already holds the deal's capture method.
CREATE OR REPLACE FUNCTION payments_open_initial_attempts(p_orders uuid[], p_provider text)
RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO payment_attempts (id, order_id, provider, status, amount_minor, currency,
                                  capture_method)
    SELECT gen_random_uuid(), o.id, p_provider, 'PENDING', o.amount_minor, o.currency,
           o.capture_method
      FROM orders o
     WHERE o.id = ANY (p_orders);
END
$fn$;
