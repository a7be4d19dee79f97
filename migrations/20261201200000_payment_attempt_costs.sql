-- What the first payment attempt of each order costs the batch that places it. A profile of
-- the batch function showed the hook re-parsing and re-planning its statement on every
-- call (a SQL-language function keeps no plan between calls), and the attempt writing one
-- index entry more than it needs.

-- PL/pgSQL keeps the statement's plan for the connection's lifetime. The order row already
-- holds the deal's capture method (its snapshot), so the deal is no longer read.
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

-- An attempt has no provider payment id until the provider created the payment, and
-- uniqueness never applies to a missing one: only attempts that have it are indexed. Every
-- lookup names the id (`provider_payment_id = $2`), which implies it is present, so the
-- partial index serves the same queries and enforces the same rule.
ALTER TABLE payment_attempts DROP CONSTRAINT payment_attempts_provider_provider_payment_id_key;
CREATE UNIQUE INDEX payment_attempts_provider_payment ON payment_attempts (provider, provider_payment_id)
    WHERE provider_payment_id IS NOT NULL;
