//! The `[waiting_room]` section: the line's pace, the passes and their keys, proof of work
//! and the waiting page, declared beside the waiting room that reads them.

use std::ops::RangeInclusive;

use serde::Deserialize;

use crate::settings::require;

/// Shortest `waiting_room.pass_secret` any command accepts; `serve` asks for more (see
/// `config`).
pub const PASS_SECRET_BYTES_MIN: usize = 16;

/// The values `waiting_room.advance_interval_ms` may take: a line moves at least once a
/// second.
pub const ADVANCE_INTERVAL_MS_RANGE: RangeInclusive<u64> = 1..=1000;

/// Longest `waiting_room.lease_ttl_ms`: another instance takes over a dead advancer within
/// a minute.
pub const LEASE_TTL_MS_MAX: u64 = 60_000;

/// The values `waiting_room.stock_refresh_ms` may take: stock is re-read at least every ten
/// seconds.
pub const STOCK_REFRESH_MS_RANGE: RangeInclusive<u64> = 1..=10_000;

/// The values `waiting_room.step_tickets_max` may take.
pub const STEP_TICKETS_MAX_RANGE: RangeInclusive<u32> = 1..=100_000;

/// The values `waiting_room.shuffle_tickets_max` may take.
pub const SHUFFLE_TICKETS_MAX_RANGE: RangeInclusive<u32> = 1..=1_000_000;

/// Shortest `waiting_room.keys_ttl_seconds`: a line's keys stay at least an hour after its
/// last ticket was taken.
pub const KEYS_TTL_SECONDS_MIN: u64 = 3600;

/// Largest `waiting_room.stock_age_max_ms`: a snapshot ten minutes old admits nobody.
pub const STOCK_AGE_MAX_MS_CEILING: u64 = 600_000;

/// The values `waiting_room.idle_check_ms` may take: a sleeping advancer wakes within a
/// minute.
pub const IDLE_CHECK_MS_RANGE: RangeInclusive<u64> = 10..=60_000;

/// The values `waiting_room.paid_sample_interval_ms` may take: a count at most ten minutes
/// old, read at most once a second.
pub const PAID_SAMPLE_INTERVAL_MS_RANGE: RangeInclusive<u64> = 1000..=600_000;

/// The values `waiting_room.revocation_poll_ms` may take: a revoked pass stops working on
/// every instance within a second.
pub const REVOCATION_POLL_MS_RANGE: RangeInclusive<u64> = 1..=1000;

/// The values `waiting_room.revocations_max` may take: enough for instances catching up,
/// bounded in Redis.
pub const REVOCATIONS_MAX_RANGE: RangeInclusive<u64> = 1000..=10_000_000;

/// The values `waiting_room.pow_challenge_ttl_seconds` may take.
pub const POW_CHALLENGE_TTL_SECONDS_RANGE: RangeInclusive<u64> = 10..=600;

/// The values `waiting_room.pow_bits_max` may take.
pub const POW_BITS_MAX_RANGE: RangeInclusive<u32> = 1..=32;

/// The longest `waiting_room.follow_refresh_seconds_max` may be: a client far back still
/// reads the line at least once an hour.
pub const FOLLOW_REFRESH_SECONDS_CEILING: u64 = 3600;

/// The values `waiting_room.checkin_window_seconds` may take: a window of at least a few
/// seconds leaves a client that reads the public state every second time to check in, and
/// one of an hour already covers any line a buyer would wait in with the page open.
pub const CHECKIN_WINDOW_SECONDS_RANGE: RangeInclusive<u64> = 5..=3600;

/// The values `waiting_room.line_state_refresh_ms` may take: the public state is at most ten
/// seconds old.
pub const LINE_STATE_REFRESH_MS_RANGE: RangeInclusive<u64> = 10..=10_000;

/// Longest `waiting_room.page_title`, in bytes.
pub const PAGE_TITLE_BYTES_MAX: usize = 200;

/// The values `waiting_room.health_report_ms` may take: an adaptive line reacts within
/// seconds, and Redis is not written more than twenty times a second per deal and instance.
pub const HEALTH_REPORT_MS_RANGE: RangeInclusive<u64> = 50..=5000;

/// Most report intervals one health window spans (`health_window_ms` over
/// `health_report_ms`): the slices an instance keeps per deal, each with its latencies.
pub const HEALTH_WINDOW_REPORTS_MAX: u64 = 20;

/// The values `waiting_room.adaptive_cut_to_percent` may take.
pub const ADAPTIVE_CUT_TO_PERCENT_RANGE: RangeInclusive<u32> = 10..=90;

