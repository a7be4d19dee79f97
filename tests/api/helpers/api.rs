//! A client for one gateway: the requests tests send, and how they read `/readyz`.

use std::time::Duration;

use flashgate::config::Settings;
use serde_json::{Value, json};

use super::{
    EVENTUALLY, Reply, eventually, http_client, http_client_from, poll_every, send, unique_suffix,
    wait_until,
};

/// A client for one gateway; cheap to clone into tasks.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    /// The operations listener: `/metrics` and `/admin/*` live there.
    pub ops_base: String,
    pub client: reqwest::Client,
    pub admin_token: String,
    pub jwt_secret: String,
}

impl Api {
    pub fn new(base: &str, ops_base: &str, settings: &Settings) -> Api {
        Api {
            base: base.to_owned(),
            ops_base: ops_base.to_owned(),
            client: http_client(),
            admin_token: settings.auth.admin_token.clone(),
            jwt_secret: settings.auth.jwt_secret.clone(),
        }
    }

    /// The same gateway seen from another client address.
    pub fn seen_from(&self, local: &str) -> Api {
        Api {
            client: http_client_from(Some(local.parse().unwrap())),
            ..self.clone()
        }
    }

    /// A gateway process yet to be started on two free loopback ports.
    pub fn on_free_ports(settings: &Settings) -> Api {
        let base = format!("http://127.0.0.1:{}", super::free_port());
        let ops = format!("http://127.0.0.1:{}", super::free_port());
        Api::new(&base, &ops, settings)
    }

