-- Operations: the admin kill switch. A paused deal refuses new orders on every instance
-- (admission reads it from the deal cache, the order INSERT re-checks it in PostgreSQL);
-- orders already placed keep their reservations and can still be paid or cancelled.
ALTER TABLE deals ADD COLUMN paused BOOLEAN NOT NULL DEFAULT false;
