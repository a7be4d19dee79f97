-- A reservation line named its order through a foreign key checked at commit, row by row:
-- for every purchase one more query and a lock on the order row that the same statement
-- had just inserted, with a WAL record of its own. Lines are written only by the batch
-- function, for orders it placed in the same statement, and orders are never deleted once
-- placed. Inventory keeps no reference into a higher module's table; a line whose order is
-- missing is still found, by the audit's reserved and sold checks, which count lines
-- through their orders.
ALTER TABLE reservation_lines DROP CONSTRAINT reservation_lines_order_id_fkey;
