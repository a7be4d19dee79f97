//! A small bounded sale through the load tester against a real gateway: the load tester
//! must pass it, with the orders checked in the database.

use flashgate::app::Application;
use flashgate::config::Settings;
use flashgate_loadtest::sale::{self, SaleConfig};

fn base_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A fresh database next to the base one.
async fn fresh_database() -> (String, String) {
    let base = base_database_url();
    let name = format!("fg_lt_{}", uuid::Uuid::now_v7().simple());
    let admin = sqlx::PgPool::connect(&base)
        .await
        .expect("connect to the base database");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .expect("create database");
    admin.close().await;
    let (prefix, _) = base
        .rsplit_once('/')
        .expect("a database URL ends with /name");
    (format!("{prefix}/{name}"), name)
}

async fn drop_database(name: &str) {
    let admin = sqlx::PgPool::connect(&base_database_url())
        .await
        .expect("connect to the base database");
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_sale_passes_the_load_testers_checks() {
    let (url, name) = fresh_database().await;
    let mut settings = Settings::defaults();
    settings.server.listen = "127.0.0.1:0".parse().unwrap();
    settings.database.url = url.clone();
    settings.database.request_pool_max = 8;
    settings.redis.key_prefix = format!("fglt:{name}:");
    for rate in [&mut settings.limits.per_ip, &mut settings.limits.per_user] {
        rate.rate_per_second = 100_000;
        rate.burst = 100_000;
    }
    let app = Application::build(settings.clone())
        .await
        .expect("gateway starts");
    let base_url = format!("http://{}", app.local_addr());
    let shutdown = app.shutdown_token();
    let server = tokio::spawn(app.run());

    let config = SaleConfig {
        base_url,
        admin_token: settings.auth.admin_token.clone(),
        jwt_secret: settings.auth.jwt_secret.clone(),
        stock: 50,
        buckets: 4,
        users: 200,
        attempts: 1,
        per_user_limit: 1,
        concurrency: 32,
        rate: 0,
        duration_max_seconds: 30,
        retries_max: 5,
        database_url: Some(url),
        pay_fraction: 0.0,
    };
    let report = sale::run(&config).await.expect("the sale runs");

    assert_eq!(report["verdict"]["ok"], true, "{}", sale::summary(&report));
    assert_eq!(report["verdict"]["created"], 50);
    assert_eq!(report["database"]["acknowledged_found"], 50);
    shutdown.cancel();
    let _ = server.await;
    drop_database(&name).await;
}
