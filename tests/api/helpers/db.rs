//! The test database: created per test, and the SQL that checks what the gateway did.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use uuid::Uuid;

use super::{Api, base_database_url, unique_suffix, wait_until};
use sqlx::Row;
use sqlx::postgres::PgRow;

/// The connection string of `base` with its database name replaced by `name`.
pub fn with_database(base: &str, name: &str) -> String {
    let (url, query) = match base.split_once('?') {
        Some((url, query)) => (url, Some(query)),
        None => (base, None),
    };
    let authority_start = url.find("://").map_or(0, |i| i + 3);
    let root = match url[authority_start..].find('/') {
        Some(i) => &url[..authority_start + i],
        None => url,
    };
    match query {
        Some(query) => format!("{root}/{name}?{query}"),
        None => format!("{root}/{name}"),
    }
}

/// A test that panics leaves its database behind; later runs drop those older than this.
const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// Drops `fg_<uuid v7>` databases created more than `ABANDONED_AFTER` ago (the UUID
/// carries its creation time), so failed runs do not pile up. Best effort.
async fn drop_abandoned_databases(conn: &mut PgConnection) {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'fg\\_%'")
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    for name in names {
        let created = name
            .strip_prefix("fg_")
            .and_then(|id| Uuid::parse_str(id).ok())
            .and_then(|id| id.get_timestamp())
            .map(|at| Duration::from_secs(at.to_unix().0));
        if created.is_some_and(|created| now.saturating_sub(created) > ABANDONED_AFTER) {
            let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
            let _ = sqlx::query(AssertSqlSafe(sql)).execute(&mut *conn).await;
        }
    }
}

/// Names the migrated template after the migrations it holds: a change to any of them
/// makes a new one.
fn template_name() -> String {
    let dir = super::crate_root().join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the migrations directory reads")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    files.sort();
    let mut digest = Sha256::new();
    for file in files {
        digest.update(file.file_name().unwrap_or_default().as_encoded_bytes());
        digest.update(std::fs::read(&file).expect("a migration reads"));
    }
    format!("{TEMPLATE_PREFIX}{}", &hex::encode(digest.finalize())[..16])
}

const TEMPLATE_PREFIX: &str = "fg_template_";
/// Any key the tests' other advisory locks do not use: the template is built once.
const TEMPLATE_LOCK: i64 = 0x0f1a_5467_a7e0;

/// The migrated template's name, built on first use under an advisory lock (tests in other
/// processes wait for it), with the templates of other migrations dropped.
async fn migrated_template() -> String {
    let name = template_name();
    let mut conn = PgConnection::connect(&base_database_url())
        .await
        .expect("connect to the base test database (set DATABASE_URL)");
    if database_exists(&mut conn, &name).await {
        let _ = conn.close().await;
        return name;
    }
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(TEMPLATE_LOCK)
        .execute(&mut conn)
        .await
        .expect("the template lock");
    if !database_exists(&mut conn, &name).await {
        build_template(&mut conn, &name).await;
    }
    let _ = conn.close().await;
    name
}

async fn database_exists(conn: &mut PgConnection, name: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(conn)
        .await
        .expect("pg_database reads")
}

/// Migrates a database under a building name and renames it once complete, so a test never
/// copies a half-migrated template.
async fn build_template(conn: &mut PgConnection, name: &str) {
    let old: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE $1")
            .bind(format!("{}%", TEMPLATE_PREFIX.replace('_', "\\_")))
            .fetch_all(&mut *conn)
            .await
            .expect("pg_database reads");
    for stale in old {
        let sql = format!("DROP DATABASE IF EXISTS \"{stale}\" WITH (FORCE)");
        let _ = sqlx::query(AssertSqlSafe(sql)).execute(&mut *conn).await;
    }
    let building = format!("{name}_building");
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"),
        format!("CREATE DATABASE \"{building}\""),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await
            .expect("the template's database");
    }
    let url = with_database(&base_database_url(), &building);
    let mut migrating = PgConnection::connect(&url)
        .await
        .expect("connect to the template");
    flashgate::store::migrator()
        .run(&mut migrating)
        .await
        .expect("the migrations apply to the template");
    let _ = migrating.close().await;
    let sql = format!("ALTER DATABASE \"{building}\" RENAME TO \"{name}\"");
    sqlx::query(AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .expect("the template is named once migrated");
}

