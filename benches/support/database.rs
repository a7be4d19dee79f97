//! A benchmark's own database: created on the local PostgreSQL server (`DATABASE_URL`,
//! default the `test` database's server) with the schema migrated, dropped when done, so
//! benchmarks never touch a database that tests or a gateway use.

use flashgate::config::Settings;
use sqlx::PgPool;

pub struct BenchDatabase {
    admin: PgPool,
    pub pool: PgPool,
    name: String,
}

impl BenchDatabase {
    pub async fn create() -> Self {
        let admin_url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let admin = PgPool::connect(&admin_url)
            .await
            .expect("PostgreSQL is reachable");
        let name = format!("fg_bench_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .unwrap();
        let mut settings = Settings::defaults();
        settings.database.url = format!("{}/{name}", admin_url.rsplit_once('/').unwrap().0);
        flashgate::store::migrate(&settings.database).await.unwrap();
        let pool = PgPool::connect(&settings.database.url).await.unwrap();
        Self { admin, pool, name }
    }

    pub async fn drop(self) {
        self.pool.close().await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE {} WITH (FORCE)",
            self.name
        )))
        .execute(&self.admin)
        .await
        .unwrap();
    }
}
