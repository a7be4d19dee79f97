//! Background work that keeps payments moving without a browser: the provider check that
//! runs before an unpaid order may expire, and the reconciler (the outbox worker is in
//! [`super::effects`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Payments;
use super::applied::Applied;
use super::attempts::{self, Attempt};
use super::provider::{ProviderError, ProviderPayment, ProviderStatus};
use super::refunds;
use super::settle;
use crate::domain::{AttemptStatus, OrderStatus};
use crate::store::StoreError;
use crate::telemetry;

/// Deals whose units came back during a pass (their sold-out flags must clear).
pub type Released = Vec<String>;

pub(super) fn released(applied: &Applied) -> Option<String> {
    applied.released_deal().map(str::to_owned)
}

/// Overdue payments asked about at once, so a slow provider delays a batch by one answer
/// rather than by one answer per order.
const OVERDUE_CONCURRENCY: usize = 8;

impl Payments {
    /// The payment after a capture or void; when the provider refused because the payment
    /// moved on (captured already, cancelled, paid), its current state instead.
    pub(super) async fn settled_view(
        &self,
        result: Result<ProviderPayment, ProviderError>,
        id: &str,
    ) -> Result<ProviderPayment, ProviderError> {
        match result {
            Err(ProviderError::Conflict(_)) => self.provider.get_payment(id).await,
            other => other,
        }
    }

    /// Before an unpaid order may expire, asks the provider about each of its pending
    /// attempts and applies the answer through [`settle::apply`]: paid ones are settled,
    /// authorisations are captured only after their amount was checked (through the outbox,
    /// which re-checks the order), open checkout sessions are cancelled, closed ones close
    /// the attempt and expire the order. When the provider cannot be reached the order waits,
    /// at most `payments.expiry_grace_seconds` (then the sweeper expires it regardless).
    pub async fn check_overdue(&self, pool: &PgPool) -> Result<Released, StoreError> {
        let due = overdue_attempts(pool, self.settings.reconcile_batch_max).await?;
        let mut deals = Released::new();
        for chunk in due.chunks(OVERDUE_CONCURRENCY) {
            let mut checks = tokio::task::JoinSet::new();
            for attempt in chunk.iter().cloned() {
                let (payments, pool) = (self.clone(), pool.clone());
                checks.spawn(async move {
                    let outcome = payments.resolve_overdue(&pool, &attempt).await;
                    (attempt, outcome)
                });
            }
            while let Some(joined) = checks.join_next().await {
                let Ok((attempt, outcome)) = joined else {
                    tracing::error!("overdue payment check panicked");
                    continue;
                };
                deals.extend(self.after_overdue(pool, &attempt, outcome).await?);
            }
        }
        Ok(deals)
    }

    /// What an overdue check leaves: released units, or a later question to the provider.
    async fn after_overdue(
        &self,
        pool: &PgPool,
        attempt: &Attempt,
        outcome: Result<Applied, OutboxError>,
    ) -> Result<Option<String>, StoreError> {
        let backoff = self.settings.check_backoff_max_seconds;
        match outcome {
            Ok(applied) => {
                if matches!(applied, Applied::Authorized | Applied::Pending) {
                    attempts::postpone(pool, self.writes, attempt.id, backoff).await?;
                }
                Ok(released(&applied))
            }
            Err(error) => {
                if !matches!(&error, OutboxError::Provider(e) if e.is_transient()) {
                    tracing::warn!(%error, attempt = %attempt.id, "overdue payment check failed");
                }
                attempts::postpone(pool, self.writes, attempt.id, backoff).await?;
                Ok(None)
            }
        }
    }

    async fn resolve_overdue(
        &self,
        pool: &PgPool,
        attempt: &Attempt,
    ) -> Result<Applied, OutboxError> {
        let payment = match &attempt.provider_payment_id {
            Some(id) => self.provider.get_payment(id).await?,
            // Never sent to the provider (every create was refused): nothing to ask about.
            None if !attempt.create_uncertain => {
                return Ok(settle::close_never_created(pool, attempt.id).await?);
            }
            None => {
                // The same request as the order's earlier tries, so the provider answers
                // with the payment they may have created (a different body is refused).
                let order_expires_at: DateTime<Utc> =
                    sqlx::query_scalar("SELECT expires_at FROM orders WHERE id = $1")
                        .bind(attempt.order_id)
                        .fetch_one(pool)
                        .await
                        .map_err(StoreError::from)?;
                self.create_at_provider(attempt, order_expires_at).await?
            }
        };
        // An open checkout session is closed first; everything else (an authorisation
        // included: it is never captured here, before its amount was checked) is applied as
        // the provider reports it.
        let payment = match payment.status {
            ProviderStatus::RequiresPayment => {
                let mut closed = self
                    .settled_view(self.provider.void(&payment.id).await, &payment.id)
                    .await?;
                // Cancelled because its order's time ran out: the session expired.
                if closed.status == ProviderStatus::Canceled {
                    closed.status = ProviderStatus::Expired;
                }
                closed
            }
            _ => payment,
        };
        Ok(settle::apply(pool, self.provider.name(), &payment).await?)
    }

