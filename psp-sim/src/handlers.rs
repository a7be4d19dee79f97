//! One function per route group: the provider API, the checkout pages, the control API.

use std::time::Duration;

use http::HeaderMap;
use http::header::{ACCEPT, AUTHORIZATION};
use serde::Deserialize;
use serde_json::{Value, json};

use super::faults::FaultsPatch;
use super::ledger::{Created, parse_idempotency_key, to_json};
use super::model::{Action, SimError};
use super::route::{Reply, Route, json_body};
use super::{Sim, checkout, lock, parse_webhook_url};

/// Answers one request.
pub async fn dispatch(sim: &Sim, route: Route<'_>, headers: &HeaderMap, body: &[u8]) -> Reply {
    if route.is_api() {
        return api(sim, route, headers, body).await;
    }
    match route {
        Route::Healthz => Reply::json(&json!({ "status": "ok" })),
        Route::CheckoutPage(id) => sim
            .ledger
            .intent(id)
            .map(|intent| Reply::html(checkout::page(&intent)))
            .into(),
        Route::Pay(id) => checkout_action(sim, id, Action::Pay, headers),
        Route::Decline(id) => checkout_action(sim, id, Action::Decline, headers),
        _ => control(sim, route, body).into(),
    }
}

/// The bearer-token API, with the API faults applied around the operation.
async fn api(sim: &Sim, route: Route<'_>, headers: &HeaderMap, body: &[u8]) -> Reply {
    if !authorized(headers, &sim.api_key) {
        return Reply::error(&SimError::Authentication);
    }
    let fault = lock(&sim.faults).take_api_fault();
    let reply = if fault.perform {
        Some(api_operation(sim, route, headers, body))
    } else {
        None
    };
    if fault.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(fault.delay_ms)).await;
    }
    match (fault.fail_status, reply) {
        (Some(status), _) => Reply::error(&SimError::Injected(status)),
        (None, Some(reply)) => reply,
        (None, None) => Reply::error(&SimError::Injected(500)),
    }
}

fn api_operation(sim: &Sim, route: Route<'_>, headers: &HeaderMap, body: &[u8]) -> Reply {
    let ledger = &sim.ledger;
    let result = match route {
        Route::CreateIntent => keyed(headers, body, |key, body| {
            ledger.create_intent(key, body).map(replay_json)
        }),
        Route::GetIntent(id) => ledger.intent(id).map(|i| Reply::json(&to_json(&i))),
        Route::Capture(id) => object(ledger.act(id, Action::Capture)),
        Route::Cancel(id) => object(ledger.act(id, Action::Cancel)),
        Route::IntentRefunds(id) => ledger.refunds_of(id).map(|list| Reply::json(&list)),
        Route::CreateRefund => keyed(headers, body, |key, body| {
            ledger.create_refund(key, body).map(replay_json)
        }),
        Route::GetRefund(id) => ledger.refund(id).map(|r| Reply::json(&to_json(&r))),
        _ => Err(SimError::NotFound("not an API route".to_owned())),
    };
    result.into()
}

/// Parses the `Idempotency-Key` header and the JSON body, then runs `operation`.
fn keyed(
    headers: &HeaderMap,
    body: &[u8],
    operation: impl FnOnce(&str, &Value) -> Result<Reply, SimError>,
) -> Result<Reply, SimError> {
    let raw = headers.get("idempotency-key").map(|v| v.to_str());
    let raw = match raw {
        Some(Ok(key)) => Some(key),
        Some(Err(_)) => return Err(SimError::invalid("Idempotency-Key must be visible ASCII")),
        None => None,
    };
    let key = parse_idempotency_key(raw)?;
    let body = json_body(body)?;
    operation(&key, &body)
}

fn replay_json<T: serde::Serialize>(created: Created<T>) -> Reply {
    let mut reply = Reply::json(&to_json(&created.object));
    reply.replayed = created.replayed;
    reply
}

fn object<T: serde::Serialize>(result: Result<T, SimError>) -> Result<Reply, SimError> {
    result.map(|o| Reply::json(&to_json(&o)))
}

