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
//! - that transaction is committed only after the connection went back to the pool, maybe
//!   after the caller answered: a single write made straight on a pool therefore goes
//!   through [`super::Writes`], which commits it before returning;
//! - the statement timeout is set with `SET LOCAL`, as the pooler drops startup options.

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Executor};

/// Connection options for the pooler: no statement cache, no startup parameters it rejects.
pub(super) fn options(options: PgConnectOptions) -> PgConnectOptions {
    options.statement_cache_capacity(0).extra_float_digits(None)
}

/// Opens the transaction a checkout runs in. Notices of the nested `BEGIN` and `COMMIT`
/// of the code's own transactions are expected; as warnings they would only be noise.
pub(super) async fn begin(
    conn: &mut PgConnection,
    statement_timeout_ms: u64,
) -> Result<(), sqlx::Error> {
    let begin = format!(
        "BEGIN; SET LOCAL client_min_messages = error; \
         SET LOCAL statement_timeout = {statement_timeout_ms}"
    );
    conn.execute(sqlx::raw_sql(AssertSqlSafe(begin))).await?;
    Ok(())
}

/// Commits the checkout's transaction. An aborted one is rolled back by COMMIT; when the
/// code's own transaction already ended it, COMMIT does nothing.
pub(super) async fn commit(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    conn.execute(sqlx::raw_sql("SET client_min_messages = error; COMMIT"))
        .await?;
    Ok(())
}
