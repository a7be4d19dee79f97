//! Filling the line: real tickets taken through the gateway, `join_concurrency` at a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};

use super::CrowdConfig;
use super::impatient::Arrival;
use super::timers::{Client, user_id};
use crate::line::signed_position;

/// The line, filled.
pub struct Joined {
    pub clients: Vec<Client>,
    pub elapsed: Duration,
}

/// Takes `tickets` real tickets through the gateway, `join_concurrency` at a time; the
/// clients that ignore the window start polling as soon as they hold their ticket.
pub async fn join_all(
    http: &reqwest::Client,
    config: &CrowdConfig,
    deal_id: &str,
    impatient: &mpsc::UnboundedSender<Arrival>,
) -> Result<Joined, String> {
    let started = Instant::now();
    let url = Arc::new(format!("{}/v1/deals/{deal_id}/queue", config.origin_url));
    let permits = Arc::new(Semaphore::new(config.join_concurrency.max(1)));
    let (tx, mut rx) = mpsc::unbounded_channel();
    for user in 0..config.tickets as u32 {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let (http, url, tx) = (http.clone(), url.clone(), tx.clone());
        let token = config.operator.token(&user_id(user), 7200);
        tokio::spawn(async move {
            let joined = join_one(&http, &url, &token).await;
            let _ = tx.send((user, token, joined));
            drop(permit);
        });
    }
    drop(tx);
    let abandon = config.abandon_fraction;
    let ignore = f64::from(config.ignore_window_percent) / 100.0;
    let mut clients = Vec::with_capacity(config.tickets);
    while let Some((user, token, joined)) = rx.recv().await {
        let joined = joined.map_err(|e| format!("user {user} could not join: {e}"))?;
        let abandoned = rand::random::<f64>() < abandon;
        let ignores_window = !abandoned && rand::random::<f64>() < ignore;
        if ignores_window {
            let _ = impatient.send(Arrival {
                ticket: joined.ticket.clone(),
                token,
                position_token: joined.position_token,
                position: joined.position,
                refresh_seconds: joined.refresh_seconds,
            });
        }
        clients.push(Client {
            ticket: joined.ticket,
            user,
            position: joined.position,
            abandoned,
            ignores_window,
        });
    }
    clients.sort_unstable_by_key(|c| c.position);
    Ok(Joined {
        clients,
        elapsed: started.elapsed(),
    })
}

/// A join's answer.
struct Ticket {
    ticket: String,
    position_token: String,
    /// From the signed position token.
    position: u64,
    refresh_seconds: f64,
}

/// One join, retried on 429/503 as a client would.
async fn join_one(http: &reqwest::Client, url: &str, token: &str) -> Result<Ticket, String> {
    for _ in 0..20 {
        let response = http.post(url).bearer_auth(token).send().await;
        let Ok(response) = response else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if response.status().as_u16() == 201 {
            let body: Value = response.json().await.map_err(|e| e.to_string())?;
            let ticket = body["ticket"].as_str().ok_or("no ticket")?.to_owned();
            let token = body["position_token"].as_str().ok_or("no position token")?;
            return Ok(Ticket {
                ticket,
                position: signed_position(token)?,
                position_token: token.to_owned(),
                refresh_seconds: body["refresh_after_seconds"].as_f64().unwrap_or(1.0),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err("the gateway kept refusing".into())
}