/// The values `waiting_room.adaptive_climb_percent_per_second` may take.
pub const ADAPTIVE_CLIMB_PERCENT_PER_SECOND_RANGE: RangeInclusive<u32> = 1..=100;

/// The values `waiting_room.adaptive_hold_percent` and `adaptive_probe_percent` may take.
pub const ADAPTIVE_SHARE_PERCENT_RANGE: RangeInclusive<u32> = 5..=95;

/// Longest `waiting_room.adaptive_cut_cooldown_ms`.
pub const ADAPTIVE_CUT_COOLDOWN_MS_MAX: u64 = 30_000;

/// Bounds of `waiting_room.when_busy_calm_seconds`: long enough not to flap with each burst,
/// short enough that a quiet sale goes back to admitting at once within the hour.
pub const WHEN_BUSY_CALM_SECONDS_RANGE: RangeInclusive<u64> = 1..=3600;

/// Bounds of `waiting_room.access_codes_per_request_max`.
pub const ACCESS_CODES_PER_REQUEST_MAX_RANGE: RangeInclusive<u32> = 1..=100_000;

/// Longest `waiting_room.page_stylesheet_url`, in bytes.
pub const PAGE_STYLESHEET_URL_BYTES_MAX: usize = 2000;

/// The queue in front of deals that have a waiting room (the per-deal rates are on the deal).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitingRoomSettings {
    /// HMAC-SHA256 key of the passes (FLASHGATE__WAITING_ROOM__PASS_SECRET); every instance
    /// must share it, since a pass minted by one is checked by another.
    pub pass_secret: String,
    /// How often the instance holding the lease moves each line.
    pub advance_interval_ms: u64,
    /// The advancing instance's Redis lease; if it dies, another takes over within this.
    pub lease_ttl_ms: u64,
    /// While no line has anyone waiting, the advancer sleeps; each
    /// instance checks this often whether a join elsewhere woke it (one Redis command).
    pub idle_check_ms: u64,
    /// A waiting ticket not polled for this long is skipped when its turn comes.
    pub abandon_after_seconds: u64,
    /// Outstanding passes are capped at this multiple of the units available or reserved.
    pub stock_multiple: f64,
    /// How often the advancer re-reads each deal's stock from PostgreSQL.
    pub stock_refresh_ms: u64,
    /// Admission saved up while the line was empty or capped, in milliseconds of rate.
    pub burst_ms: u64,
    /// Most tickets one step of one line looks at (admitted or skipped).
    pub step_tickets_max: u32,
    /// Longest `refresh_after_seconds` a poller is told; keep it well below the abandon grace.
    pub refresh_after_seconds_max: u64,
    /// A ticket polls personally (checks in) only once the line's `admitted_through` is
    /// within `admit_per_second ×` this of its position; until then its holder reads the
    /// public, cacheable line state, so the origin's personal polls grow with the front of
    /// the line, not with the crowd. At least `abandon_after_seconds`: a ticket not seen
    /// within that grace when its turn comes is skipped, so one that never checked in
    /// within the window is skipped like any abandoned one.
    pub checkin_window_seconds: u64,
    /// Longest interval a client outside the check-in window is told to wait before it
    /// reads the line again (the public state for its distance, or a ticket poll answered
    /// from far back): the interval grows with the distance from the window up to this.
    pub follow_refresh_seconds_max: u64,
    /// Each instance reads a line's public state from Redis at most once per this; every
    /// public poll in between is answered from memory, so public polls cost Redis nothing.
    pub line_state_refresh_ms: u64,
    /// Most tickets shuffled in one line when a random-order sale opens.
    pub shuffle_tickets_max: u32,
    /// A line's Redis keys expire this long after its last ticket was taken.
    pub keys_ttl_seconds: u64,
    /// A stock snapshot older than this admits nobody (the advancer could not re-read it).
    pub stock_age_max_ms: u64,
    /// How often each instance reads the revocation stream: the most a revoked pass keeps
    /// working on another instance.
    pub revocation_poll_ms: u64,
    /// Revocations kept in the Redis stream (approximately), for instances catching up.
    pub revocations_max: u64,
    /// `ed25519` (anyone holding the published key set can verify) or `hmac` (only holders
    /// of `pass_secret` can). Both are always accepted; this picks what is minted.
    pub pass_format: String,
    /// Ed25519 signing keys as base64url 32-byte seeds (FLASHGATE__WAITING_ROOM__PASS_SIGNING_KEYS):
    /// the first signs, all are published and verify, so a key is rotated in by listing it
    /// second, then first once cached key sets hold it (`keys_max_age_seconds`), then
    /// dropping the old one after `pass_ttl_seconds`. Empty: one key derived from
    /// `pass_secret`.
    pub pass_signing_keys: Vec<String>,
    /// How long a CDN may cache the published key set.
    pub keys_max_age_seconds: u64,
    /// A proof-of-work challenge this instance issues must be solved and used within this;
    /// the expiry is signed in, so every instance enforces the issuer's.
    pub pow_challenge_ttl_seconds: u64,
    /// The hardest challenge ever asked, however large the crowd.
    pub pow_bits_max: u32,
    /// The crowd size from which each doubling of the people waiting adds one bit.
    pub pow_crowd_step: u64,
    /// The waiting page's title: the shop's branding.
    pub page_title: String,
    /// The waiting page's stylesheet URL; empty for none.
    pub page_stylesheet_url: String,
    /// How long a CDN may cache the waiting page.
    pub page_max_age_seconds: u64,
    /// How often each instance reports its pass holders' order health (p99, 503s, payment
    /// breaker) to Redis for an adaptive line: the loop can react no faster than this.
    pub health_report_ms: u64,
    /// How long each report looks back: the throughput is counted over this (a few answers
    /// even from a slowed back end), while a report still goes out every `health_report_ms`.
    pub health_window_ms: u64,
    /// A report older than this is ignored, so an instance that died stops counting.
    pub health_stale_ms: u64,
    /// What a cut keeps of an adaptive line's outflow, in percent: lower reacts harder.
    pub adaptive_cut_to_percent: u32,
    /// How fast a healthy adaptive line climbs, as a percent of its `max - min` per second.
    pub adaptive_climb_percent_per_second: u32,
    /// After a cut, no other cut and no climb for this long: the next decision sees the
    /// lower rate's health, not the backlog the higher rate left.
    pub adaptive_cut_cooldown_ms: u64,
    /// The hold line of an adaptive line, in percent of its target p99: above it the
    /// outflow eases down instead of climbing, so the p99 settles under the target.
    pub adaptive_hold_percent: u32,
    /// How fast an adaptive line climbs under the rate its back end last gave out at, in
    /// percent of that rate a second.
    pub adaptive_probe_percent: u32,
    /// A `when_busy` line goes back to admitting joins at once only once it is empty and
    /// arrivals stayed below its outflow for this long, so a crowd arriving in waves is not
    /// let in at once between two waves.
    pub when_busy_calm_seconds: u64,
    /// Most access codes one call issues (`POST /admin/deals/{id}/access-codes`), so one
    /// request neither holds a transaction long nor answers megabytes.
    pub access_codes_per_request_max: u32,
    /// How often the orders paid by buyers who got a turn are counted from PostgreSQL for
    /// `flashgate_waiting_room_orders_paid` (one grouped read of the recent deals' lines).
    pub paid_sample_interval_ms: u64,
}

