-- orders_snapshot_deal: the current definition. PostgreSQL runs exactly this text after
-- every migration (tests/api/sql_functions.rs); to change it, see sql/README.md.
--
-- The trigger function behind `orders_snapshot_deal` (BEFORE INSERT ON orders, only when the
-- inserting statement left part of the snapshot unset): it fills the order's snapshot of its
-- deal (name, late-payment policy, capture method) from the deal row, so every path that
-- places orders takes the snapshot in the order's own transaction. Webhooks, the review
-- queue and receipts read the order, never the deal as it is now.
CREATE OR REPLACE FUNCTION orders_snapshot_deal() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.deal_name IS NULL OR NEW.late_payment_policy IS NULL OR NEW.capture_method IS NULL THEN
        SELECT coalesce(NEW.deal_name, d.name),
               coalesce(NEW.late_payment_policy, d.late_payment_policy),
               coalesce(NEW.capture_method, d.capture_method)
          INTO NEW.deal_name, NEW.late_payment_policy, NEW.capture_method
          FROM deals d
         WHERE d.id = NEW.deal_id;
    END IF;
    RETURN NEW;
END
$fn$;
