-- Payments hardening: captures that re-check their order, creates known not to have been
-- made, and refunds that give up after a bounded number of tries.

-- Set when the outbox worker has checked the order and is about to capture; a void of the
-- same payment waits while a capture is in flight, so the two never race at the provider.
ALTER TABLE payment_attempts ADD COLUMN capture_claimed_at TIMESTAMPTZ;
-- A create call for this attempt may have reached the provider (it timed out, or failed
-- after sending). When false and no payment id is known, nothing was ever created and the
-- attempt closes at expiry without asking the provider.
ALTER TABLE payment_attempts ADD COLUMN create_uncertain BOOLEAN NOT NULL DEFAULT false;

-- Refunds the provider refused `payments.refund_tries_max` times are FAILED: surfaced in
-- metrics, alerts and `flashgate reconcile`, for a person to finish.
ALTER TABLE refunds ADD COLUMN tries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE refunds ADD COLUMN last_error TEXT;
ALTER TABLE refunds DROP CONSTRAINT refunds_status_check;
ALTER TABLE refunds ADD CONSTRAINT refunds_status_check
    CHECK (status IN ('PENDING', 'SUCCEEDED', 'FAILED'));
