-- The order's snapshot of its deal grows from price and currency to everything a receipt or
-- a late payment needs: the deal's name, its late-payment policy and its capture method,
-- as they were when the order was placed. Webhooks, the review queue and receipts read the
-- order, never the deal as it is now (a renamed deal or a changed policy does not reach
-- orders already placed). Deals carry no tax, so there is none to keep.
ALTER TABLE orders
    ADD COLUMN deal_name TEXT,
    ADD COLUMN late_payment_policy TEXT,
    ADD COLUMN capture_method TEXT;

UPDATE orders o
   SET deal_name = d.name, late_payment_policy = d.late_payment_policy,
       capture_method = d.capture_method
  FROM deals d
 WHERE d.id = o.deal_id;

-- Filled from the deal at insert unless the inserting statement set them itself, so every
-- path that places orders takes the snapshot in the order's own transaction.
CREATE FUNCTION orders_snapshot_deal() RETURNS trigger
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

CREATE TRIGGER orders_snapshot_deal BEFORE INSERT ON orders
    FOR EACH ROW EXECUTE FUNCTION orders_snapshot_deal();

ALTER TABLE orders
    ALTER COLUMN deal_name SET NOT NULL,
    ALTER COLUMN late_payment_policy SET NOT NULL,
    ALTER COLUMN capture_method SET NOT NULL;
