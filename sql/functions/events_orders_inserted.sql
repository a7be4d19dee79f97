-- events_orders_inserted: the current definition. PostgreSQL runs exactly this text after every
-- migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- Statement trigger on `orders` (src/events/): new orders' first events, one INSERT ... SELECT
-- for the whole statement (a reservation batch's orders together), sequence 1.
CREATE OR REPLACE FUNCTION events_orders_inserted() RETURNS trigger
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
