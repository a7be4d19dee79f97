-- events_deals_updated: the current definition. PostgreSQL runs exactly this text after every
-- migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- Statement trigger on `deals` (src/events/): pausing and resuming a deal are events; the
-- sequencer numbers them as it positions them.
CREATE OR REPLACE FUNCTION events_deals_updated() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO events (type, deal_id, paused, available)
    SELECT CASE WHEN n.paused THEN 'deal.paused' ELSE 'deal.resumed' END, n.id,
           n.paused,
           (SELECT coalesce(sum(b.available), 0) FROM inventory_buckets b WHERE b.deal_id = n.id)
      FROM new_rows n JOIN old_rows o ON o.id = n.id
     WHERE n.paused <> o.paused
     ORDER BY n.id;
    RETURN NULL;
END
$fn$;