    /// One reconciliation pass; every finding is counted and logged.
    pub async fn reconcile(&self, pool: &PgPool) -> Result<Vec<Finding>, StoreError> {
        let mut findings = Vec::new();
        findings.extend(self.reconcile_pending(pool).await?);
        findings.extend(unrefunded_extras(pool, self.settings.reconcile_batch_max).await?);
        findings.extend(stuck_refunds(pool).await?);
        findings.extend(failed_refunds(pool, self.settings.reconcile_batch_max).await?);
        findings.extend(self.reconcile_paid(pool).await?);
        for finding in &findings {
            metrics::counter!(telemetry::RECONCILER_FINDINGS, "kind" => finding.kind).increment(1);
            tracing::warn!(kind = finding.kind, subject = %finding.subject, detail = %finding.detail, "reconciler finding");
        }
        Ok(findings)
    }

    /// Pending attempts older than the threshold: the provider's word is applied (a lost
    /// webhook for a paid payment is the case this repairs).
    async fn reconcile_pending(&self, pool: &PgPool) -> Result<Vec<Finding>, StoreError> {
        let stale = stale_pending(
            pool,
            self.settings.reconcile_after_seconds,
            self.settings.reconcile_batch_max,
        )
        .await?;
        let mut findings = Vec::new();
        for attempt in stale {
            let Some(id) = &attempt.provider_payment_id else {
                continue;
            };
            let Ok(payment) = self.provider.get_payment(id).await else {
                continue;
            };
            if payment.status == ProviderStatus::Succeeded {
                findings.push(Finding::new(
                    "paid_at_provider_pending_locally",
                    attempt.id,
                    json!({ "provider_payment_id": id }),
                ));
            }
            if let Ok(Applied::MismatchRejected { .. }) =
                settle::apply(pool, self.provider.name(), &payment).await
            {
                findings.push(Finding::new(
                    "amount_mismatch",
                    attempt.id,
                    json!({ "provider_amount_minor": payment.amount_minor }),
                ));
            }
        }
        Ok(findings)
    }

    /// Recently paid orders: the provider must agree that the money is there.
    async fn reconcile_paid(&self, pool: &PgPool) -> Result<Vec<Finding>, StoreError> {
        let paid = recently_accepted(pool, self.settings.reconcile_batch_max).await?;
        let mut findings = Vec::new();
        for attempt in paid {
            let Some(id) = &attempt.provider_payment_id else {
                continue;
            };
            match self.provider.get_payment(id).await {
                Ok(payment)
                    if payment.amount_minor != attempt.amount_minor
                        || payment.currency != attempt.currency =>
                {
                    findings.push(Finding::new(
                        "amount_mismatch",
                        attempt.id,
                        json!({ "provider_amount_minor": payment.amount_minor }),
                    ));
                }
                Ok(payment) if payment.status != ProviderStatus::Succeeded => {
                    findings.push(Finding::new(
                        "paid_locally_not_at_provider",
                        attempt.id,
                        json!({ "provider_status": format!("{:?}", payment.status) }),
                    ));
                }
                Err(ProviderError::NotFound) => {
                    findings.push(Finding::new(
                        "paid_locally_unknown_at_provider",
                        attempt.id,
                        json!({ "provider_payment_id": id }),
                    ));
                }
                _ => {}
            }
        }
        Ok(findings)
    }
}

/// Something the reconciler found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    pub kind: &'static str,
    pub subject: Uuid,
    pub detail: Value,
}

impl Finding {
    fn new(kind: &'static str, subject: Uuid, detail: Value) -> Self {
        Self {
            kind,
            subject,
            detail,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum OutboxError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("unreadable outbox payload: {0}")]
    Payload(String),
}

pub(super) fn text(payload: &Value, field: &str) -> Result<String, OutboxError> {
    payload
        .get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| OutboxError::Payload(format!("missing {field}")))
}

const ATTEMPT_COLUMNS: &str =
    "a.id, a.order_id, a.provider, a.provider_payment_id, a.status, a.amount_minor,
    a.currency, a.capture_method, a.checkout_url, a.provider_expires_at, a.accepted, a.checks,
    a.created_at, a.create_uncertain";

