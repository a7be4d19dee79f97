//! Payment bookkeeping written straight on a pool is committed when the call returns.
//!
//! Behind a transaction pooler (the CI pass with `DATABASE_POOLER_URL`) each checkout of a
//! connection is a transaction the pool commits only after the connection went back, which
//! can be after the caller answered a client, acknowledged a webhook or called the provider.
//! Each write is read back at once from a connection of its own, without waiting for row
//! locks: a write not yet committed still holds its row's lock and is refused. The test
//! runs on one thread, so the pool's own late commit cannot slip in before the check.
//! A second test keeps every write in `src/` from running straight on a pool.

use sqlx::{AssertSqlSafe, Connection, PgConnection};
use uuid::Uuid;

use flashgate::payments::attempts::{self, CaptureClaim};
use flashgate::payments::{outbox, refunds};
use flashgate::store::{self, Pools, Writes};

use crate::helpers::{new_deal, spawn_app};

/// Asserts `sql` (a boolean about the row whose id reads as `id`) holds, read without
/// waiting for the row's lock.
async fn committed(direct: &mut PgConnection, what: &str, sql: &str, id: &str) {
    let sql = format!("{sql} FOR UPDATE NOWAIT");
    match sqlx::query_scalar::<_, bool>(AssertSqlSafe(sql))
        .bind(id)
        .fetch_one(&mut *direct)
        .await
    {
        Ok(holds) => assert!(holds, "{what}: not written"),
        Err(error) => panic!("{what}: not committed when the call returned: {error}"),
    }
}

/// A payment attempt, a refund of it and a capture queued for it, written directly.
async fn given_payment_rows(db: &sqlx::PgPool, order_id: Uuid) -> (Uuid, Uuid, i64) {
    let attempt_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO payment_attempts (id, order_id, provider, provider_payment_id, status,
                                       amount_minor, currency, capture_method)
         SELECT $1, id, 'psp-sim', 'pi_pooled', 'PENDING', amount_minor, currency, 'manual'
           FROM orders WHERE id = $2",
    )
    .bind(attempt_id)
    .bind(order_id)
    .execute(db)
    .await
    .unwrap();
    let refund_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO refunds (id, attempt_id, order_id, amount_minor, currency, reason, status)
         VALUES ($1, $2, $3, 1, 'EUR', 'test', 'PENDING')",
    )
    .bind(refund_id)
    .bind(attempt_id)
    .bind(order_id)
    .execute(db)
    .await
    .unwrap();
    let entry_id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (kind, dedupe_key, payload) VALUES ('capture', 'capture:pooled', '{}')
         RETURNING id",
    )
    .fetch_one(db)
    .await
    .unwrap();
    (attempt_id, refund_id, entry_id)
}

#[tokio::test]
async fn payment_bookkeeping_is_committed_before_the_call_returns() {
    // Payments are off in the gateway itself: no worker of its own touches these rows.
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("pooled", 5, 1)).await;
    let order = app.order("alice", &deal, 1).await.expect(201);
    let order_id: Uuid = order["order_id"].as_str().unwrap().parse().unwrap();
    let (attempt, refund, entry) = given_payment_rows(&app.db, order_id).await;
    let (attempt, refund, entry_text) = (attempt.to_string(), refund, entry.to_string());
    let database = &app.settings.database;
    let pools = Pools::new(database).unwrap();
    let pool = &pools.request;
    let writes = Writes::new(database);
    let mut direct = PgConnection::connect(store::direct_url(database))
        .await
        .unwrap();
    let attempt_id: Uuid = attempt.parse().unwrap();

    attempts::mark_create_uncertain(pool, writes, attempt_id)
        .await
        .unwrap();
    let sql = "SELECT create_uncertain FROM payment_attempts WHERE id::text = $1";
    committed(&mut direct, "create uncertain", sql, &attempt).await;

    attempts::postpone(pool, writes, attempt_id, 60)
        .await
        .unwrap();
    let sql = "SELECT checks = 1 FROM payment_attempts WHERE id::text = $1";
    committed(&mut direct, "check postponed", sql, &attempt).await;

    let claim = attempts::claim_capture(pool, writes, attempt_id, 10)
        .await
        .unwrap();
    assert_eq!(claim, CaptureClaim::Claimed);
    let sql = "SELECT capture_claimed_at IS NOT NULL FROM payment_attempts WHERE id::text = $1";
    committed(&mut direct, "capture claimed", sql, &attempt).await;

    attempts::drop_capture_claim(pool, writes, attempt_id)
        .await
        .unwrap();
    let sql = "SELECT capture_claimed_at IS NULL FROM payment_attempts WHERE id::text = $1";
    committed(&mut direct, "capture claim dropped", sql, &attempt).await;

    let claimed = outbox::claim(pool, writes, 10, 60).await.unwrap();
    assert_eq!(claimed.iter().map(|e| e.id).collect::<Vec<_>>(), [entry]);
    let sql = "SELECT attempts = 1 FROM outbox WHERE id::text = $1";
    committed(&mut direct, "outbox lease", sql, &entry_text).await;

    outbox::retry_later(pool, writes, entry, "refused")
        .await
        .unwrap();
    let sql = "SELECT last_error = 'refused' FROM outbox WHERE id::text = $1";
    committed(&mut direct, "outbox retry", sql, &entry_text).await;

    outbox::done(pool, writes, entry).await.unwrap();
    let sql = "SELECT done_at IS NOT NULL FROM outbox WHERE id::text = $1";
    committed(&mut direct, "outbox done", sql, &entry_text).await;

    assert!(
        refunds::record_failure(pool, writes, refund, "refused", 1)
            .await
            .unwrap()
    );
    let sql = "SELECT status = 'FAILED' FROM refunds WHERE id::text = $1";
    committed(&mut direct, "refund given up", sql, &refund.to_string()).await;

    close_open_attempts_is_committed(&app.settings, pool, &mut direct, order_id).await;
    pools.request.close().await;
    direct.close().await.unwrap();
    app.cleanup().await;
}

