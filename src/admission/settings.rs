//! The admission sections: `[auth]` (user tokens and the admin token), `[limits]` (the
//! per-IP, per-user and per-deal token buckets, shared through Redis) and `[soldout]` (the
//! sold-out mirror), declared beside the checks that read them.

use ipnet::IpNet;
use std::ops::RangeInclusive;

use serde::Deserialize;

use super::oidc::OidcSettings;
use crate::deals::DealSettings;
use crate::settings::require;

/// Shortest `auth.admin_token` any command accepts; `serve` asks for more (see `config`).
pub const ADMIN_TOKEN_BYTES_MIN: usize = 16;

/// The values `limits.global.user_batch_max` may take: one script call answers a batch.
pub const USER_BATCH_MAX_RANGE: RangeInclusive<u32> = 1..=1024;
/// Most of a user's budget spent in memory: the rest, taken through Redis, is what lets a
/// user reach more than one instance's share through a single instance.
pub const USER_SHARE_PERCENT_MAX: u32 = 90;

/// The values `soldout.refresh_interval_ms` may take: a cleared flag spreads within a second.
pub const REFRESH_INTERVAL_MS_RANGE: RangeInclusive<u64> = 1..=1000;
use crate::waiting_room::WaitingRoomSettings;

/// The sections admission is built from, borrowed from the assembled settings.
pub struct AdmissionSettings<'a> {
    /// Proxies whose client-address header is believed (`server.trusted_proxies`).
    pub trusted_proxies: &'a [IpNet],
    /// The user tokens' secret, claims and leeway.
    pub auth: &'a AuthSettings,
    /// The token buckets.
    pub limits: &'a LimitSettings,
    /// The sold-out mirror's buyers.
    pub soldout: &'a SoldOutSettings,
    /// The catalogue cache.
    pub deals: &'a DealSettings,
    /// The passes a waiting-room deal asks for.
    pub waiting_room: &'a WaitingRoomSettings,
}

/// The user tokens' secret and claims, and the operators' admin token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// HS256 secret of the user tokens.
    pub jwt_secret: String,
    /// Clock skew allowed on `exp`; 0 refuses a token the second it expires.
    pub jwt_leeway_seconds: u64,
    /// The `iss` every user token must carry.
    pub jwt_issuer: String,
    /// The `aud` every user token must carry.
    pub jwt_audience: String,
    /// Bearer token of the admin API.
    pub admin_token: String,
    /// False switches the static admin token off: only provider tokens holding
    /// `auth.oidc.admin_value` then open the admin API.
    pub admin_token_enabled: bool,
    /// Longest `sub` accepted as a user id, in bytes.
    pub user_id_bytes_max: usize,
    /// An OpenID Connect provider whose tokens name users and operators.
    pub oidc: OidcSettings,
}

impl AuthSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            !self.jwt_secret.is_empty(),
            "auth.jwt_secret must not be empty",
        )?;
        require(
            !self.jwt_issuer.is_empty() && !self.jwt_audience.is_empty(),
            "auth.jwt_issuer and auth.jwt_audience must not be empty",
        )?;
        require(
            self.admin_token.len() >= ADMIN_TOKEN_BYTES_MIN,
            &format!("auth.admin_token must be at least {ADMIN_TOKEN_BYTES_MIN} bytes"),
        )?;
        require(
            self.user_id_bytes_max > 0,
            "auth.user_id_bytes_max must be > 0",
        )?;
        require(
            self.admin_token_enabled || !self.oidc.admin_claim.is_empty(),
            "auth.admin_token_enabled = false needs auth.oidc.admin_claim and admin_value, or nobody could use the admin API",
        )?;
        self.oidc.validate()
    }
}

/// The secrets never reach logs.
impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("jwt_secret", &"<redacted>")
            .field("admin_token", &"<redacted>")
            .field("jwt_leeway_seconds", &self.jwt_leeway_seconds)
            .finish_non_exhaustive()
    }
}

/// The token buckets every order request passes, and how idle ones are dropped.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    /// How often idle limiter keys are dropped, so a flood of distinct keys cannot grow memory.
    pub retain_interval_ms: u64,
    /// Order requests from one client address.
    pub per_ip: RateSettings,
    /// Order requests from one user.
    pub per_user: RateSettings,
    /// Order requests for one deal.
    pub per_deal: RateSettings,
    /// How the per-user and per-deal buckets are shared between instances.
    pub global: GlobalLimitSettings,
}