async fn overdue_attempts(pool: &PgPool, batch_max: u32) -> Result<Vec<Attempt>, StoreError> {
    let sql = format!(
        "SELECT {ATTEMPT_COLUMNS} FROM payment_attempts a JOIN orders o ON o.id = a.order_id
          WHERE a.status = $2 AND a.next_check_at <= now()
            AND (o.expires_at <= now() OR o.status <> $3)
          ORDER BY o.expires_at LIMIT $1"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(i64::from(batch_max))
        .bind(AttemptStatus::Pending.as_str())
        .bind(OrderStatus::PendingPayment.as_str())
        .fetch_all(pool)
        .await?)
}

async fn stale_pending(
    pool: &PgPool,
    after_seconds: u32,
    batch_max: u32,
) -> Result<Vec<Attempt>, StoreError> {
    let sql = format!(
        "SELECT {ATTEMPT_COLUMNS} FROM payment_attempts a
          WHERE a.status = $3 AND a.created_at <= now() - make_interval(secs => $1)
          ORDER BY a.created_at LIMIT $2"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(f64::from(after_seconds))
        .bind(i64::from(batch_max))
        .bind(AttemptStatus::Pending.as_str())
        .fetch_all(pool)
        .await?)
}

async fn recently_accepted(pool: &PgPool, batch_max: u32) -> Result<Vec<Attempt>, StoreError> {
    let sql = format!(
        "SELECT {ATTEMPT_COLUMNS} FROM payment_attempts a
          WHERE a.accepted AND a.updated_at > now() - interval '1 day'
          ORDER BY a.updated_at DESC LIMIT $1"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(i64::from(batch_max))
        .fetch_all(pool)
        .await?)
}

/// Successful attempts that did not pay their order and have no refund: refund them. Money
/// held for manual review is an operator's to decide (it moves to accepted or refunded in
/// the same transaction as its order leaves review).
async fn unrefunded_extras(pool: &PgPool, batch_max: u32) -> Result<Vec<Finding>, StoreError> {
    let sql = format!(
        "SELECT {ATTEMPT_COLUMNS} FROM payment_attempts a
          WHERE a.status = $2 AND NOT a.accepted
            AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.attempt_id = a.id)
            AND NOT EXISTS (SELECT 1 FROM orders o
                             WHERE o.id = a.order_id AND o.status = $3)
          LIMIT $1"
    );
    let extras: Vec<Attempt> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(i64::from(batch_max))
        .bind(AttemptStatus::Succeeded.as_str())
        .bind(OrderStatus::ManualReview.as_str())
        .fetch_all(pool)
        .await?;
    let mut findings = Vec::new();
    for attempt in extras {
        let mut tx = pool.begin().await?;
        refunds::request(&mut tx, &attempt, "reconciler_extra_payment").await?;
        tx.commit().await?;
        findings.push(Finding::new(
            "unrefunded_extra_payment",
            attempt.id,
            json!({ "order_id": attempt.order_id }),
        ));
    }
    Ok(findings)
}

/// Refunds still pending ten minutes after they were requested.
async fn stuck_refunds(pool: &PgPool) -> Result<Vec<Finding>, StoreError> {
    let stuck = refunds::stuck(pool).await?;
    Ok(stuck
        .into_iter()
        .map(|(id, order_id)| Finding::new("refund_stuck", id, json!({ "order_id": order_id })))
        .collect())
}

/// Refunds given up on after `payments.refund_tries_max` refusals: money a person must
/// return.
async fn failed_refunds(pool: &PgPool, batch_max: u32) -> Result<Vec<Finding>, StoreError> {
    Ok(refunds::failed(pool, batch_max)
        .await?
        .into_iter()
        .map(|r| {
            let detail = json!({ "order_id": r.order_id, "amount_minor": r.amount_minor,
                "currency": r.currency, "tries": r.tries, "last_error": r.last_error });
            Finding::new("refund_failed", r.id, detail)
        })
        .collect())
}

/// Runs `pass` every `interval` until `shutdown`, handing released deals to `on_released`.
pub async fn every<P, PF, R, RF>(
    interval: Duration,
    shutdown: CancellationToken,
    pass: P,
    on_released: R,
) where
    P: Fn() -> PF,
    PF: Future<Output = Result<Released, StoreError>>,
    R: Fn(Released) -> RF,
    RF: Future<Output = ()>,
{
    loop {
        match pass().await {
            Ok(deals) if !deals.is_empty() => on_released(deals).await,
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "payment worker pass failed"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