/// The void queued for a cancelled order's open session is visible once the call returns.
async fn close_open_attempts_is_committed(
    settings: &flashgate::config::Settings,
    pool: &sqlx::PgPool,
    direct: &mut PgConnection,
    order_id: Uuid,
) {
    let mut settings = settings.clone();
    settings.payments.enabled = true;
    let payments = flashgate::app::build_payments(&settings, &flashgate::clock::Clock::system())
        .unwrap()
        .expect("payments enabled");
    payments.close_open_attempts(pool, order_id).await.unwrap();
    let queued: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM outbox WHERE kind = 'void' AND payload->>'provider_payment_id' = $1)",
    )
    .bind("pi_pooled")
    .fetch_one(&mut *direct)
    .await
    .unwrap();
    assert!(queued, "the void was not committed when the call returned");
}

/// Whether `argument` (what a statement is run on) names a pool rather than a connection
/// or transaction already checked out.
fn is_pool(argument: &str) -> bool {
    let argument = argument.trim().trim_start_matches('&');
    argument == "pool" || argument.ends_with(".pool") || argument.contains("pools.")
}

/// Statements in `text` that write (INSERT, UPDATE, DELETE) and run straight on a pool, as
/// `line: argument`.
fn writes_on_a_pool(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for method in [
        ".execute(",
        ".fetch_one(",
        ".fetch_optional(",
        ".fetch_all(",
    ] {
        for (at, _) in text.match_indices(method) {
            let rest = &text[at + method.len()..];
            let argument = &rest[..rest.find(')').unwrap_or(0)];
            if !is_pool(argument) {
                continue;
            }
            // The statement: back to the end of the one before, or the start of the function.
            let before = &text[..at];
            let start = [before.rfind(".await"), before.rfind("fn ")]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(0);
            let statement = &text[start..at];
            if ["INSERT INTO", "UPDATE ", "DELETE FROM"]
                .iter()
                .any(|verb| statement.contains(verb))
            {
                let line = text[..at].lines().count();
                found.push(format!("{line}: {argument}"));
            }
        }
    }
    found
}

/// A write run straight on a pool would be committed behind a pooler only after the
/// connection went back: every write runs in a transaction of its own or through
/// `store::Writes`.
#[test]
fn no_write_runs_straight_on_a_pool() {
    let sample = "fn f() {\n    x.await;\n    let sql = format!(\"UPDATE t SET a = 1\");\n    \
                  sqlx::query(AssertSqlSafe(sql)).execute(&self.pool).await;\n    \
                  sqlx::query(\"SELECT 1\").fetch_one(pool).await\n}";
    assert_eq!(
        writes_on_a_pool(sample),
        ["4: &self.pool"],
        "the check finds what it looks for"
    );
    let root = crate::helpers::crate_root();
    let files = crate::helpers::source_files();
    let mut offenders = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for found in writes_on_a_pool(&text) {
            offenders.push(format!(
                "{}:{found}",
                file.strip_prefix(root).unwrap().display()
            ));
        }
    }
    assert!(
        offenders.is_empty(),
        "writes run straight on a pool:\n{}",
        offenders.join("\n")
    );
}