/// A database created for one test and dropped by `drop_database`.
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    /// A database with every migration applied: a copy of the migrated template, so a
    /// test pays for a copy rather than for running the migrations again.
    pub async fn create() -> TestDb {
        let template = migrated_template().await;
        Self::create_from(&template).await
    }

    /// A database with nothing in it, for the tests of migrating itself.
    pub async fn create_empty() -> TestDb {
        Self::create_from("template1").await
    }

    async fn create_from(template: &str) -> TestDb {
        let name = format!("fg_{}", unique_suffix());
        let mut conn = PgConnection::connect(&base_database_url())
            .await
            .expect("connect to the base test database (set DATABASE_URL)");
        // Parallel CREATE DATABASE can collide on the template; a retry settles it.
        let sql = format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\"");
        wait_until(&sql, Duration::from_secs(2), || async {
            let mut conn = PgConnection::connect(&base_database_url()).await?;
            let created = sqlx::query(AssertSqlSafe(sql.clone()));
            created.execute(&mut conn).await.map(drop)
        })
        .await;
        drop_abandoned_databases(&mut conn).await;
        let _ = conn.close().await;
        let url = with_database(&base_database_url(), &name);
        TestDb { name, url }
    }

    pub async fn connect(&self, max_connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&self.url)
            .await
            .expect("connect to the test database")
    }

    pub async fn drop_database(self) {
        let Ok(mut conn) = PgConnection::connect(&base_database_url()).await else {
            return;
        };
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if let Err(e) = sqlx::query(AssertSqlSafe(sql)).execute(&mut conn).await {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
        let _ = conn.close().await;
    }
}

/// One inventory row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketRow {
    pub bucket: i32,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

impl<'r> sqlx::FromRow<'r, PgRow> for BucketRow {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            bucket: row.try_get("bucket")?,
            available: row.try_get("available")?,
            reserved: row.try_get("reserved")?,
            sold: row.try_get("sold")?,
        })
    }
}

pub async fn buckets(db: &PgPool, deal: &str) -> Vec<BucketRow> {
    sqlx::query_as(
        "SELECT bucket, available, reserved, sold FROM inventory_buckets \
         WHERE deal_id = $1 ORDER BY bucket",
    )
    .bind(deal)
    .fetch_all(db)
    .await
    .expect("read inventory_buckets")
}

pub async fn available_by_bucket(db: &PgPool, deal: &str) -> BTreeMap<i32, i64> {
    buckets(db, deal)
        .await
        .into_iter()
        .map(|b| (b.bucket, b.available))
        .collect()
}

/// The units an order holds, by bucket (its reservation lines and its row's bucket).
pub async fn order_holdings(db: &PgPool, order_id: &str) -> BTreeMap<i32, i64> {
    let order_id: Uuid = order_id.parse().expect("order_id is a UUID");
    let rows: Vec<(i32, i32)> = sqlx::query_as(
        "SELECT bucket, quantity FROM held_units WHERE order_id = $1 ORDER BY bucket",
    )
    .bind(order_id)
    .fetch_all(db)
    .await
    .expect("read held_units");
    rows.into_iter()
        .map(|(bucket, quantity)| (bucket, i64::from(quantity)))
        .collect()
}

pub async fn order_count(db: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(db)
        .await
        .expect("count orders")
}

pub async fn order_status(db: &PgPool, order_id: &str) -> String {
    let order_id: Uuid = order_id.parse().expect("order_id is a UUID");
    sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
        .bind(order_id)
        .fetch_one(db)
        .await
        .expect("order row exists")
}

/// Everything a rejected request must leave untouched.
#[derive(Debug, PartialEq)]
pub struct DbSnapshot {
    buckets: Vec<BucketRow>,
    orders: i64,
    held_units: i64,
    user_units: Vec<(String, String, i32)>,
}

pub async fn db_snapshot(db: &PgPool, deal: &str) -> DbSnapshot {
    DbSnapshot {
        buckets: buckets(db, deal).await,
        orders: order_count(db).await,
        held_units: sqlx::query_scalar("SELECT count(*) FROM held_units")
            .fetch_one(db)
            .await
            .expect("count held_units"),
        user_units: sqlx::query_as(
            "SELECT deal_id, user_id, units FROM user_deal_units ORDER BY deal_id, user_id",
        )
        .fetch_all(db)
        .await
        .expect("read user_deal_units"),
    }
}

