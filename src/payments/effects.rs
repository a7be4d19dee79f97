//! The outbox worker: carries out the side effects recorded with payment state changes
//! (captures, voids, refunds, paid notices), at least once.
//!
//! A capture first re-checks its order and marks itself in flight; a void of the same
//! payment waits while a capture is in flight, so the two never race at the provider and a
//! cancelled order is never captured. A refund the provider keeps refusing is retried with
//! backoff `payments.refund_tries_max` times, then marked FAILED and surfaced.

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::Payments;
use super::applied::Applied;
use super::attempts::{self, CaptureClaim};
use super::outbox::{self, Entry, Kind};
use super::refunds;
use super::settle;
use super::workers::{OutboxError, Released, released, text};
use crate::store::StoreError;
use crate::telemetry;

impl Payments {
    /// Carries out due outbox entries; returns how many were claimed.
    pub async fn drain_outbox(&self, pool: &PgPool) -> Result<(usize, Released), StoreError> {
        let entries = outbox::claim(
            pool,
            self.writes,
            self.settings.outbox_batch_max,
            self.settings.outbox_lease_seconds,
        )
        .await?;
        let mut deals = Released::new();
        for entry in &entries {
            // One entry whose outcome cannot be recorded (the pool is busy, PostgreSQL is
            // away) must not strand the rest of the batch until their leases run out.
            match self.settle_entry(pool, entry).await {
                Ok(released) => deals.extend(released),
                Err(error) => {
                    tracing::warn!(%error, id = entry.id, kind = entry.kind.as_str(), "outbox entry not recorded; it runs again when its lease ends");
                }
            }
        }
        Ok((entries.len(), deals))
    }

    /// Carries out one claimed entry and records how it went.
    async fn settle_entry(&self, pool: &PgPool, entry: &Entry) -> Result<Released, StoreError> {
        match self.carry_out(pool, entry).await {
            Ok(applied) => {
                outbox::done(pool, self.writes, entry.id).await?;
                metrics::counter!(telemetry::OUTBOX_PROCESSED, "kind" => entry.kind.as_str(), "result" => "done").increment(1);
                Ok(applied.as_ref().and_then(released).into_iter().collect())
            }
            Err(error) => {
                self.failed_entry(pool, entry, &error).await?;
                Ok(Released::new())
            }
        }
    }

    /// An entry that did not go through: retried later with backoff; a refund that has used
    /// up its tries is given up on (and surfaced) instead.
    async fn failed_entry(
        &self,
        pool: &PgPool,
        entry: &Entry,
        error: &OutboxError,
    ) -> Result<(), StoreError> {
        let kind = entry.kind.as_str();
        if entry.kind == Kind::Refund
            && let Some(refund_id) = refund_id(&entry.payload)
        {
            let tries_max = self.settings.refund_tries_max;
            if refunds::record_failure(pool, self.writes, refund_id, &error.to_string(), tries_max)
                .await?
            {
                tracing::error!(%error, refund = %refund_id, tries = tries_max, "refund failed at the provider; given up, needs a person");
                metrics::counter!(telemetry::REFUNDS_FAILED).increment(1);
                outbox::done(pool, self.writes, entry.id).await?;
                metrics::counter!(telemetry::OUTBOX_PROCESSED, "kind" => kind, "result" => "failed").increment(1);
                return Ok(());
            }
        }
        tracing::warn!(%error, id = entry.id, kind, attempts = entry.attempts, "outbox entry will be retried");
        outbox::retry_later(pool, self.writes, entry.id, &error.to_string()).await?;
        metrics::counter!(telemetry::OUTBOX_PROCESSED, "kind" => kind, "result" => "retry")
            .increment(1);
        Ok(())
    }

    async fn carry_out(
        &self,
        pool: &PgPool,
        entry: &Entry,
    ) -> Result<Option<Applied>, OutboxError> {
        match entry.kind {
            Kind::OrderPaid => {
                tracing::info!(payload = %entry.payload, "order paid");
                Ok(None)
            }
            Kind::Refund => self.refund(pool, &entry.payload).await.map(|()| None),
            Kind::Capture => self.capture(pool, &entry.payload).await,
            Kind::Void => self.void(pool, &entry.payload).await.map(Some),
        }
    }

    async fn refund(&self, pool: &PgPool, payload: &Value) -> Result<(), OutboxError> {
        let refund_id =
            refund_id(payload).ok_or_else(|| OutboxError::Payload("refund_id".into()))?;
        let amount = payload
            .get("amount_minor")
            .and_then(Value::as_i64)
            .ok_or_else(|| OutboxError::Payload("missing amount_minor".into()))?;
        let payment_id = text(payload, "provider_payment_id")?;
        let refund = self
            .provider
            .refund(&payment_id, amount, &format!("refund-{refund_id}"))
            .await?;
        // A refund the provider has not finished stays PENDING; its refund webhook (or the
        // reconciler's stuck-refund finding) completes it.
        if refund.succeeded {
            refunds::complete(pool, refund_id, &refund.id).await?;
        }
        Ok(())
    }

    /// Captures only while the order still waits for this money; otherwise voids.
    async fn capture(
        &self,
        pool: &PgPool,
        payload: &Value,
    ) -> Result<Option<Applied>, OutboxError> {
        let attempt_id = attempt_id(payload)?;
        let grace = self.settings.expiry_grace_seconds;
        match attempts::claim_capture(pool, self.writes, attempt_id, grace).await? {
            CaptureClaim::Settled => Ok(None),
            CaptureClaim::OrderGone => {
                attempts::drop_capture_claim(pool, self.writes, attempt_id).await?;
                self.void(pool, payload).await.map(Some)
            }
            CaptureClaim::Claimed => {
                let id = text(payload, "provider_payment_id")?;
                let payment = self
                    .settled_view(self.provider.capture(&id).await, &id)
                    .await?;
                Ok(Some(
                    settle::apply(pool, self.provider.name(), &payment).await?,
                ))
            }
        }
    }

    /// Voids the payment, after any capture of it in flight has been settled.
    async fn void(&self, pool: &PgPool, payload: &Value) -> Result<Applied, OutboxError> {
        if attempts::capture_in_flight(pool, attempt_id(payload)?).await? {
            return Err(OutboxError::Payload(
                "a capture of this payment is in flight; the void waits for it".into(),
            ));
        }
        let id = text(payload, "provider_payment_id")?;
        let payment = self
            .settled_view(self.provider.void(&id).await, &id)
            .await?;
        Ok(settle::apply(pool, self.provider.name(), &payment).await?)
    }
}

fn refund_id(payload: &Value) -> Option<Uuid> {
    Uuid::parse_str(payload.get("refund_id")?.as_str()?).ok()
}

fn attempt_id(payload: &Value) -> Result<Uuid, OutboxError> {
    let raw = text(payload, "attempt_id")?;
    Uuid::parse_str(&raw).map_err(|e| OutboxError::Payload(e.to_string()))
}
