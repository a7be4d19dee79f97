//! Single writes issued straight on a pool, committed before their caller goes on.
//!
//! Behind a transaction pooler every checkout runs in a transaction that the pool commits
//! only once the connection is back in it (see `pooler`), and that can be after the caller
//! answered a client, acknowledged a webhook or called the provider on the strength of the
//! write. A write whose result someone acts on therefore commits on its own connection
//! before it returns. Without a pooler each statement commits by itself: nothing is added,
//! not even a round trip.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{Executor, PgConnection, PgPool, Postgres};

use super::DatabaseSettings;
use super::StoreError;

/// Whether writes must commit explicitly: the same for every pool of one gateway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Writes {
    pooled: bool,
}

impl Writes {
    pub fn new(settings: &DatabaseSettings) -> Self {
        Self {
            pooled: settings.transaction_pooler,
        }
    }

    /// A connection of `pool` for writes that [`WriteConnection::commit`] makes durable.
    pub async fn acquire(self, pool: &PgPool) -> Result<WriteConnection, StoreError> {
        Ok(WriteConnection {
            conn: pool.acquire().await?,
            pooled: self.pooled,
        })
    }
}

/// A pool connection whose writes are committed by [`WriteConnection::commit`]. Dropped
/// without it (a statement failed), the checkout's transaction is rolled back or, without
/// a pooler, there is nothing left to commit.
pub struct WriteConnection {
    conn: PoolConnection<Postgres>,
    pooled: bool,
}

impl WriteConnection {
    /// Commits what was written, before the connection goes back to the pool.
    pub async fn commit(mut self) -> Result<(), StoreError> {
        if self.pooled {
            self.conn.execute(sqlx::raw_sql("COMMIT")).await?;
        }
        Ok(())
    }
}

impl Deref for WriteConnection {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for WriteConnection {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}
