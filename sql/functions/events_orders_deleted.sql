-- events_orders_deleted: the current definition. PostgreSQL runs exactly this text after every
-- migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- Statement trigger on `orders` (src/events/): an order the reservation batch inserted and
-- then refused takes its event with it, in the same transaction.
CREATE OR REPLACE FUNCTION events_orders_deleted() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM events e USING old_rows o WHERE e.order_id = o.id;
    RETURN NULL;
END
$fn$;
