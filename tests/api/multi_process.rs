//! Several `flashgate serve` processes sharing one database and one Redis sell a deal
//! exactly once, and stop on SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

use flashgate::config::Settings;

use crate::concurrency::stampede;
use crate::helpers::{
    Api, ChildGuard, TestDb, assert_invariants, delete_redis_keys, eventually, new_deal, test_log,
    test_settings,
};

/// Starts `flashgate serve` on the ports of `api` with `settings` passed through the
/// environment.
pub fn spawn_gateway(settings: &Settings, api: &Api) -> ChildGuard {
    spawn_gateway_with(settings, api, &[])
}

/// As `spawn_gateway`, with `extra` environment variables on top (later ones win). Its log
/// goes to the test's output with `TEST_LOG=1`, else to `start_up_log(api)`, shown if it
/// exits during start-up.
pub fn spawn_gateway_with(settings: &Settings, api: &Api, extra: &[(&str, &str)]) -> ChildGuard {
    let output = if test_log() {
        Stdio::inherit()
    } else {
        std::fs::File::create(start_up_log(api)).map_or_else(|_| Stdio::null(), Stdio::from)
    };
    spawn_gateway_logging_to(settings, api, extra, output)
}

/// Where the log of the gateway listening for `api` is kept until it is healthy.
fn start_up_log(api: &Api) -> std::path::PathBuf {
    let name = api.public_listen().replace([':', '.'], "-");
    std::env::temp_dir().join(format!("flashgate-gateway-{name}.log"))
}

/// As `spawn_gateway_with`, writing the gateway's log (stderr) to `log`.
pub fn spawn_gateway_logging_to(
    settings: &Settings,
    api: &Api,
    extra: &[(&str, &str)],
    log: Stdio,
) -> ChildGuard {
    let unlimited = "1000000";
    let mut command = Command::new(env!("CARGO_BIN_EXE_flashgate"));
    command
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", if test_log() { "info" } else { "warn" })
        .env("DATABASE_URL", &settings.database.url)
        .env("REDIS_URL", &settings.redis.url)
        .env("FLASHGATE_LISTEN", api.public_listen())
        .env("FLASHGATE_OPS_LISTEN", api.ops_listen())
        .env("FLASHGATE__SERVER__DRAIN_DELAY_MS", "0")
        .env("FLASHGATE_ADMIN_TOKEN", &settings.auth.admin_token)
        .env("FLASHGATE_JWT_SECRET", &settings.auth.jwt_secret)
        .env(
            "FLASHGATE__WAITING_ROOM__PASS_SECRET",
            &settings.waiting_room.pass_secret,
        )
        .env(
            "FLASHGATE__PAYMENTS__ENABLED",
            settings.payments.enabled.to_string(),
        )
        .env("FLASHGATE__PAYMENTS__BASE_URL", &settings.payments.base_url)
        .env("FLASHGATE__PAYMENTS__API_KEY", &settings.payments.api_key)
        .env(
            "FLASHGATE__PAYMENTS__WEBHOOK_SECRET",
            &settings.payments.webhook_secret,
        )
        .env("FLASHGATE__REDIS__KEY_PREFIX", &settings.redis.key_prefix)
        .env("FLASHGATE__DATABASE__REQUEST_POOL_MAX", "8")
        .env("FLASHGATE__DATABASE__BACKGROUND_POOL_MAX", "2")
        .env("FLASHGATE__DATABASE__ACQUIRE_TIMEOUT_MS", "2000")
        .env("FLASHGATE__SOLDOUT__REFRESH_INTERVAL_MS", "100")
        .env(
            "FLASHGATE__EVENTS__ENABLED",
            settings.events.enabled.to_string(),
        )
        .env(
            "FLASHGATE__DATABASE__EVENTS_POOL_MAX",
            settings.database.events_pool_max.to_string(),
        );
    for scope in ["PER_IP", "PER_USER", "PER_DEAL"] {
        command
            .env(
                format!("FLASHGATE__LIMITS__{scope}__RATE_PER_SECOND"),
                unlimited,
            )
            .env(format!("FLASHGATE__LIMITS__{scope}__BURST"), unlimited);
    }
    command.envs(extra.iter().copied());
    let child = command
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start flashgate serve");
    ChildGuard { child }
}

