//! The harness: every test gets a fresh PostgreSQL database, its own Redis key prefix and a
//! real flashgate server on a free port, so tests can run in parallel without sharing state.

mod api;
mod db;
mod edge;
mod oidc;
mod process;
mod psp;
mod receiver;
mod redis_server;
mod source;
mod wait;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use flashgate::app::Application;
use flashgate::clock::Clock;
use flashgate::config::Settings;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use sqlx::postgres::PgPool;
use uuid::Uuid;

pub use api::*;
pub use db::*;
pub use edge::*;
pub use oidc::*;
pub use process::*;
pub use psp::*;
pub use receiver::*;
pub use redis_server::*;
pub use source::*;
pub use wait::*;

/// How long a test waits for something the gateway promises "within about a second".
pub const EVENTUALLY: Duration = Duration::from_secs(3);

/// A rate so high that no limiter ever triggers, for tests that are not about limits.
const UNLIMITED: u32 = 100_000;

pub fn base_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// `TEST_LOG=1` lets spawned processes write their logs to the test output.
pub fn test_log() -> bool {
    std::env::var("TEST_LOG").is_ok_and(|v| !v.is_empty() && v != "0")
}

pub fn unique_suffix() -> String {
    Uuid::now_v7().simple().to_string()
}

/// Settings for a test: compiled-in defaults, a fresh database and Redis prefix, generous
/// rate limits, small pools (tests run in parallel against one PostgreSQL) and fast timers.
pub fn test_settings(database_url: &str) -> Settings {
    let suffix = unique_suffix();
    let mut s = Settings::defaults();
    s.server.listen = "127.0.0.1:0".parse().unwrap();
    s.server.ops_listen = "127.0.0.1:0".parse().unwrap();
    // Tests that are not about draining do not wait for load balancers.
    s.server.drain_delay_ms = 0;
    s.database.url = database_url.to_owned();
    s.database.request_pool_max = 8;
    s.database.background_pool_max = 2;
    // The event sequencer and deliveries hold connections of their own; tests about events
    // turn them on (`events_delivery::fast_events`), the shared server's other tests spare them.
    s.events.enabled = false;
    s.database.events_pool_max = 2;
    s.redis.url = redis_url();
    s.redis.key_prefix = format!("fgtest:{suffix}:");
    s.auth.jwt_secret = format!("test-jwt-secret-{suffix}");
    s.auth.admin_token = format!("test-admin-token-{suffix}");
    s.waiting_room.pass_secret = format!("test-pass-secret-{suffix}");
    for rate in [
        &mut s.limits.per_ip,
        &mut s.limits.per_user,
        &mut s.limits.per_deal,
    ] {
        rate.rate_per_second = UNLIMITED;
        rate.burst = UNLIMITED;
    }
    s.sweeper.interval_ms = 100;
    s.soldout.refresh_interval_ms = 100;
    through_pooler(&mut s);
    s
}

/// With `DATABASE_POOLER_URL` set (a transaction-pooling PgBouncer in front of
/// `DATABASE_URL`), the gateway reaches its database through the pooler; the test's own
/// connections, migrations and LISTEN stay direct.
fn through_pooler(s: &mut Settings) {
    let Ok(pooler) = std::env::var("DATABASE_POOLER_URL") else {
        return;
    };
    let name = s.database.url.rsplit('/').next().unwrap_or_default();
    let name = name.split('?').next().unwrap_or_default().to_owned();
    s.database.direct_url = std::mem::replace(&mut s.database.url, with_database(&pooler, &name));
    s.database.transaction_pooler = true;
}

pub fn http_client() -> reqwest::Client {
    http_client_from(None)
}

/// A client whose connections leave from `local` (any 127.x.y.z works on loopback), so a
/// test can act as several client addresses.
pub fn http_client_from(local: Option<IpAddr>) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(local)
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        // The gateway closes a keep-alive connection idle for `header_read_timeout_ms`; a
        // request sent on it at that moment fails. Dropping idle connections well before
        // avoids the race on a loaded machine.
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .expect("build HTTP client")
}

/// A running gateway plus a pool on its database.
pub struct TestApp {
    pub addr: SocketAddr,
    pub ops_addr: SocketAddr,
    pub api: Api,
    pub db: PgPool,
    pub settings: Settings,
    database: TestDb,
    shutdown: Box<dyn Fn() + Send + Sync>,
    server: Option<tokio::task::JoinHandle<Result<(), String>>>,
}

impl std::ops::Deref for TestApp {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_on(Clock::system(), configure).await
}

/// A gateway whose rules run on `clock`: a test about time (a sale's window, a pass's or a
/// token's expiry, a cache's age, a breaker's cool-down) hands it a `ManualClock` and moves
/// that instead of sleeping. What PostgreSQL and Redis decide stays on their own clocks.
pub async fn spawn_app_on(clock: Clock, configure: impl FnOnce(&mut Settings)) -> TestApp {
    let database = TestDb::create().await;
    let mut settings = test_settings(&database.url);
    configure(&mut settings);
    if test_log() {
        flashgate::telemetry::init_logging(&settings.telemetry);
    }
    let app = Application::build_on(settings.clone(), clock)
        .await
        .expect("application builds");
    let addr = app.local_addr();
    let ops_addr = app.ops_addr();
    let token = app.shutdown_token();
    let server = tokio::spawn(async move { app.run().await.map_err(|e| e.to_string()) });
    let db = database.connect(3).await;
    let api = Api::new(
        &format!("http://{addr}"),
        &format!("http://{ops_addr}"),
        &settings,
    );
    TestApp {
        addr,
        ops_addr,
        api,
        db,
        settings,
        database,
        shutdown: Box::new(move || token.cancel()),
        server: Some(server),
    }
}

