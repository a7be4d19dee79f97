//! Working through a transaction-pooling PgBouncer (1.18 and older: no prepared statements).
//!
//! Such a pooler lends a server connection for one transaction and takes it back at the
//! first `ReadyForQuery` outside one. sqlx prepares every statement (Parse, Describe, Sync)
//! and executes it in a second exchange (Bind, Execute, Sync), so outside a transaction the
//! two halves may reach different servers, and statement names of different clients collide
//! on one server. Hence, with `database.transaction_pooler`:
//! - every checkout of a connection opens a transaction (`BEGIN`) and commits it when the
//!   connection goes back to the pool, so a statement's two halves meet one server; a
//!   transaction the code opens itself nests in it (its `BEGIN` and `COMMIT` are the real
//!   ones; the outer `COMMIT` then finds nothing to do);
//! - the statement cache is off, so no statement is assumed to outlive its transaction, and
//!   the pooler runs `DEALLOCATE ALL` after each one (`server_reset_query_always = 1`);
//! - the statement timeout is set with `SET LOCAL`, as the pooler drops startup options.

use sqlx::pool::PoolOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Executor, Postgres};

/// Connection options for the pooler: no statement cache, no startup parameters it rejects.
pub(super) fn options(options: PgConnectOptions) -> PgConnectOptions {
    options.statement_cache_capacity(0).extra_float_digits(None)
}

/// Hooks that make each checkout one transaction.
pub(super) fn one_transaction_per_checkout(
    pool: PoolOptions<Postgres>,
    statement_timeout_ms: u64,
) -> PoolOptions<Postgres> {
    // Notices of the nested BEGIN/COMMIT are expected; warnings would only be noise.
    let begin = format!(
        "BEGIN; SET LOCAL client_min_messages = error; \
         SET LOCAL statement_timeout = {statement_timeout_ms}"
    );
    let on_connect = begin.clone();
    pool.after_connect(move |conn, _| {
        let begin = on_connect.clone();
        Box::pin(async move {
            conn.execute(sqlx::raw_sql(AssertSqlSafe(begin))).await?;
            Ok(())
        })
    })
    .before_acquire(move |conn, _| {
        let begin = begin.clone();
        Box::pin(async move {
            conn.execute(sqlx::raw_sql(AssertSqlSafe(begin))).await?;
            Ok(true)
        })
    })
    .after_release(|conn, _| {
        Box::pin(async move {
            // An aborted transaction is rolled back by COMMIT; none open, it does nothing.
            conn.execute(sqlx::raw_sql("SET client_min_messages = error; COMMIT"))
                .await?;
            Ok(true)
        })
    })
}
