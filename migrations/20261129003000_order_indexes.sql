-- Plain indexes on the order id of every table that refers to orders, so that reading an
-- order's payment, checking foreign keys when a group deletes the orders it refused, and
-- finishing refunds never scan whole tables.
CREATE INDEX reservation_lines_order_all ON reservation_lines (order_id);
CREATE INDEX payment_attempts_order_newest ON payment_attempts (order_id, created_at DESC, id DESC);
CREATE INDEX refunds_order ON refunds (order_id);
