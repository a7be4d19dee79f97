//! A primary that turns read-only, as one does in a failover: orders are answered 503 with
//! `Retry-After`, and the log says so in a few counted warnings, never an error per request
//! nor an error wrapped in another.

use std::time::Duration;

use sqlx::PgPool;

use crate::helpers::{
    Api, EVENTUALLY, LogFile, PrivatePostgres, eventually, new_deal, test_settings,
};
use crate::multi_process::{spawn_gateway_logging_to, wait_until_healthy};

/// Orders sent while the primary refuses writes.
const REQUESTS: usize = 60;
/// Most log lines meanwhile: the first failure, a count per `failover_log_interval_ms`.
const LINES_MAX: usize = 3;

/// Every session of the private server turns read-only (or back) at its next transaction.
async fn set_read_only(postgres: &PgPool, read_only: bool) {
    // ALTER SYSTEM runs outside a transaction: a statement of its own.
    let statement = if read_only {
        "ALTER SYSTEM SET default_transaction_read_only = on"
    } else {
        "ALTER SYSTEM SET default_transaction_read_only = off"
    };
    for sql in [statement, "SELECT pg_reload_conf()"] {
        sqlx::raw_sql(sql)
            .execute(postgres)
            .await
            .expect("switch default_transaction_read_only");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_primary_is_a_counted_warning_not_an_error_per_request() {
    // Arrange: a gateway process on a private PostgreSQL, logging warnings to a file.
    let postgres = PrivatePostgres::start().await;
    let admin = PgPool::connect(&postgres.url()).await.unwrap();
    let settings = test_settings(&postgres.url());
    let api = Api::on_free_ports(&settings);
    let log = LogFile::new("read-only-primary");
    let env = [("RUST_LOG", "warn")];
    let mut gateway = spawn_gateway_logging_to(&settings, &api, &env, log.stdio());
    wait_until_healthy(&mut gateway, &api).await;
    let deal = api.given_deal(&new_deal("read-only", 1000, 4)).await;
    api.order("before", &deal, 1).await.expect(201);
    let mark = log.mark();

    // Act: the primary refuses writes; orders keep coming.
    set_read_only(&admin, true).await;
    let refused = eventually(EVENTUALLY, || {
        let (api, deal) = (&api, &deal);
        async move { (api.order("first", deal, 1).await.status == 503).then_some(()) }
    });
    assert!(
        refused.await.is_some(),
        "orders still accepted on a read-only primary"
    );
    for n in 0..REQUESTS {
        let reply = api.order(&format!("buyer-{n}"), &deal, 1).await;
        reply.expect_problem(503, "overloaded");
        assert!(
            reply.header("retry-after").is_some(),
            "503 without Retry-After"
        );
    }

    // Assert: a warning with a count, no error lines, nothing wrapped twice.
    let lines = log.lines_since(mark);
    let all = lines.join("\n");
    eprintln!("logged while the primary was read-only:\n{all}");
    assert!(lines.len() <= LINES_MAX, "{} lines:\n{all}", lines.len());
    assert!(!all.contains(" ERROR "), "errors logged:\n{all}");
    assert!(
        !all.contains("unexpected or invalid data"),
        "wrapped twice:\n{all}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" WARN ") && l.contains("read-only") && l.contains("failed=")),
        "no counted warning:\n{all}"
    );

    // And the sale goes on once the primary takes writes again.
    set_read_only(&admin, false).await;
    let accepted = eventually(Duration::from_secs(10), || {
        let (api, deal) = (&api, &deal);
        async move { (api.order("after", deal, 1).await.status == 201).then_some(()) }
    });
    assert!(accepted.await.is_some(), "orders never accepted again");
    gateway.kill();
    admin.close().await;
}