/// Waits for `/healthz`, failing early if the process exits.
pub async fn wait_until_healthy(gateway: &mut ChildGuard, api: &Api) {
    let healthy = eventually(Duration::from_secs(60), || {
        if let Some(status) = gateway.child.try_wait().unwrap() {
            let log = std::fs::read_to_string(start_up_log(api)).unwrap_or_default();
            panic!("flashgate serve exited during start-up: {status}; its log:\n{log}");
        }
        let request = api
            .client
            .get(api.url("/healthz"))
            .timeout(Duration::from_secs(2));
        async move {
            request
                .send()
                .await
                .ok()
                .filter(|r| r.status() == 200)
                .map(|_| ())
        }
    })
    .await;
    assert!(healthy.is_some(), "{} never became healthy", api.base);
    // The gateway keeps writing to the file it opened; only the name goes.
    let _ = std::fs::remove_file(start_up_log(api));
}

#[tokio::test(flavor = "multi_thread")]
async fn three_processes_sell_a_deal_exactly_once() {
    // Arrange: three gateways on one fresh database (they migrate it concurrently).
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    let mut gateways = Vec::new();
    let mut apis = Vec::new();
    for _ in 0..3 {
        let api = Api::on_free_ports(&settings);
        gateways.push(spawn_gateway(&settings, &api));
        apis.push(api);
    }
    for (gateway, api) in gateways.iter_mut().zip(&apis) {
        wait_until_healthy(gateway, api).await;
    }
    let deal = apis[0].given_deal(&new_deal("multi", 50, 4)).await;
    let attempts: Vec<(String, String)> = (0..2)
        .flat_map(|round| {
            (0..300).map(move |user| (format!("user-{user}"), format!("key-{round}")))
        })
        .collect();

    // Act: 600 orders by 300 users, round-robin over the three processes.
    let results = stampede(&apis, &deal, attempts, 120).await;

    // Assert
    let created = results.iter().filter(|a| a.reply.status == 201).count();
    assert_eq!(created, 50, "201 answers");
    for attempt in results.iter().filter(|a| a.reply.status != 201) {
        let slug = attempt.reply.problem_slug();
        assert!(
            attempt.reply.status == 409
                && matches!(slug.as_deref(), Some("sold-out" | "per-user-limit")),
            "unexpected reply: {} {}",
            attempt.reply.status,
            attempt.reply.text
        );
    }
    let db = database.connect(2).await;
    let orders: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(quantity), 0)::BIGINT FROM orders WHERE deal_id = $1",
    )
    .bind(&deal)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(orders, 50, "units ordered in the database");
    for api in &apis {
        api.wait_for_deal_state(&deal, "sold_out").await;
    }

    // A cancel on one process makes the unit orderable on another within about a second.
    let winner = results.iter().find(|a| a.reply.status == 201).unwrap();
    let order_id = winner.reply.json()["order_id"].as_str().unwrap().to_owned();
    apis[0]
        .cancel_order(&apis[0].token(&winner.user), &order_id)
        .await
        .expect(200);
    apis[2].order_eventually("latecomer", &deal, 1).await;
    apis[1]
        .order("another-latecomer", &deal, 1)
        .await
        .expect_problem(409, "sold-out");
    for api in &apis {
        assert_invariants(api, &db, &deal).await;
    }

    // SIGTERM stops every process cleanly.
    for gateway in &mut gateways {
        let status = gateway.terminate(Duration::from_secs(15)).await;
        let status = status.expect("flashgate serve still running 15 s after SIGTERM");
        assert!(
            status.success(),
            "flashgate serve exited with {status} after SIGTERM"
        );
    }
    db.close().await;
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}
