//! Creating payments at the provider for orders.
//!
//! The attempt row exists before the provider is called (it is written with the order),
//! and its id is the idempotency key of the create call. A create that times out is
//! therefore simply repeated later (on a retried order request, by the sweeper or by the
//! reconciler) and returns the same payment; it is never taken for a failure. A create
//! whose connection was refused sent nothing: unless an earlier call may have reached the
//! provider (`create_uncertain`), such an attempt was never created and closes at expiry
//! without asking the provider.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::Payments;
use super::attempts::{self, Attempt, AttemptStatus, Keyed};
use super::outbox::{self, Kind};
use super::provider::{CreatePayment, ProviderError, ProviderPayment};
use crate::domain::CaptureMethod;
use crate::store::StoreError;

/// The payment block of an order response.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PaymentView {
    pub attempt_id: Uuid,
    /// The provider's name: the `{provider}` of the webhooks that report this attempt.
    pub provider: String,
    /// Where to send the payer; null until the provider has answered.
    pub checkout_url: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

impl PaymentView {
    pub fn of(attempt: &Attempt) -> Self {
        Self {
            attempt_id: attempt.id,
            provider: attempt.provider.clone(),
            checkout_url: attempt.checkout_url.clone(),
            expires_at: attempt.provider_expires_at,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    #[error("order not found")]
    NotFound,
    #[error("the order is not waiting for payment")]
    NotPending,
    /// The reservation ended at `expires_at`: no attempt is started at or after it.
    #[error("the order's reservation has expired; no new payment can be started")]
    Expired,
    /// The order used up `payments.attempts_per_order_max`.
    #[error("the order already has {0} payment attempts, the most allowed")]
    AttemptsExhausted(u32),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Payments {
    /// Creates `attempt` at the provider if that has not happened yet, and records the
    /// answer. A provider failure leaves the attempt as it was, to be created later with the
    /// same key. Returns the attempt as it now stands.
    pub async fn open(
        &self,
        pool: &PgPool,
        attempt: Attempt,
        order_expires_at: DateTime<Utc>,
    ) -> Result<Attempt, StoreError> {
        if attempt.provider_payment_id.is_some() {
            return Ok(attempt);
        }
        match self.create_at_provider(&attempt, order_expires_at).await {
            Ok(payment) => self.record(pool, attempt, &payment).await,
            Err(error) => {
                tracing::warn!(%error, attempt = %attempt.id, "payment not created yet; will retry with the same key");
                // A refused connection sent nothing; anything else may have created it.
                if !error.never_sent() && !attempt.create_uncertain {
                    attempts::mark_create_uncertain(pool, self.writes, attempt.id).await?;
                }
                Ok(attempt)
            }
        }
    }

    /// The create call for `attempt`, keyed by its id. The body depends only on the attempt
    /// and the order's expiry, never on the time of the call: a create repeated after a
    /// timeout must send the same request, or the provider refuses it as a conflicting
    /// reuse of the key and the payment it may already have made is never learnt.
    pub async fn create_at_provider(
        &self,
        attempt: &Attempt,
        order_expires_at: DateTime<Utc>,
    ) -> Result<ProviderPayment, ProviderError> {
        let remaining = (order_expires_at - attempt.created_at).num_seconds().max(0);
        let seconds = u32::try_from(remaining)
            .unwrap_or(u32::MAX)
            .max(self.settings.session_seconds_min);
        let request = CreatePayment {
            idempotency_key: format!("attempt-{}", attempt.id),
            amount_minor: attempt.amount_minor,
            currency: attempt.currency.clone(),
            reference: attempt.id,
            order_id: attempt.order_id,
            capture_manual: attempt.capture_method == CaptureMethod::Manual,
            expires_in_seconds: seconds.min(86_400),
        };
        self.provider.create_payment(&request).await
    }

    async fn record(
        &self,
        pool: &PgPool,
        mut attempt: Attempt,
        payment: &ProviderPayment,
    ) -> Result<Attempt, StoreError> {
        attempts::record_created(
            pool,
            attempt.id,
            attempt.order_id,
            &payment.id,
            payment.checkout_url.as_deref(),
            payment.expires_at,
        )
        .await?;
        attempt.provider_payment_id = Some(payment.id.clone());
        attempt.checkout_url = payment.checkout_url.clone();
        attempt.provider_expires_at = payment.expires_at;
        Ok(attempt)
    }

    /// The payment of a just placed (or replayed) order: its first attempt, opened at the
    /// provider if need be.
    pub async fn for_new_order(
        &self,
        pool: &PgPool,
        order_id: Uuid,
        expires_at: DateTime<Utc>,
        pending: bool,
    ) -> Result<Option<Attempt>, StoreError> {
        let Some(attempt) = attempts::initial(pool, order_id).await? else {
            return Ok(None);
        };
        // A replay of an order that no longer waits for payment must not open a checkout.
        if !pending {
            return Ok(Some(attempt));
        }
        Ok(Some(self.open(pool, attempt, expires_at).await?))
    }

    /// The order was cancelled: close its open checkout sessions at the provider (through
    /// the outbox), so the payer cannot pay for units that went back on sale. A payment
    /// that slips through anyway is a late payment and is settled as one.
    pub async fn close_open_attempts(
        &self,
        pool: &PgPool,
        order_id: Uuid,
    ) -> Result<(), StoreError> {
        let mut conn = self.writes.acquire(pool).await?;
        for (attempt_id, provider_payment_id) in
            attempts::open_at_provider(&mut conn, order_id).await?
        {
            let payload =
                json!({ "attempt_id": attempt_id, "provider_payment_id": provider_payment_id });
            outbox::enqueue(
                &mut conn,
                Kind::Void,
                &format!("void:{attempt_id}"),
                payload,
            )
            .await?;
        }
        conn.commit().await
    }

    /// Starts (or, for a key used before, returns) another attempt for a pending order whose
    /// reservation has not expired and that has attempts left.
    pub async fn start_attempt(
        &self,
        pool: &PgPool,
        order_id: Uuid,
        expires_at: DateTime<Utc>,
        key: &str,
    ) -> Result<(Attempt, bool), CheckoutError> {
        let max = self.settings.attempts_per_order_max;
        let keyed = attempts::insert_keyed(pool, order_id, self.provider.name(), key, max).await?;
        let attempt = match keyed {
            Keyed::Created(attempt) => attempt,
            Keyed::Replayed(attempt, true) if attempt.status == AttemptStatus::Pending => {
                return Ok((self.open(pool, attempt, expires_at).await?, true));
            }
            Keyed::Replayed(attempt, _) => return Ok((attempt, true)),
            Keyed::NotPending => return Err(CheckoutError::NotPending),
            Keyed::Expired => return Err(CheckoutError::Expired),
            Keyed::Exhausted => return Err(CheckoutError::AttemptsExhausted(max)),
        };
        Ok((self.open(pool, attempt, expires_at).await?, false))
    }
}
