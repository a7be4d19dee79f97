-- Payments' part of placing orders: the first payment attempt of every order a batch
-- placed, written in the batch's own transaction. The order engine knows it only as a hook
-- it runs by name (`orders_place_batch(..., p_hook)`), so orders does not depend on payments.
CREATE FUNCTION payments_open_initial_attempts(p_orders uuid[], p_provider text)
RETURNS void
LANGUAGE sql AS $fn$
    INSERT INTO payment_attempts (id, order_id, provider, status, amount_minor, currency,
                                  capture_method)
    SELECT gen_random_uuid(), o.id, p_provider, 'PENDING', o.amount_minor, o.currency,
           d.capture_method
      FROM orders o JOIN deals d ON d.id = o.deal_id
     WHERE o.id = ANY (p_orders)
$fn$;