/// The pass secret never reaches logs.
impl std::fmt::Debug for WaitingRoomSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingRoomSettings")
            .field("pass_secret", &"<redacted>")
            .field("advance_interval_ms", &self.advance_interval_ms)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .field("idle_check_ms", &self.idle_check_ms)
            .finish_non_exhaustive()
    }
}

impl WaitingRoomSettings {
    /// Checks every limit of the section; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_pace()?;
        self.validate_adaptive()?;
        self.validate_edge()
    }

    /// The health reports, the adaptive loop's tuning and the `when_busy` switch.
    fn validate_adaptive(&self) -> Result<(), String> {
        require(
            HEALTH_REPORT_MS_RANGE.contains(&self.health_report_ms),
            &format!("waiting_room.health_report_ms must be {HEALTH_REPORT_MS_RANGE:?}"),
        )?;
        require(
            self.health_window_ms >= self.health_report_ms
                && self.health_window_ms <= HEALTH_WINDOW_REPORTS_MAX * self.health_report_ms,
            &format!(
                "waiting_room.health_window_ms must be health_report_ms..=\
                 {HEALTH_WINDOW_REPORTS_MAX} × health_report_ms"
            ),
        )?;
        require(
            self.health_stale_ms >= 2 * self.health_report_ms
                && self.health_stale_ms <= 10 * HEALTH_REPORT_MS_RANGE.end(),
            "waiting_room.health_stale_ms must be 2 × health_report_ms..=50000",
        )?;
        require(
            ADAPTIVE_CUT_TO_PERCENT_RANGE.contains(&self.adaptive_cut_to_percent),
            &format!(
                "waiting_room.adaptive_cut_to_percent must be {ADAPTIVE_CUT_TO_PERCENT_RANGE:?}"
            ),
        )?;
        require(
            ADAPTIVE_CLIMB_PERCENT_PER_SECOND_RANGE
                .contains(&self.adaptive_climb_percent_per_second),
            &format!(
                "waiting_room.adaptive_climb_percent_per_second must be {ADAPTIVE_CLIMB_PERCENT_PER_SECOND_RANGE:?}"
            ),
        )?;
        for (value, key) in [
            (self.adaptive_hold_percent, "adaptive_hold_percent"),
            (self.adaptive_probe_percent, "adaptive_probe_percent"),
        ] {
            require(
                ADAPTIVE_SHARE_PERCENT_RANGE.contains(&value),
                &format!("waiting_room.{key} must be {ADAPTIVE_SHARE_PERCENT_RANGE:?}"),
            )?;
        }
        require(
            self.adaptive_cut_cooldown_ms <= ADAPTIVE_CUT_COOLDOWN_MS_MAX,
            &format!(
                "waiting_room.adaptive_cut_cooldown_ms must be at most {ADAPTIVE_CUT_COOLDOWN_MS_MAX}"
            ),
        )?;
        require(
            WHEN_BUSY_CALM_SECONDS_RANGE.contains(&self.when_busy_calm_seconds),
            &format!(
                "waiting_room.when_busy_calm_seconds must be {WHEN_BUSY_CALM_SECONDS_RANGE:?}"
            ),
        )?;
        require(
            ACCESS_CODES_PER_REQUEST_MAX_RANGE.contains(&self.access_codes_per_request_max),
            &format!(
                "waiting_room.access_codes_per_request_max must be {ACCESS_CODES_PER_REQUEST_MAX_RANGE:?}"
            ),
        )
    }

    /// The advancer, the stock it admits against and the line's keys.
    fn validate_pace(&self) -> Result<(), String> {
        require(
            self.pass_secret.len() >= PASS_SECRET_BYTES_MIN,
            &format!("waiting_room.pass_secret must be at least {PASS_SECRET_BYTES_MIN} bytes"),
        )?;
        require(
            ADVANCE_INTERVAL_MS_RANGE.contains(&self.advance_interval_ms),
            &format!("waiting_room.advance_interval_ms must be {ADVANCE_INTERVAL_MS_RANGE:?}"),
        )?;
        require(
            self.lease_ttl_ms >= 3 * self.advance_interval_ms
                && self.lease_ttl_ms <= LEASE_TTL_MS_MAX,
            &format!(
                "waiting_room.lease_ttl_ms must be 3 × advance_interval_ms..={LEASE_TTL_MS_MAX}"
            ),
        )?;
        require(
            self.abandon_after_seconds >= 2 * self.refresh_after_seconds_max.max(1),
            "waiting_room.abandon_after_seconds must be at least twice refresh_after_seconds_max",
        )?;
        require(
            CHECKIN_WINDOW_SECONDS_RANGE.contains(&self.checkin_window_seconds)
                && self.checkin_window_seconds >= 2 * self.refresh_after_seconds_max
                && self.checkin_window_seconds >= self.abandon_after_seconds,
            &format!(
                "waiting_room.checkin_window_seconds must be {CHECKIN_WINDOW_SECONDS_RANGE:?}, at least twice refresh_after_seconds_max and at least abandon_after_seconds"
            ),
        )?;
        require(
            self.follow_refresh_seconds_max >= self.refresh_after_seconds_max
                && self.follow_refresh_seconds_max <= FOLLOW_REFRESH_SECONDS_CEILING,
            &format!(
                "waiting_room.follow_refresh_seconds_max must be refresh_after_seconds_max..={FOLLOW_REFRESH_SECONDS_CEILING}"
            ),
        )?;
        require(
            LINE_STATE_REFRESH_MS_RANGE.contains(&self.line_state_refresh_ms),
            &format!("waiting_room.line_state_refresh_ms must be {LINE_STATE_REFRESH_MS_RANGE:?}"),
        )?;
        require(
            self.stock_multiple.is_finite() && self.stock_multiple >= 1.0,
            "waiting_room.stock_multiple must be at least 1",
        )?;
        require(
            STOCK_REFRESH_MS_RANGE.contains(&self.stock_refresh_ms),
            &format!("waiting_room.stock_refresh_ms must be {STOCK_REFRESH_MS_RANGE:?}"),
        )?;
        require(
            self.burst_ms >= self.advance_interval_ms,
            "waiting_room.burst_ms must be at least advance_interval_ms",
        )?;
        require(
            STEP_TICKETS_MAX_RANGE.contains(&self.step_tickets_max),
            &format!("waiting_room.step_tickets_max must be {STEP_TICKETS_MAX_RANGE:?}"),
        )?;
        require(
            SHUFFLE_TICKETS_MAX_RANGE.contains(&self.shuffle_tickets_max),
            &format!("waiting_room.shuffle_tickets_max must be {SHUFFLE_TICKETS_MAX_RANGE:?}"),
        )?;
        require(
            self.keys_ttl_seconds >= KEYS_TTL_SECONDS_MIN,
            &format!("waiting_room.keys_ttl_seconds must be at least {KEYS_TTL_SECONDS_MIN}"),
        )
    }

    /// Stock age, revocations, pass signing, proof of work and the waiting page.
    fn validate_edge(&self) -> Result<(), String> {
        require(
            self.stock_age_max_ms >= 2 * self.stock_refresh_ms
                && self.stock_age_max_ms <= STOCK_AGE_MAX_MS_CEILING,
            &format!(
                "waiting_room.stock_age_max_ms must be 2 × stock_refresh_ms..={STOCK_AGE_MAX_MS_CEILING}"
            ),
        )?;
        require(
            IDLE_CHECK_MS_RANGE.contains(&self.idle_check_ms),
            &format!("waiting_room.idle_check_ms must be {IDLE_CHECK_MS_RANGE:?}"),
        )?;
        require(
            PAID_SAMPLE_INTERVAL_MS_RANGE.contains(&self.paid_sample_interval_ms),
            &format!(
                "waiting_room.paid_sample_interval_ms must be {PAID_SAMPLE_INTERVAL_MS_RANGE:?}"
            ),
        )?;
        require(
            REVOCATION_POLL_MS_RANGE.contains(&self.revocation_poll_ms),
            &format!("waiting_room.revocation_poll_ms must be {REVOCATION_POLL_MS_RANGE:?}"),
        )?;
        require(
            REVOCATIONS_MAX_RANGE.contains(&self.revocations_max),
            &format!("waiting_room.revocations_max must be {REVOCATIONS_MAX_RANGE:?}"),
        )?;
        require(
            matches!(self.pass_format.as_str(), "ed25519" | "hmac"),
            "waiting_room.pass_format must be ed25519 or hmac",
        )?;
        require(
            self.signing_seeds().is_ok(),
            "waiting_room.pass_signing_keys must be base64url 32-byte seeds",
        )?;
        require(
            POW_CHALLENGE_TTL_SECONDS_RANGE.contains(&self.pow_challenge_ttl_seconds),
            &format!(
                "waiting_room.pow_challenge_ttl_seconds must be {POW_CHALLENGE_TTL_SECONDS_RANGE:?}"
            ),
        )?;
        require(
            POW_BITS_MAX_RANGE.contains(&self.pow_bits_max),
            &format!("waiting_room.pow_bits_max must be {POW_BITS_MAX_RANGE:?}"),
        )?;
        require(
            self.pow_crowd_step >= 1,
            "waiting_room.pow_crowd_step must be at least 1",
        )?;
        require(
            self.page_title.len() <= PAGE_TITLE_BYTES_MAX
                && self.page_stylesheet_url.len() <= PAGE_STYLESHEET_URL_BYTES_MAX,
            &format!(
                "waiting_room.page_title must be at most {PAGE_TITLE_BYTES_MAX} bytes, page_stylesheet_url {PAGE_STYLESHEET_URL_BYTES_MAX}"
            ),
        )
    }

    /// The Ed25519 seeds of the settings (the first signs), or one derived from `pass_secret`.
    pub fn signing_seeds(&self) -> Result<Vec<[u8; 32]>, String> {
        if self.pass_signing_keys.is_empty() {
            return Ok(vec![derived_seed(&self.pass_secret)]);
        }
        use base64::Engine;
        self.pass_signing_keys
            .iter()
            .map(|seed| {
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(seed.trim())
                    .map_err(|e| e.to_string())?;
                <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| "not 32 bytes".to_owned())
            })
            .collect()
    }
}

/// The Ed25519 seed derived from `pass_secret`, for a deployment that lists no signing keys.
pub fn derived_seed(pass_secret: &str) -> [u8; 32] {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    digest.update(b"flashgate pass ed25519 seed\0");
    digest.update(pass_secret.as_bytes());
    digest.finalize().into()
}