/// The per-user and per-deal limits shared by every instance through Redis.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalLimitSettings {
    /// Off: each instance enforces the limits alone, so N instances allow N times the rate.
    pub enabled: bool,
    /// Most order requests an instance takes from a deal's shared budget per Redis round
    /// trip (never more than the deal's burst); slices grow to it with local demand.
    pub deal_slice: u32,
    /// A slice is spent for at most this long; what it leaves goes back to the budget.
    pub slice_ttl_ms: u64,
    /// How often each instance announces itself in Redis.
    pub heartbeat_interval_ms: u64,
    /// An instance not heard from for this long no longer counts.
    pub instance_ttl_ms: u64,
    /// Instances assumed until Redis has told how many run; while Redis is down each
    /// instance allows this share (1/N) of the per-user and per-deal budgets.
    pub instances_assumed: u32,
    /// Most per-user checks answered by one Redis script call.
    pub user_batch_max: u32,
    /// Most per-user checks waiting for Redis; past it the local share decides.
    pub user_queue_max: u32,
    /// Percent of each user's budget the live instances spend in memory, in equal shares;
    /// the rest is taken through Redis. 0: every per-user check asks Redis.
    pub user_share_percent: u32,
}

/// A token bucket: `rate_per_second` sustained, `burst` at once.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSettings {
    /// Requests allowed per second, sustained.
    pub rate_per_second: u32,
    /// Requests allowed at once above the sustained rate.
    pub burst: u32,
}

impl LimitSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        for (name, rate) in [
            ("per_ip", self.per_ip),
            ("per_user", self.per_user),
            ("per_deal", self.per_deal),
        ] {
            require(
                rate.rate_per_second > 0 && rate.burst > 0,
                &format!("limits.{name} rate_per_second and burst must be > 0"),
            )?;
        }
        require(
            self.retain_interval_ms > 0,
            "limits.retain_interval_ms must be > 0",
        )?;
        self.global.validate()
    }
}

impl GlobalLimitSettings {
    /// Checks the `[limits.global]` table; the message names the key.
    fn validate(&self) -> Result<(), String> {
        require(
            self.deal_slice > 0
                && self.slice_ttl_ms > 0
                && self.heartbeat_interval_ms > 0
                && self.instances_assumed > 0,
            "limits.global deal_slice, slice_ttl_ms, heartbeat_interval_ms and instances_assumed must be > 0",
        )?;
        require(
            self.instance_ttl_ms > 2 * self.heartbeat_interval_ms,
            "limits.global.instance_ttl_ms must exceed twice heartbeat_interval_ms",
        )?;
        require(
            self.user_share_percent <= USER_SHARE_PERCENT_MAX,
            &format!("limits.global.user_share_percent must be at most {USER_SHARE_PERCENT_MAX}"),
        )?;
        require(
            USER_BATCH_MAX_RANGE.contains(&self.user_batch_max)
                && self.user_queue_max >= self.user_batch_max,
            &format!(
                "limits.global.user_batch_max must be {USER_BATCH_MAX_RANGE:?} and user_queue_max at least as large"
            ),
        )
    }
}

/// How often the sold-out mirror is refreshed, and how many buyers of a sold-out deal it
/// remembers (a replay by one of them is not answered sold out).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoldOutSettings {
    /// How often each instance copies the shared sold-out set from Redis and drops flags
    /// PostgreSQL no longer backs.
    pub refresh_interval_ms: u64,
    /// Buyers of a sold-out deal remembered per deal, so their retries still get their order
    /// replayed.
    pub holders_max: usize,
    /// How often the remembered buyers are re-read at the latest.
    pub holders_refresh_ms: u64,
    /// Least time between two refreshes made at once because another instance announced
    /// that it set or cleared a flag.
    pub heard_refresh_gap_ms: u64,
}

impl SoldOutSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        require(
            REFRESH_INTERVAL_MS_RANGE.contains(&self.refresh_interval_ms),
            &format!(
                "soldout.refresh_interval_ms must be {REFRESH_INTERVAL_MS_RANGE:?} so a cleared flag spreads within a second"
            ),
        )?;
        require(
            self.holders_refresh_ms > 0,
            "soldout.holders_refresh_ms must be > 0",
        )?;
        require(
            (1..=self.refresh_interval_ms).contains(&self.heard_refresh_gap_ms),
            "soldout.heard_refresh_gap_ms must be between 1 and soldout.refresh_interval_ms",
        )
    }
}
