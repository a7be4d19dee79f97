//! The provider spoken to over HTTP: a hosted-checkout API in the shape of the simulator
//! (`flashgate-psp-sim`) and of the providers it imitates.
//!
//! Every call has a connect and a request timeout; transient failures are retried a
//! bounded number of times with jittered exponential backoff. All calls are safe to
//! repeat: creates and refunds carry idempotency keys, reads and state changes are
//! idempotent at the provider.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::PaymentSettings;
use super::breaker::{Breaker, CallOutcome};
use super::provider::*;
use super::signature;
use crate::clock::{Clock, monotonic};
use crate::telemetry;
use crate::telemetry::trace;

pub struct HttpProvider {
    name: String,
    base_url: String,
    api_key: String,
    webhook_secret: Vec<u8>,
    webhook_tolerance_seconds: i64,
    retries_max: u32,
    retry_backoff: Duration,
    client: reqwest::Client,
    breaker: Breaker,
    /// What the breaker's open time is measured on.
    clock: Clock,
}

/// Why the provider client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read payments.ca_file {path}: {message}")]
    CaFile { path: String, message: String },
    #[error("{0}")]
    Build(#[from] reqwest::Error),
}

impl HttpProvider {
    /// A client speaking HTTP or, for an `https` `base_url`, TLS through rustls, trusting
    /// the system's certificate authorities or only those in `payments.ca_file`.
    pub fn new(settings: &PaymentSettings, clock: Clock) -> Result<Self, ClientError> {
        let mut builder = reqwest::Client::builder()
            .tls_backend_rustls()
            .https_only(settings.base_url.starts_with("https://"))
            .connect_timeout(Duration::from_millis(settings.connect_timeout_ms))
            .timeout(Duration::from_millis(settings.request_timeout_ms));
        if !settings.ca_file.is_empty() {
            builder = builder.tls_certs_only(trusted_authorities(&settings.ca_file)?);
        }
        let client = builder.build()?;
        Ok(Self {
            name: settings.provider.clone(),
            base_url: settings.base_url.trim_end_matches('/').to_owned(),
            api_key: settings.api_key.clone(),
            webhook_secret: settings.webhook_secret.as_bytes().to_vec(),
            webhook_tolerance_seconds: i64::from(settings.webhook_tolerance_seconds),
            retries_max: settings.retries_max,
            retry_backoff: Duration::from_millis(settings.retry_backoff_ms),
            client,
            breaker: Breaker::new(
                settings.breaker_failures_max,
                Duration::from_millis(settings.breaker_open_ms),
            ),
            clock,
        })
    }

