//! What the simulator's requests and answers are before hyper sees them: the matched
//! route, the reply, and the JSON body. Below both the server, which turns them into hyper
//! types, and the handlers, which act on them.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::Value;

use super::model::SimError;

/// A matched route; ids are raw path segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    Healthz,
    CreateIntent,
    GetIntent(&'a str),
    Capture(&'a str),
    Cancel(&'a str),
    IntentRefunds(&'a str),
    CreateRefund,
    GetRefund(&'a str),
    CheckoutPage(&'a str),
    Pay(&'a str),
    Decline(&'a str),
    GetFaults,
    SetFaults,
    ResetFaults,
    ForceSucceed(&'a str),
    Amend(&'a str),
    FlushWebhooks,
    Events,
    ListIntents,
    AdvanceClock,
    GetWebhookUrl,
    SetWebhookUrl,
}

impl<'a> Route<'a> {
    /// `Err` is 404 for an unknown path and 405 for a known path with another method.
    pub fn of(method: &Method, path: &'a str) -> Result<Self, SimError> {
        let segments: Vec<&'a str> = path.trim_start_matches('/').split('/').collect();
        if let Some(route) = Self::matching(method, &segments) {
            return Ok(route);
        }
        let other_method = [Method::GET, Method::POST, Method::DELETE]
            .iter()
            .any(|m| Self::matching(m, &segments).is_some());
        if other_method {
            Err(SimError::MethodNotAllowed)
        } else {
            Err(SimError::NotFound(format!("no route for {path}")))
        }
    }

    fn matching(method: &Method, segments: &[&'a str]) -> Option<Self> {
        let get = *method == Method::GET || *method == Method::HEAD;
        let post = *method == Method::POST;
        let delete = *method == Method::DELETE;
        let route = match segments {
            ["healthz"] if get => Route::Healthz,
            ["v1", "payment_intents"] if post => Route::CreateIntent,
            ["v1", "payment_intents", id] if get => Route::GetIntent(id),
            ["v1", "payment_intents", id, "capture"] if post => Route::Capture(id),
            ["v1", "payment_intents", id, "cancel"] if post => Route::Cancel(id),
            ["v1", "payment_intents", id, "refunds"] if get => Route::IntentRefunds(id),
            ["v1", "refunds"] if post => Route::CreateRefund,
            ["v1", "refunds", id] if get => Route::GetRefund(id),
            ["checkout", id] if get => Route::CheckoutPage(id),
            ["checkout", id, "pay"] if post => Route::Pay(id),
            ["checkout", id, "decline"] if post => Route::Decline(id),
            ["control", "faults"] if get => Route::GetFaults,
            ["control", "faults"] if post => Route::SetFaults,
            ["control", "faults"] if delete => Route::ResetFaults,
            ["control", "payment_intents"] if get => Route::ListIntents,
            ["control", "payment_intents", id, "succeed"] if post => Route::ForceSucceed(id),
            ["control", "payment_intents", id, "amend"] if post => Route::Amend(id),
            ["control", "webhooks", "flush"] if post => Route::FlushWebhooks,
            ["control", "events"] if get => Route::Events,
            ["control", "clock", "advance"] if post => Route::AdvanceClock,
            ["control", "webhook_url"] if get => Route::GetWebhookUrl,
            ["control", "webhook_url"] if post => Route::SetWebhookUrl,
            _ => return None,
        };
        Some(route)
    }

    /// The provider API proper: bearer token required, API faults apply.
    pub fn is_api(&self) -> bool {
        matches!(
            self,
            Route::CreateIntent
                | Route::GetIntent(_)
                | Route::Capture(_)
                | Route::Cancel(_)
                | Route::IntentRefunds(_)
                | Route::CreateRefund
                | Route::GetRefund(_)
        )
    }
}

/// An answer before it becomes a hyper response.
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: Bytes,
    pub replayed: bool,
}

impl Reply {
    pub fn json(value: &Value) -> Self {
        Reply {
            status: StatusCode::OK,
            content_type: "application/json",
            body: Bytes::from(value.to_string()),
            replayed: false,
        }
    }

    pub fn html(page: String) -> Self {
        Reply {
            status: StatusCode::OK,
            content_type: "text/html; charset=utf-8",
            body: Bytes::from(page),
            replayed: false,
        }
    }

    pub fn error(error: &SimError) -> Self {
        let mut reply = Reply::json(&error.body());
        reply.status =
            StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        reply
    }

    pub(crate) fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        if self.replayed {
            headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
        }
        response
    }
}

impl From<Result<Reply, SimError>> for Reply {
    fn from(result: Result<Reply, SimError>) -> Self {
        result.unwrap_or_else(|error| Reply::error(&error))
    }
}

/// Parses a JSON body; an empty body is `{}` so that bodiless POSTs work.
pub fn json_body(body: &[u8]) -> Result<Value, SimError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    serde_json::from_slice(body).map_err(|e| SimError::invalid(format!("body is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_method_and_path() {
        assert_eq!(
            Route::of(&Method::POST, "/v1/payment_intents/pi_1/capture"),
            Ok(Route::Capture("pi_1"))
        );
        assert_eq!(
            Route::of(&Method::DELETE, "/control/faults"),
            Ok(Route::ResetFaults)
        );
        assert_eq!(
            Route::of(&Method::GET, "/v1/refunds"),
            Err(SimError::MethodNotAllowed)
        );
        assert!(matches!(
            Route::of(&Method::GET, "/nope"),
            Err(SimError::NotFound(_))
        ));
    }
}