    /// `host:port` of the public listener.
    pub fn public_listen(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// `host:port` of the operations listener.
    pub fn ops_listen(&self) -> &str {
        self.ops_base.trim_start_matches("http://")
    }

    /// The URL of `path`: operator paths (`/metrics`, `/admin/…`) on the operations
    /// listener, everything else on the public one.
    pub fn url(&self, path: &str) -> String {
        if path == "/metrics" || path.starts_with("/admin/") {
            format!("{}{}", self.ops_base, path)
        } else {
            self.public_url(path)
        }
    }

    /// `path` on the public listener, whatever it is.
    pub fn public_url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> Reply {
        send(self.client.get(self.url(path))).await
    }

    pub fn token(&self, user: &str) -> String {
        flashgate::auth::mint_token(&self.jwt_secret, user, 3600)
    }

    pub async fn create_deal(&self, body: &Value) -> Reply {
        let request = self.client.post(self.url("/admin/deals"));
        send(request.bearer_auth(&self.admin_token).json(body)).await
    }

    /// Creates a deal that must be accepted; returns its id.
    pub async fn given_deal(&self, body: &Value) -> String {
        let reply = self.create_deal(body).await;
        assert_eq!(reply.status, 201, "deal not created: {}", reply.text);
        body["id"].as_str().unwrap().to_owned()
    }

    pub async fn adjust_stock(&self, deal: &str, delta: i64) -> Reply {
        let request = self
            .client
            .post(self.url(&format!("/admin/deals/{deal}/stock")));
        send(
            request
                .bearer_auth(&self.admin_token)
                .json(&json!({ "delta": delta })),
        )
        .await
    }

    /// The admin inventory document; must answer 200.
    pub async fn inventory(&self, deal: &str) -> Value {
        let request = self
            .client
            .get(self.url(&format!("/admin/deals/{deal}/inventory")));
        send(request.bearer_auth(&self.admin_token))
            .await
            .expect(200)
    }

    pub async fn get_deal(&self, deal: &str) -> Reply {
        self.get(&format!("/v1/deals/{deal}")).await
    }

    pub async fn deal_state(&self, deal: &str) -> String {
        let body = self.get_deal(deal).await.expect(200);
        body["state"]
            .as_str()
            .expect("state is a string")
            .to_owned()
    }

    /// Polls the public deal until it reads `state`; panics after `EVENTUALLY`.
    pub async fn wait_for_deal_state(&self, deal: &str, state: &str) {
        let reached = eventually(EVENTUALLY, || async move {
            (self.deal_state(deal).await == state).then_some(())
        })
        .await;
        let last = self.deal_state(deal).await;
        assert!(
            reached.is_some(),
            "deal {deal} never read {state:?} (last: {last:?})"
        );
    }

    pub async fn place_order(&self, token: &str, deal: &str, key: &str, quantity: i64) -> Reply {
        let request = self
            .client
            .post(self.url(&format!("/v1/deals/{deal}/orders")));
        let request = request.bearer_auth(token).header("Idempotency-Key", key);
        send(request.json(&json!({ "quantity": quantity }))).await
    }

    /// Places an order for `user` with a fresh idempotency key.
    pub async fn order(&self, user: &str, deal: &str, quantity: i64) -> Reply {
        self.place_order(&self.token(user), deal, &unique_suffix(), quantity)
            .await
    }

    /// Places an order, retrying with the same key while the gateway answers 503 overloaded;
    /// once `EVENTUALLY` has passed, the answer of one last try.
    pub async fn place_order_retrying(
        &self,
        token: &str,
        deal: &str,
        key: &str,
        quantity: i64,
    ) -> Reply {
        let placed = poll_every(Duration::from_millis(50), EVENTUALLY, || async {
            let reply = self.place_order(token, deal, key, quantity).await;
            if reply.status != 503 {
                return Some(reply);
            }
            assert_eq!(
                reply.problem_slug().as_deref(),
                Some("overloaded"),
                "503: {}",
                reply.text
            );
            None
        })
        .await;
        match placed {
            Ok(reply) => reply,
            Err(_) => self.place_order(token, deal, key, quantity).await,
        }
    }

    /// Orders until one succeeds while stock comes back; every miss must be 409 sold-out.
    pub async fn order_eventually(&self, user: &str, deal: &str, quantity: i64) -> Value {
        wait_until(
            &format!("stock of {deal} to come back"),
            EVENTUALLY,
            || async {
                let reply = self.order(user, deal, quantity).await;
                if reply.status == 201 {
                    return Some(reply.json());
                }
                reply.expect_problem(409, "sold-out");
                None
            },
        )
        .await
    }

    pub async fn get_order(&self, token: &str, order_id: &str) -> Reply {
        send(
            self.client
                .get(self.url(&format!("/v1/orders/{order_id}")))
                .bearer_auth(token),
        )
        .await
    }

    pub async fn cancel_order(&self, token: &str, order_id: &str) -> Reply {
        let request = self
            .client
            .post(self.url(&format!("/v1/orders/{order_id}/cancel")));
        send(request.bearer_auth(token)).await
    }

    /// An operator's `POST /admin/deals/{deal}/queue/revoke` of `user`; its answer (200).
    pub async fn revoke_in_line(&self, deal: &str, user: &str) -> Value {
        let request = self
            .client
            .post(self.url(&format!("/admin/deals/{deal}/queue/revoke")))
            .bearer_auth(&self.admin_token)
            .json(&json!({ "user_id": user }));
        send(request).await.expect(200)
    }

    pub async fn metrics(&self) -> String {
        let reply = self.get("/metrics").await;
        assert_eq!(reply.status, 200, "metrics: {}", reply.text);
        reply.text
    }
}

/// What `/readyz` says about Redis: the JSON found under a "redis" member, lower-cased.
pub fn readyz_redis(body: &Value) -> Option<String> {
    match body {
        Value::Object(map) => map.iter().find_map(|(key, value)| {
            if key.eq_ignore_ascii_case("redis") {
                Some(value.to_string().to_lowercase())
            } else {
                readyz_redis(value)
            }
        }),
        Value::Array(items) => items.iter().find_map(readyz_redis),
        _ => None,
    }
}

pub fn redis_reported_down(body: &Value) -> bool {
    let state =
        readyz_redis(body).unwrap_or_else(|| panic!("/readyz says nothing about redis: {body}"));
    [
        "down",
        "unavailable",
        "unreachable",
        "disconnected",
        "false",
        "error",
        "degraded",
    ]
    .iter()
    .any(|word| state.contains(word))
}

pub fn redis_reported_up(body: &Value) -> bool {
    let state =
        readyz_redis(body).unwrap_or_else(|| panic!("/readyz says nothing about redis: {body}"));
    !redis_reported_down(body)
        && ["up", "ok", "true", "connected", "ready"]
            .iter()
            .any(|w| state.contains(w))
}