    /// One logical call: refused at once while the circuit breaker is open, otherwise
    /// retried while the failure is transient; timed and counted.
    async fn call(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Result<Value, ProviderError> {
        let Some(permit) = self.breaker.admit(self.clock.instant()) else {
            metrics::counter!(telemetry::PROVIDER_ERRORS, "op" => op, "kind" => ProviderError::CircuitOpen.label())
                .increment(1);
            return Err(ProviderError::CircuitOpen);
        };
        let outcome = self.call_with_retries(op, method, path, key, body).await;
        let health = match &outcome {
            Err(error) if error.is_transient() => CallOutcome::Failed,
            _ => CallOutcome::Answered,
        };
        self.breaker.record(permit, health, self.clock.instant());
        outcome
    }

    async fn call_with_retries(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Result<Value, ProviderError> {
        let started = monotonic();
        let mut span = trace::span("payment provider", trace::Kind::Client);
        span.attribute("flashgate.provider.operation", || op);
        let mut attempt = 0;
        let outcome = loop {
            match self
                .call_once(method.clone(), path, key, body.as_ref())
                .await
            {
                Err(error) if error.is_transient() && attempt < self.retries_max => {
                    attempt += 1;
                    tokio::time::sleep(jittered(self.retry_backoff, attempt)).await;
                }
                outcome => break outcome,
            }
        };
        metrics::histogram!(telemetry::PROVIDER_CALL_DURATION, "op" => op)
            .record(monotonic().saturating_duration_since(started).as_secs_f64());
        if let Err(error) = &outcome {
            metrics::counter!(telemetry::PROVIDER_ERRORS, "op" => op, "kind" => error.label())
                .increment(1);
            span.failed();
        }
        outcome
    }

    async fn call_once(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> Result<Value, ProviderError> {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base_url))
            .bearer_auth(&self.api_key);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|error| {
            if error.is_timeout() {
                ProviderError::Timeout
            } else if error.is_connect() {
                ProviderError::Refused(error.to_string())
            } else {
                ProviderError::Unavailable(error.to_string())
            }
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|_| ProviderError::Timeout)?;
        match status {
            s if s.is_success() => {
                serde_json::from_str(&text).map_err(|e| ProviderError::Rejected(e.to_string()))
            }
            StatusCode::NOT_FOUND => Err(ProviderError::NotFound),
            StatusCode::CONFLICT => Err(ProviderError::Conflict(text)),
            StatusCode::TOO_MANY_REQUESTS => Err(ProviderError::Unavailable(text)),
            s if s.is_server_error() => Err(ProviderError::Unavailable(format!("{s}: {text}"))),
            s => Err(ProviderError::Rejected(format!("{s}: {text}"))),
        }
    }

    async fn payment(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Result<ProviderPayment, ProviderError> {
        let value = self.call(op, method, path, key, body).await?;
        parse_payment(&value)
            .ok_or_else(|| ProviderError::Rejected(format!("unreadable payment: {value}")))
    }
}

/// The certificates of a PEM file, every one of them trusted as an authority.
fn trusted_authorities(path: &str) -> Result<Vec<reqwest::Certificate>, ClientError> {
    let failed = |message: String| ClientError::CaFile {
        path: path.to_owned(),
        message,
    };
    let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    let certificates =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| failed(e.to_string()))?;
    if certificates.is_empty() {
        return Err(failed("no certificate in it".to_owned()));
    }
    Ok(certificates)
}

/// `base × 2^attempt`, scaled by a random factor in [0.5, 1.5) so retries spread out.
fn jittered(base: Duration, attempt: u32) -> Duration {
    let exponential = base.saturating_mul(1 << attempt.min(10));
    exponential.mul_f64(0.5 + rand::random::<f64>())
}

#[derive(Deserialize)]
struct Intent {
    id: String,
    status: String,
    amount_minor: i64,
    currency: String,
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    checkout_url: Option<String>,
    #[serde(default)]
    expires_at: Option<i64>,
}

fn parse_payment(value: &Value) -> Option<ProviderPayment> {
    let intent: Intent = serde_json::from_value(value.clone()).ok()?;
    let status = match intent.status.as_str() {
        "requires_payment" | "processing" => ProviderStatus::RequiresPayment,
        "requires_capture" => ProviderStatus::RequiresCapture,
        "succeeded" => ProviderStatus::Succeeded,
        "failed" => ProviderStatus::Failed,
        "canceled" => ProviderStatus::Canceled,
        "expired" => ProviderStatus::Expired,
        _ => return None,
    };
    Some(ProviderPayment {
        id: intent.id,
        status,
        amount_minor: intent.amount_minor,
        currency: intent.currency,
        reference: intent.reference.and_then(|r| Uuid::parse_str(&r).ok()),
        checkout_url: intent.checkout_url,
        expires_at: intent
            .expires_at
            .and_then(|t| DateTime::<Utc>::from_timestamp(t, 0)),
    })
}

fn parse_refund(value: &Value) -> Option<ProviderRefund> {
    Some(ProviderRefund {
        id: value.get("id")?.as_str()?.to_owned(),
        payment_id: value.get("payment_intent")?.as_str()?.to_owned(),
        amount_minor: value.get("amount_minor")?.as_i64()?,
        succeeded: value.get("status")?.as_str()? == "succeeded",
    })
}

impl PaymentProvider for HttpProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn breaker_open(&self) -> bool {
        self.breaker.state() != super::breaker::BreakerState::Closed
    }