/// Checks from SQL that no unit was created or lost, then that the admin endpoint agrees:
/// no bucket below zero, `stock_total = Σ(available + reserved + sold)`, every bucket's
/// `reserved` equals the reservation lines of its pending orders, every pending order's lines
/// add up to its quantity, and each user's held units match their pending orders.
pub async fn assert_invariants(api: &Api, db: &PgPool, deal: &str) {
    let rows = buckets(db, deal).await;
    assert!(!rows.is_empty(), "deal {deal} has no buckets");
    assert!(
        rows.iter().all(|b| b.available >= 0),
        "a bucket below zero: {rows:?}"
    );

    let stock_total: i64 = sqlx::query_scalar("SELECT stock_total FROM deals WHERE id = $1")
        .bind(deal)
        .fetch_one(db)
        .await
        .expect("deal row");
    let held: i64 = rows.iter().map(|b| b.available + b.reserved + b.sold).sum();
    assert_eq!(
        stock_total, held,
        "stock_total != Σ(available + reserved + sold): {rows:?}"
    );

    let pending_lines: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT l.bucket, sum(l.quantity)::BIGINT FROM held_units l \
         JOIN orders o ON o.id = l.order_id \
         WHERE l.deal_id = $1 AND o.status = 'PENDING_PAYMENT' GROUP BY l.bucket",
    )
    .bind(deal)
    .fetch_all(db)
    .await
    .expect("sum reservation lines");
    let pending: BTreeMap<i32, i64> = pending_lines.into_iter().collect();
    let reserved: BTreeMap<i32, i64> = rows
        .iter()
        .filter(|b| b.reserved != 0)
        .map(|b| (b.bucket, b.reserved))
        .collect();
    assert_eq!(
        reserved, pending,
        "per-bucket reserved units differ from the lines of pending orders"
    );

    let mismatched: Vec<(Uuid, i32, i64)> = sqlx::query_as(
        "SELECT o.id, o.quantity, coalesce(sum(l.quantity), 0)::BIGINT FROM orders o \
         LEFT JOIN held_units l ON l.order_id = o.id \
         WHERE o.deal_id = $1 AND o.status = 'PENDING_PAYMENT' \
         GROUP BY o.id, o.quantity HAVING coalesce(sum(l.quantity), 0) <> o.quantity",
    )
    .bind(deal)
    .fetch_all(db)
    .await
    .expect("compare order quantities with their lines");
    assert!(
        mismatched.is_empty(),
        "pending orders whose lines differ from quantity: {mismatched:?}"
    );

    let user_units: Vec<(String, i64, i64)> = sqlx::query_as(
        "WITH held AS (SELECT user_id, sum(quantity)::BIGINT AS units FROM orders \
                       WHERE deal_id = $1 AND status IN ('PENDING_PAYMENT', 'PAID') GROUP BY user_id), \
              counted AS (SELECT user_id, units::BIGINT AS units FROM user_deal_units WHERE deal_id = $1) \
         SELECT coalesce(h.user_id, c.user_id), coalesce(h.units, 0), coalesce(c.units, 0) \
         FROM held h FULL JOIN counted c ON c.user_id = h.user_id \
         WHERE coalesce(h.units, 0) <> coalesce(c.units, 0)",
    )
    .bind(deal)
    .fetch_all(db)
    .await
    .expect("compare user_deal_units with orders");
    assert!(
        user_units.is_empty(),
        "user_deal_units disagree with held orders (user, held, counted): {user_units:?}"
    );

    let inventory = api.inventory(deal).await;
    assert_eq!(
        inventory["invariant_holds"],
        json!(true),
        "inventory: {inventory}"
    );
    assert_eq!(
        inventory["stock_total"],
        json!(stock_total),
        "inventory: {inventory}"
    );
    let sum = |f: fn(&BucketRow) -> i64| rows.iter().map(f).sum::<i64>();
    assert_eq!(
        inventory["available"],
        json!(sum(|b| b.available)),
        "inventory: {inventory}"
    );
    assert_eq!(
        inventory["reserved"],
        json!(sum(|b| b.reserved)),
        "inventory: {inventory}"
    );
    assert_eq!(
        inventory["sold"],
        json!(sum(|b| b.sold)),
        "inventory: {inventory}"
    );
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(
            with_database("postgres://u@h:5432/test", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            with_database("postgres://u@h/test?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
    }
}
