-- Units that became available again after the deal opened: reservations given back and
-- stock added. It only grows. A sold-out mirror that read who holds a deal when it saw no
-- units left compares it later: unchanged, nobody can have ordered since; moved, the stock
-- went round (given back, then sold again) and the holders must be read again.
ALTER TABLE inventory_buckets ADD COLUMN freed BIGINT NOT NULL DEFAULT 0 CHECK (freed >= 0);