    fn create_payment<'a>(
        &'a self,
        request: &'a CreatePayment,
    ) -> BoxFuture<'a, Result<ProviderPayment, ProviderError>> {
        Box::pin(async move {
            let body = json!({
                "amount_minor": request.amount_minor,
                "currency": request.currency,
                "reference": request.reference.to_string(),
                "capture_method": if request.capture_manual { "manual" } else { "automatic" },
                "expires_in_seconds": request.expires_in_seconds,
                "metadata": { "order_id": request.order_id.to_string() },
            });
            let key = Some(request.idempotency_key.as_str());
            self.payment(
                "create",
                Method::POST,
                "/v1/payment_intents",
                key,
                Some(body),
            )
            .await
        })
    }

    fn get_payment<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<ProviderPayment, ProviderError>> {
        Box::pin(async move {
            let path = format!("/v1/payment_intents/{id}");
            self.payment("get", Method::GET, &path, None, None).await
        })
    }

    fn capture<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<ProviderPayment, ProviderError>> {
        Box::pin(async move {
            let path = format!("/v1/payment_intents/{id}/capture");
            self.payment("capture", Method::POST, &path, None, None)
                .await
        })
    }

    fn void<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<ProviderPayment, ProviderError>> {
        Box::pin(async move {
            let path = format!("/v1/payment_intents/{id}/cancel");
            self.payment("void", Method::POST, &path, None, None).await
        })
    }

    fn refund<'a>(
        &'a self,
        payment_id: &'a str,
        amount_minor: i64,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<ProviderRefund, ProviderError>> {
        Box::pin(async move {
            let body = json!({ "payment_intent": payment_id, "amount_minor": amount_minor });
            let value = self
                .call(
                    "refund",
                    Method::POST,
                    "/v1/refunds",
                    Some(idempotency_key),
                    Some(body),
                )
                .await?;
            parse_refund(&value)
                .ok_or_else(|| ProviderError::Rejected(format!("unreadable refund: {value}")))
        })
    }

    fn verify_webhook(
        &self,
        signature: Option<&[u8]>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<(), WebhookError> {
        signature::verify(
            &self.webhook_secret,
            signature,
            body,
            now_unix,
            self.webhook_tolerance_seconds,
        )
    }

    fn parse_event(&self, body: &[u8]) -> Result<ProviderEvent, WebhookError> {
        let value: Value = serde_json::from_slice(body).map_err(|_| WebhookError::Malformed)?;
        let id = value
            .get("id")
            .and_then(Value::as_str)
            .ok_or(WebhookError::Malformed)?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .ok_or(WebhookError::Malformed)?;
        let object = value
            .pointer("/data/object")
            .ok_or(WebhookError::Malformed)?;
        let subject = match object.get("object").and_then(Value::as_str) {
            Some("payment_intent") => {
                EventSubject::Payment(parse_payment(object).ok_or(WebhookError::Malformed)?)
            }
            Some("refund") => {
                EventSubject::Refund(parse_refund(object).ok_or(WebhookError::Malformed)?)
            }
            _ => EventSubject::Other,
        };
        Ok(ProviderEvent {
            id: id.to_owned(),
            kind: kind.to_owned(),
            created_at: value
                .get("created")
                .and_then(Value::as_i64)
                .and_then(|t| DateTime::<Utc>::from_timestamp(t, 0)),
            subject,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_payment_intents() {
        let value = json!({"id": "pi_1", "object": "payment_intent", "status": "requires_capture",
            "amount_minor": 500, "currency": "EUR", "reference": "01a2276a-0000-7000-8000-000000000000",
            "checkout_url": "http://x/checkout/pi_1", "expires_at": 1_800_000_000});
        let payment = parse_payment(&value).unwrap();
        assert_eq!(payment.status, ProviderStatus::RequiresCapture);
        assert!(payment.reference.is_some());
        assert_eq!(payment.expires_at.unwrap().timestamp(), 1_800_000_000);
        assert!(
            parse_payment(
                &json!({"id": "pi_1", "status": "weird", "amount_minor": 1, "currency": "EUR"})
            )
            .is_none()
        );
    }

    #[test]
    fn backoff_grows_and_jitters() {
        let base = Duration::from_millis(100);
        for attempt in 1..5 {
            let wait = jittered(base, attempt);
            let nominal = base * (1 << attempt);
            assert!(
                wait >= nominal / 2 && wait < nominal * 3 / 2,
                "{wait:?} for {attempt}"
            );
        }
    }
}
