-- events_orders_updated: the current definition. PostgreSQL runs exactly this text after every
-- migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- Statement trigger on `orders` (src/events/): a changed status is an event, numbered after
-- the order's previous one; other column changes are not events.
CREATE OR REPLACE FUNCTION events_orders_updated() RETURNS trigger
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
