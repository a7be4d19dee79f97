//! The access codes of a deal's line (table `access_codes`, owned here): issued by an
//! operator in a batch and shown once, kept only as SHA-256 digests, each redeemed by one
//! user, who may show it again to join again.
//!
//! A code carries 128 random bits, so its digest needs no salt: nobody can try enough
//! codes to find one, and a stolen table gives away no code. Redeeming is one conditional
//! `UPDATE`: among concurrent tries of one code on any number of instances, PostgreSQL's
//! row lock lets exactly one user claim it.

use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::store::StoreError;

/// Longest code a join may show; real ones are 32 hex digits.
const CODE_CHARS_MAX: usize = 64;

/// What redeeming a code did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeemed {
    /// The user holds the code now (or held it already).
    Held,
    /// No such code for this deal.
    Unknown,
    /// Another user redeemed it.
    Taken,
}

/// How many codes a deal's line was given, and how many were redeemed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CodeCounts {
    pub issued: i64,
    pub redeemed: i64,
}

fn digest(code: &str) -> Vec<u8> {
    Sha256::digest(code.as_bytes()).to_vec()
}

/// Issues `count` new codes for the deal and returns them; only their digests are stored.
pub async fn issue(pool: &PgPool, deal_id: &str, count: u32) -> Result<Vec<String>, StoreError> {
    let codes: Vec<String> = (0..count)
        .map(|_| hex::encode(rand::random::<[u8; 16]>()))
        .collect();
    let digests: Vec<Vec<u8>> = codes.iter().map(|code| digest(code)).collect();
    // Each write in a transaction of its own: behind a transaction pooler, a write straight
    // on the pool would be committed only once the connection went back.
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO access_codes (deal_id, code_sha256)
         SELECT $1, digest FROM UNNEST($2::bytea[]) AS digest",
    )
    .bind(deal_id)
    .bind(&digests)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(codes)
}

/// Redeems `code` for `user`; the same user may redeem it again.
pub async fn redeem(
    pool: &PgPool,
    deal_id: &str,
    user: &str,
    code: &str,
) -> Result<Redeemed, StoreError> {
    let well_formed = !code.is_empty()
        && code.len() <= CODE_CHARS_MAX
        && code.bytes().all(|b| b.is_ascii_alphanumeric());
    if !well_formed {
        return Ok(Redeemed::Unknown);
    }
    let mut tx = pool.begin().await?;
    let (held, known): (bool, bool) = sqlx::query_as(
        "WITH claimed AS (
             UPDATE access_codes
                SET redeemed_by = $3, redeemed_at = COALESCE(redeemed_at, now())
              WHERE deal_id = $1 AND code_sha256 = $2
                AND (redeemed_by IS NULL OR redeemed_by = $3)
             RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM claimed),
                EXISTS (SELECT 1 FROM access_codes WHERE deal_id = $1 AND code_sha256 = $2)",
    )
    .bind(deal_id)
    .bind(digest(&code.to_ascii_lowercase()))
    .bind(user)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(match (held, known) {
        (true, _) => Redeemed::Held,
        (false, true) => Redeemed::Taken,
        (false, false) => Redeemed::Unknown,
    })
}

/// Whether `user` redeemed a code of the deal before.
pub async fn holds_one(pool: &PgPool, deal_id: &str, user: &str) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM access_codes WHERE deal_id = $1 AND redeemed_by = $2)",
    )
    .bind(deal_id)
    .bind(user)
    .fetch_one(pool)
    .await?)
}

/// The deal's codes issued and redeemed.
pub async fn counts(pool: &PgPool, deal_id: &str) -> Result<CodeCounts, StoreError> {
    let (issued, redeemed): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(redeemed_by) FROM access_codes WHERE deal_id = $1")
            .bind(deal_id)
            .fetch_one(pool)
            .await?;
    Ok(CodeCounts { issued, redeemed })
}

/// Why codes were not issued.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("count must be 1-{0}")]
    Count(u32),
    #[error("deal not found")]
    NotFound,
    /// The deal's line takes no codes (`waiting_room.invitation.codes`).
    #[error("this deal's waiting room takes no access codes")]
    NoCodes,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an operator's call issued: the codes, shown this once, and the deal's counts after.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Issued {
    pub deal_id: String,
    pub codes: Vec<String>,
    #[serde(flatten)]
    pub counts: CodeCounts,
}

/// Issues `count` codes (at most `max`, `waiting_room.access_codes_per_request_max`) for
/// a deal whose line takes codes. The one path for the admin API and the CLI.
pub async fn issue_for(
    pool: &PgPool,
    deal_id: &str,
    count: i64,
    max: u32,
) -> Result<Issued, IssueError> {
    let count = u32::try_from(count)
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or(IssueError::Count(max))?;
    let deal = crate::deals::load(pool, deal_id)
        .await?
        .ok_or(IssueError::NotFound)?;
    if !deal.waiting_room.takes_codes() {
        return Err(IssueError::NoCodes);
    }
    let codes = issue(pool, deal_id, count).await?;
    let counts = counts(pool, deal_id).await?;
    Ok(Issued {
        deal_id: deal.id,
        codes,
        counts,
    })
}
