-- A payment attempt named its order through a foreign key checked row by row: for every
-- purchase placed with a payment provider configured, one more query and a lock on the
-- order row that the same statement had just inserted, with a WAL record of its own. Both
-- statements that create attempts select the order row they attach to (the batch's hook
-- for the orders it placed, and a later attempt under the order's lock), and an order that
-- has attempts is never deleted: the batch removes only orders it refused, before its hook
-- runs. A settlement whose attempt has no order is refused and rolled back.
ALTER TABLE payment_attempts DROP CONSTRAINT payment_attempts_order_id_fkey;
