//! Small bounded sales through the load tester against a real gateway: the load tester
//! must pass them, with the orders checked in the database.

use flashgate::app::Application;
use flashgate::config::Settings;
use flashgate_loadtest::operator::Operator;
use flashgate_loadtest::provider::TokenKind;
use flashgate_loadtest::sale::{self, SaleConfig};

fn base_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A fresh database next to the base one: (URL, name).
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

/// A running gateway on a fresh database with relaxed limits.
struct Gateway {
    settings: Settings,
    base_url: String,
    ops_url: String,
    database: String,
    stop: Box<dyn FnOnce() + Send>,
    server: tokio::task::JoinHandle<Result<(), flashgate::app::AppError>>,
}

impl Gateway {
    async fn start() -> Self {
        let (url, database) = fresh_database().await;
        let mut settings = Settings::defaults();
        settings.server.listen = "127.0.0.1:0".parse().unwrap();
        settings.server.ops_listen = "127.0.0.1:0".parse().unwrap();
        settings.server.drain_delay_ms = 0;
        settings.database.url = url;
        settings.database.request_pool_max = 8;
        settings.redis.key_prefix = format!("fglt:{database}:");
        for rate in [&mut settings.limits.per_ip, &mut settings.limits.per_user] {
            rate.rate_per_second = 100_000;
            rate.burst = 100_000;
        }
        let app = Application::build(settings.clone())
            .await
            .expect("gateway starts");
        let base_url = format!("http://{}", app.local_addr());
        let ops_url = format!("http://{}", app.ops_addr());
        let token = app.shutdown_token();
        let server = tokio::spawn(app.run());
        Self {
            settings,
            base_url,
            ops_url,
            database,
            stop: Box::new(move || token.cancel()),
            server,
        }
    }

    fn sale(&self) -> SaleConfig {
        SaleConfig {
            base_url: self.base_url.clone(),
            operator: Operator {
                ops_url: self.ops_url.clone(),
                admin_token: self.settings.auth.admin_token.clone(),
                jwt_secret: self.settings.auth.jwt_secret.clone(),
                token_kind: TokenKind::Hs256,
                token_issuer: String::new(),
                token_audience: String::new(),
            },
            stock: 50,
            buckets: 4,
            users: 200,
            attempts: 1,
            per_user_limit: 1,
            concurrency: 32,
            rate: 0,
            duration_max_seconds: 30,
            retries_max: 5,
            events_receiver: false,
            database_url: Some(self.settings.database.url.clone()),
            pay_fraction: 0.0,
            queue_admit_per_second: 0,
            queue_max_active: 1000,
        }
    }

    async fn stop(self) {
        (self.stop)();
        let _ = self.server.await;
        drop_database(&self.database).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_sale_passes_the_load_testers_checks() {
    let gateway = Gateway::start().await;

    let report = sale::run(&gateway.sale()).await.expect("the sale runs");

    assert_eq!(report["verdict"]["ok"], true, "{}", sale::summary(&report));
    assert_eq!(report["verdict"]["created"], 50);
    assert_eq!(report["database"]["acknowledged_found"], 50);
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sale_behind_the_waiting_room_orders_only_with_passes() {
    let gateway = Gateway::start().await;
    let config = SaleConfig {
        stock: 20,
        users: 60,
        queue_admit_per_second: 200,
        queue_max_active: 40,
        ..gateway.sale()
    };

    let report = sale::run(&config).await.expect("the sale runs");

    assert_eq!(report["verdict"]["ok"], true, "{}", sale::summary(&report));
    assert_eq!(
        report["verdict"]["created"],
        20,
        "{}",
        sale::summary(&report)
    );
    gateway.stop().await;
}
