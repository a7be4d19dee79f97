-- A third late-payment policy, 'manual_review': money that arrives after its order gave
-- its units back parks the order in MANUAL_REVIEW (holding no units) until an operator
-- fulfils it, when units are left, or refunds it.
ALTER TABLE deals DROP CONSTRAINT deals_late_payment_policy_check;
ALTER TABLE deals ADD CONSTRAINT deals_late_payment_policy_check
    CHECK (late_payment_policy IN ('reserve_or_refund', 'refund', 'manual_review'));

ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN (
    'PENDING_PAYMENT', 'PAID', 'EXPIRED', 'CANCELLED', 'REFUND_PENDING', 'REFUNDED',
    'MANUAL_REVIEW'));

-- When the order entered review: the queue is worked oldest first, and its age alerted on.
ALTER TABLE orders ADD COLUMN review_since TIMESTAMPTZ;
CREATE INDEX orders_manual_review ON orders (review_since) WHERE status = 'MANUAL_REVIEW';
