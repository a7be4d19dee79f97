//! A deal's line as a buyer follows it: the place a join gave (read from the ticket's
//! signed token), the cached public line state while far from the front, the ticket's own
//! poll once within the check-in window.

use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

/// The position a token carries (the client reads it; the gateway signed it).
pub fn signed_position(token: &str) -> Result<u64, String> {
    let body = token.split('.').next().unwrap_or_default();
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|e| e.to_string())?;
    let payload: Value = serde_json::from_slice(&json).map_err(|e| e.to_string())?;
    payload["p"].as_u64().ok_or_else(|| "no position".into())
}

/// Takes a place in the deal's line and follows it as a waiting page does: the public line
/// state while far from the front (the position read from the ticket's signed token), the
/// ticket's own poll once within the check-in window, until admitted: the pass, or the
/// outcome to record (`queue_sold_out`, `queue_expired`, `queue_error`).
pub async fn wait_for_pass(
    client: &reqwest::Client,
    queue_url: &str,
    token: &str,
    deadline: Instant,
) -> Result<String, String> {
    let joined: Value = crate::pow::join(client, queue_url, token)
        .await
        .map_err(|_| "queue_error".to_owned())?
        .json()
        .await
        .map_err(|_| "queue_error".to_owned())?;
    let ticket = joined["ticket"].as_str().ok_or("queue_error")?.to_owned();
    let signed = joined["position_token"].as_str().unwrap_or_default();
    let position = signed_position(signed).map_err(|_| "queue_error".to_owned())?;
    let poll_url = format!("{queue_url}/{ticket}");
    let mut status = joined;
    while Instant::now() < deadline {
        match (status["state"].as_str(), status["pass"].as_str()) {
            (Some("admitted"), Some(pass)) => return Ok(pass.to_owned()),
            (Some("sold_out"), _) => return Err("queue_sold_out".into()),
            (Some("expired"), _) => return Err("queue_expired".into()),
            _ => {}
        }
        let refresh = status["refresh_after_seconds"]
            .as_f64()
            .unwrap_or(1.0)
            .clamp(0.2, 5.0);
        tokio::time::sleep(Duration::from_secs_f64(refresh)).await;
        let behind = position.saturating_sub(status["admitted_through"].as_u64().unwrap_or(0));
        let near = behind <= status["checkin_window_tickets"].as_u64().unwrap_or(0);
        // The public state is the same for everyone: asked without the token, as a CDN
        // caches it.
        let request = match near {
            true => client.get(&poll_url).bearer_auth(token),
            false => client.get(queue_url),
        };
        status = match request.send().await {
            Ok(response) => response.json().await.unwrap_or_default(),
            Err(_) => return Err("queue_error".into()),
        };
    }
    Err("queue_timeout".into())
}