fn authorized(headers: &HeaderMap, api_key: &str) -> bool {
    let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(token) = value.strip_prefix("Bearer ") else {
        return false;
    };
    // Constant-time compare, as a real provider would.
    token.len() == api_key.len()
        && token
            .bytes()
            .zip(api_key.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// `POST /checkout/{id}/pay|decline`: JSON for scripts, a small page for browsers.
fn checkout_action(sim: &Sim, id: &str, action: Action, headers: &HeaderMap) -> Reply {
    let wants_html = headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    match sim.ledger.act(id, action) {
        Ok(intent) if wants_html => Reply::html(checkout::result(&intent)),
        Ok(intent) => Reply::json(&to_json(&intent)),
        Err(error) => Reply::error(&error),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClockAdvance {
    seconds: i64,
}

/// `POST /control/payment_intents/{id}/amend`: the provider's record changes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Amend {
    amount_minor: Option<i64>,
    currency: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookUrl {
    url: Option<String>,
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SimError> {
    serde_json::from_value(json_body(body)?).map_err(|e| SimError::invalid(e.to_string()))
}

/// The unauthenticated control API for tests.
fn control(sim: &Sim, route: Route<'_>, body: &[u8]) -> Result<Reply, SimError> {
    match route {
        Route::GetFaults => {}
        Route::SetFaults => {
            let patch: FaultsPatch = parse(body)?;
            lock(&sim.faults)
                .apply(patch)
                .map_err(SimError::InvalidRequest)?;
        }
        Route::ResetFaults => {
            *lock(&sim.faults) = Default::default();
            // Nothing stays held once reordering is off.
            sim.outbox.flush();
        }
        Route::ForceSucceed(id) => return object(sim.ledger.act(id, Action::ForceSucceed)),
        Route::Amend(id) => {
            let amend: Amend = parse(body)?;
            return object(sim.ledger.amend(id, amend.amount_minor, amend.currency));
        }
        Route::FlushWebhooks => {
            sim.outbox.flush();
            return Ok(Reply::json(&json!({ "flushed": true })));
        }
        Route::Events => return Ok(Reply::json(&events(sim))),
        Route::ListIntents => {
            let data: Vec<Value> = sim.ledger.intents().iter().map(to_json).collect();
            return Ok(Reply::json(&json!({ "data": data })));
        }
        Route::AdvanceClock => {
            let advance: ClockAdvance = parse(body)?;
            let now = sim.ledger.advance_clock(advance.seconds)?;
            return Ok(Reply::json(&json!({ "now": now })));
        }
        Route::GetWebhookUrl | Route::SetWebhookUrl => return webhook_url(sim, route, body),
        _ => return Err(SimError::NotFound("not a control route".to_owned())),
    }
    // The three fault routes answer with the faults now in force.
    Ok(Reply::json(&to_json(&*lock(&sim.faults))))
}

/// `GET|POST /control/webhook_url`: where webhooks go, settable after start so a test can
/// start the simulator before the receiver whose address it needs.
fn webhook_url(sim: &Sim, route: Route<'_>, body: &[u8]) -> Result<Reply, SimError> {
    if route == Route::SetWebhookUrl {
        let WebhookUrl { url } = parse(body)?;
        let url = url.map(|u| parse_webhook_url(&u)).transpose()?;
        sim.outbox.set_webhook_url(url);
    }
    Ok(Reply::json(&json!({ "url": sim.outbox.webhook_url() })))
}

/// `GET /control/events`: every event so far, oldest first, with its delivery record.
fn events(sim: &Sim) -> Value {
    let data: Vec<Value> = sim
        .outbox
        .events()
        .into_iter()
        .map(|record| {
            json!({
                "event": record.event,
                "deliveries": record.attempts,
                "successful_deliveries": record.successes,
                "delivered": record.successes > 0,
                "dropped": record.dropped,
            })
        })
        .collect();
    json!({ "data": data })
}