/// A second gateway in this process on another app's database and Redis prefix (a fleet
/// of two); the first app's `cleanup` drops what they share.
pub struct Sibling {
    pub api: Api,
    shutdown: tokio_util::sync::CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl std::ops::Deref for Sibling {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Sibling {
    /// Shuts the gateway down and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.server).await;
    }
}

/// Starts a gateway with `settings` (another app's: the same database, Redis prefix and
/// secrets).
pub async fn spawn_sibling(settings: &Settings) -> Sibling {
    let app = Application::build(settings.clone())
        .await
        .expect("application builds");
    let api = Api::new(
        &format!("http://{}", app.local_addr()),
        &format!("http://{}", app.ops_addr()),
        settings,
    );
    let shutdown = app.shutdown_token();
    let server = tokio::spawn(async move {
        let _ = app.run().await;
    });
    Sibling {
        api,
        shutdown,
        server,
    }
}

impl TestApp {
    /// Starts graceful shutdown without waiting for it.
    pub fn begin_shutdown(&self) {
        (self.shutdown)();
    }

    /// Shuts the server down and returns what `run` returned.
    pub async fn stop(&mut self) -> Result<(), String> {
        self.begin_shutdown();
        let Some(server) = self.server.take() else {
            return Ok(());
        };
        let grace = Duration::from_secs(self.settings.server.shutdown_grace_seconds + 5);
        match tokio::time::timeout(grace, server).await {
            Ok(Ok(result)) => result,
            Ok(Err(join_error)) => Err(format!("server task panicked: {join_error}")),
            Err(_) => Err(format!("server still running {grace:?} after shutdown")),
        }
    }

    /// Stops the server and drops the database and Redis keys.
    pub async fn cleanup(mut self) {
        let stopped = self.stop().await;
        self.db.close().await;
        delete_redis_keys(&self.settings.redis.url, &self.settings.redis.key_prefix).await;
        self.database.drop_database().await;
        stopped.expect("server shuts down cleanly");
    }

    pub async fn assert_invariants(&self, deal: &str) {
        assert_invariants(&self.api, &self.db, deal).await;
    }
}

/// An HTTP response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    pub async fn from(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("read response body");
        Reply {
            status,
            headers,
            text,
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The problem `type` slug, if this is a problem+json reply.
    pub fn problem_slug(&self) -> Option<String> {
        let body: Value = serde_json::from_str(&self.text).ok()?;
        let kind = body["type"].as_str()?;
        kind.strip_prefix("https://flashgate.dev/problems/")
            .map(str::to_owned)
    }

    /// Asserts the status and returns the JSON body.
    #[track_caller]
    pub fn expect(&self, status: u16) -> Value {
        assert_eq!(
            self.status, status,
            "unexpected status, body: {}",
            self.text
        );
        self.json()
    }

    /// Asserts a problem+json reply with this status and problem type.
    #[track_caller]
    pub fn expect_problem(&self, status: u16, slug: &str) -> Value {
        assert_eq!(
            self.status, status,
            "unexpected status, body: {}",
            self.text
        );
        let content_type = self.header("content-type").unwrap_or_default();
        assert!(
            content_type.starts_with("application/problem+json"),
            "content-type {content_type:?} for a {status} reply"
        );
        let body = self.json();
        assert_eq!(
            body["type"],
            format!("https://flashgate.dev/problems/{slug}"),
            "body: {body}"
        );
        assert!(
            body["title"].as_str().is_some_and(|t| !t.is_empty()),
            "title missing: {body}"
        );
        assert_eq!(body["status"], json!(status), "status member: {body}");
        assert!(body["detail"].is_string(), "detail missing: {body}");
        let id = self
            .header("x-request-id")
            .expect("every answer has X-Request-Id");
        assert_eq!(
            body["instance"],
            format!("urn:flashgate:request:{id}"),
            "instance names the request id: {body}"
        );
        body
    }
}

/// Sends a request that must reach the server.
pub async fn send(request: reqwest::RequestBuilder) -> Reply {
    Reply::from(request.send().await.expect("request reaches the server")).await
}

/// The JSON for `POST /admin/deals`: open now, 10.00 EUR a unit, two per user, 5 minutes to pay.
pub fn new_deal(id: &str, stock: i64, buckets: i64) -> Value {
    json!({
        "id": id,
        "name": format!("Deal {id}"),
        "stock": stock,
        "buckets": buckets,
        "unit_price_minor": 1000,
        "currency": "EUR",
        "per_user_limit": 2,
        "reservation_ttl_seconds": 300,
    })
}

/// Calls `check` until it returns `Some` or `timeout` passes.
pub async fn eventually<T, F>(timeout: Duration, check: impl FnMut() -> F) -> Option<T>
where
    F: Future<Output = Option<T>>,
{
    poll(timeout, check).await.ok()
}
