-- No query looks orders up by deal any more: the sold-out mirror reads who holds a deal from
-- inventory's per-user counters. The index was one more entry written for every purchase.
DROP INDEX orders_deal_status;
