//! A Redis connection that is allowed to be missing.
//!
//! Redis only accelerates flashgate, so the gateway must start and serve without it. This
//! handle keeps at most one multiplexed connection, bounds every command by a timeout,
//! counts failures, drops a broken connection and lets a background task reconnect.
//!
//! A command that times out does not by itself break the connection: on a CPU-starved host
//! the reply is often already in the socket when the timer fires, and dropping the one
//! connection every request shares would fail every Redis call until the next reconnect.
//! Timeouts drop it only once nothing at all has been answered for
//! `redis.unresponsive_after_ms` (a Redis that hangs); a closed or corrupt connection is
//! dropped at once.
//!
//! `redis.url` holding several URLs separated by commas selects a Redis Cluster: they are
//! its seed nodes, and each command goes to the primary of its key's slot (a script to the
//! slot of its first key; every script keeps its keys in one slot).
//!
//! Losing Redis is logged as a warning and its return as an info line, with at most one
//! warning every `redis.outage_log_interval_ms`: while Redis stays away the warning is
//! repeated that often with the number of calls that failed meanwhile, and a Redis that
//! keeps dropping is not a line per drop.
//!
//! Connected is not the same as up: [`health`] probes Redis every
//! `redis.health_check_interval_ms` and `/readyz` and `flashgate_redis_up` report that
//! verdict, so a cluster whose nodes say `cluster_state:fail` or a frozen server reads down.

mod follow;
mod health;
mod script;
mod settings;
mod target;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;
use redis::{Cmd, FromRedisValue, RedisResult, ToRedisArgs, Value};
use tokio::sync::RwLock;
// Tokio's clock (the same as std's unless a test pauses it), so tests can advance it.
use tokio_util::sync::CancellationToken;

use crate::clock::{elapsed_since, monotonic};
use crate::settings::redact_url;

use crate::telemetry;
use crate::telemetry::trace;
pub use script::Script;
pub use settings::RedisSettings;
use target::{Connection, Target};

#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("redis is not connected")]
    Disconnected,
    #[error("redis command timed out")]
    Timeout,
    #[error("redis command failed: {0}")]
    Command(#[from] redis::RedisError),
}

/// The name of the sold-out set under the key prefix.
const SOLD_OUT_SET: &str = "soldout";

/// How long a command may take, and how long timeouts may go on before the connection is
/// dropped as lost.
#[derive(Debug, Clone, Copy)]
pub struct RedisTimeouts {
    /// Any command slower than this fails (and its caller falls back).
    pub command: Duration,
    /// Timeouts with no answer at all for this long drop the connection.
    pub unresponsive_after: Duration,
}

/// True for Redis's answer to a script hash it does not hold.
fn is_unknown_script(error: &RedisError) -> bool {
    matches!(error, RedisError::Command(e) if e.code() == Some("NOSCRIPT"))
}

#[derive(Clone)]
pub struct RedisHandle {
    inner: Arc<Inner>,
}

struct Inner {
    client: Option<Target>,
    connection: RwLock<Option<Connection>>,
    key_prefix: String,
    command_timeout: Duration,
    /// How long timeouts may go on with no command answered before the connection counts
    /// as lost.
    unresponsive_after: Duration,
    /// When a command was last answered (or the connection made), as milliseconds since
    /// `created`; read when a command times out.
    answered_ms: AtomicU64,
    created: Instant,
    /// Where Redis is, for the log (no password).
    url: String,
    outage: Mutex<Outage>,
    /// Calls refused for want of a connection since the last outage warning; counted
    /// without the lock, since every call fails fast while Redis is away.
    refused: AtomicU64,
    outage_log_interval: Duration,
    health: health::Health,
}

/// What the log has said about the current outage.
#[derive(Default)]
struct Outage {
    /// When Redis was lost; `None` while connected (or before the first attempt).
    since: Option<Instant>,
    /// When an outage warning was last logged.
    warned_at: Option<Instant>,
    /// Whether this outage's warning was logged; only then is its end logged too.
    announced: bool,
    /// Failed commands and connection attempts since the last warning.
    failures: u64,
    ever_connected: bool,
}

impl RedisHandle {
    /// Never fails: a bad URL or an unreachable server leaves the handle disconnected.
    pub fn new(
        url: &str,
        key_prefix: &str,
        timeouts: RedisTimeouts,
        outage_log_interval: Duration,
    ) -> Self {
        let client = Target::open(url)
            .inspect_err(|error| {
                tracing::error!(
                    %error,
                    url = %redact_url(url),
                    "redis.url (REDIS_URL) is invalid; running without redis"
                );
            })
            .ok();
        Self {
            inner: Arc::new(Inner {
                client,
                connection: RwLock::new(None),
                key_prefix: key_prefix.to_owned(),
                command_timeout: timeouts.command,
                unresponsive_after: timeouts.unresponsive_after,
                answered_ms: AtomicU64::new(0),
                created: monotonic(),
                url: redact_url(url),
                outage: Mutex::new(Outage::default()),
                refused: AtomicU64::new(0),
                outage_log_interval,
                health: health::Health::default(),
            }),
        }
    }

    /// The handle `settings` describe.
    pub fn from_settings(settings: &RedisSettings) -> Self {
        Self::new(
            &settings.url,
            &settings.key_prefix,
            RedisTimeouts {
                command: Duration::from_millis(settings.command_timeout_ms),
                unresponsive_after: Duration::from_millis(settings.unresponsive_after_ms),
            },
            Duration::from_millis(settings.outage_log_interval_ms),
        )
    }

    /// The set (under `redis.key_prefix`) holding the ids of sold-out deals: written by the
    /// sold-out mirror, read by the waiting room's advancer and the audit.
    pub fn sold_out_key(&self) -> String {
        self.key(SOLD_OUT_SET)
    }

    pub fn key(&self, suffix: &str) -> String {
        format!("{}{}", self.inner.key_prefix, suffix)
    }

    /// Which keys one script call may touch together: any on one server, only keys of one
    /// slot on a cluster. Keys with equal groups can share a call.
    pub fn script_group(&self, key: &str) -> Option<Slot> {
        match self.inner.client {
            Some(Target::Cluster(..)) => Some(Slot::for_key(key)),
            _ => None,
        }
    }

    /// Runs `script` on `keys` (of one script group) with `args`, by hash first.
    pub async fn eval<T, K, A>(
        &self,
        script: &Script,
        keys: &[K],
        args: &A,
    ) -> Result<T, RedisError>
    where
        T: FromRedisValue,
        K: ToRedisArgs,
        A: ToRedisArgs,
    {
        match self.run(&script.call(false, keys, args)).await {
            Err(error) if is_unknown_script(&error) => {
                self.run(&script.call(true, keys, args)).await
            }
            answered => answered,
        }
    }

    pub async fn is_connected(&self) -> bool {
        self.inner.connection.read().await.is_some()
    }

    /// Whether Redis answered the last health probe (and the commands since), not merely
    /// whether a connection exists.
    pub fn is_up(&self) -> bool {
        self.inner.health.is_up()
    }

    /// Runs one command with the configured timeout; a failure that shows the connection
    /// broken (see `breaks_connection`) drops it.
    pub async fn run<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RedisError> {
        let mut span = trace::span("redis", trace::Kind::Client);
        span.attribute("db.operation.name", || command_name(cmd));
        let Some(mut connection) = self.inner.connection.read().await.clone() else {
            metrics::counter!(telemetry::REDIS_ERRORS).increment(1);
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            self.inner.health.failed(&RedisError::Disconnected);
            return Err(RedisError::Disconnected);
        };
        let outcome = tokio::time::timeout(self.inner.command_timeout, async {
            // An error reply arrives as a value; as an error it keeps its code (`NOSCRIPT`).
            match connection.run(cmd).await? {
                Value::ServerError(error) => Err(error.into()),
                value => T::from_redis_value(value).map_err(redis::RedisError::from),
            }
        })
        .await;
        let error = match outcome {
            Ok(Ok(value)) => {
                self.answered();
                self.inner.health.answered();
                return Ok(value);
            }
            Ok(Err(error)) => RedisError::Command(error),
            Err(_) => RedisError::Timeout,
        };
        span.failed();
        // Not a failure: `eval` loads the script and calls again.
        if is_unknown_script(&error) {
            return Err(error);
        }
        metrics::counter!(telemetry::REDIS_ERRORS).increment(1);
        self.inner.health.failed(&error);
        if self.breaks_connection(&error) {
            *self.inner.connection.write().await = None;
            self.lost(&error);
        } else {
            tracing::debug!(%error, "redis command failed; the connection is kept");
        }
        Err(error)
    }

    /// Records that Redis answered just now.
    fn answered(&self) {
        let ms = u64::try_from(elapsed_since(self.inner.created).as_millis()).unwrap_or(u64::MAX);
        self.inner.answered_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether the connection must be replaced after `error`. A timeout alone does not say
    /// so (a slow answer, or a gateway short of CPU) unless Redis has answered nothing for
    /// `unresponsive_after`; an error Redis itself replied with proves the connection alive.
    fn breaks_connection(&self, error: &RedisError) -> bool {
        match error {
            RedisError::Disconnected => false,
            RedisError::Timeout => self.unresponsive(),
            RedisError::Command(error) if error.is_timeout() => self.unresponsive(),
            RedisError::Command(error) => error.is_unrecoverable_error(),
        }
    }

    fn unresponsive(&self) -> bool {
        let answered = Duration::from_millis(self.inner.answered_ms.load(Ordering::Relaxed));
        elapsed_since(self.inner.created).saturating_sub(answered) >= self.inner.unresponsive_after
    }

    /// Connects whenever disconnected, until `shutdown`.
    pub async fn keep_connected(self, interval: Duration, shutdown: CancellationToken) {
        loop {
            if !self.is_connected().await {
                self.connect().await;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// Probes Redis every `interval` until `shutdown`, keeping `is_up` and
    /// `flashgate_redis_up` true to what commands meet.
    pub async fn keep_probed(self, interval: Duration, shutdown: CancellationToken) {
        loop {
            self.check_health().await;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// One probe: up when it succeeds and the commands since the last one did not all
    /// fail. Without a connection Redis is down already (`keep_connected` reconnects).
    pub async fn check_health(&self) {
        let Some(mut connection) = self.inner.connection.read().await.clone() else {
            self.inner.health.set(false);
            metrics::gauge!(telemetry::REDIS_UP).set(0.0);
            return;
        };
        let probed = self.probe(&mut connection).await;
        let failing = self.inner.health.commands_failing();
        match probed {
            Ok(()) if !failing => {
                if !self.is_up() {
                    self.back();
                }
            }
            Ok(()) => self.lost(&"commands failed and none was answered"),
            Err(error) => {
                metrics::counter!(telemetry::REDIS_ERRORS).increment(1);
                self.lost(&error);
            }
        }
    }

    /// The probe, bounded by the command timeout.
    async fn probe(&self, connection: &mut Connection) -> RedisResult<()> {
        let timeout = self.inner.command_timeout;
        match tokio::time::timeout(timeout, connection.probe()).await {
            Ok(Ok(())) => {
                self.answered();
                Ok(())
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err((redis::ErrorKind::Io, "health probe timed out").into()),
        }
    }

    /// One connection attempt; failure is counted and leaves the handle disconnected. A
    /// connection made counts as up only once the probe passes on it.
    pub async fn connect(&self) {
        let Some(client) = self.inner.client.as_ref() else {
            return;
        };
        let connecting = client.connect(self.inner.command_timeout);
        let timeout = self.inner.command_timeout * 5;
        let connected = tokio::time::timeout(timeout, connecting)
            .await
            .unwrap_or_else(|_| Err((redis::ErrorKind::Io, "connect timed out").into()));
        match connected {
            Ok(mut connection) => {
                self.answered();
                let probed = self.probe(&mut connection).await;
                *self.inner.connection.write().await = Some(connection);
                match probed {
                    Ok(()) => self.back(),
                    Err(error) => self.lost(&error),
                }
            }
            Err(error) => {
                metrics::counter!(telemetry::REDIS_ERRORS).increment(1);
                tracing::debug!(%error, "redis connect failed; serving from PostgreSQL");
                self.lost(&error);
            }
        }
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Outage> {
        // The state is only log bookkeeping: a panic while holding it leaves it usable.
        self.inner
            .outage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A command or connection attempt failed: warns when Redis was just lost, reminds at
    /// most every `outage_log_interval` while it stays away, and is silent otherwise.
    fn lost(&self, error: &dyn std::fmt::Display) {
        self.inner.health.set(false);
        metrics::gauge!(telemetry::REDIS_UP).set(0.0);
        let now = monotonic();
        let mut outage = self.outage();
        outage.failures += 1;
        let since = *outage.since.get_or_insert(now);
        let due = outage
            .warned_at
            .is_none_or(|at| now.duration_since(at) >= self.inner.outage_log_interval);
        if !due {
            return;
        }
        let refused = self.inner.refused.swap(0, Ordering::Relaxed);
        let failed_calls = std::mem::take(&mut outage.failures) + refused;
        let first = !std::mem::replace(&mut outage.announced, true);
        outage.warned_at = Some(now);
        drop(outage);
        let url = &self.inner.url;
        if first {
            tracing::warn!(
                %url, %error,
                "redis unreachable; serving from PostgreSQL until it is back"
            );
        } else {
            tracing::warn!(
                %url, %error, failed_calls,
                down_seconds = now.duration_since(since).as_secs(),
                "redis still unreachable"
            );
        }
    }

    /// A connection was made: says so when it ends an outage the log announced.
    fn back(&self) {
        self.inner.health.set(true);
        metrics::gauge!(telemetry::REDIS_UP).set(1.0);
        let mut outage = self.outage();
        let since = outage.since.take();
        let announced = std::mem::take(&mut outage.announced);
        let first = !std::mem::replace(&mut outage.ever_connected, true);
        outage.failures = 0;
        drop(outage);
        self.inner.refused.store(0, Ordering::Relaxed);
        let url = &self.inner.url;
        match since {
            Some(since) if announced => tracing::info!(
                %url,
                down_seconds = elapsed_since(since).as_secs(),
                "redis reachable again"
            ),
            _ if first => tracing::info!(%url, "redis connected"),
            _ => tracing::debug!(%url, "redis reconnected after a short outage"),
        }
    }
}

/// A command's name (`EVALSHA`, `XRANGE`), for its span.
fn command_name(cmd: &Cmd) -> String {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => String::from_utf8_lossy(name).into_owned(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    /// A handle that never connects, with `unresponsive_after`.
    fn handle(unresponsive_after: Duration) -> RedisHandle {
        let timeouts = RedisTimeouts {
            command: Duration::from_millis(100),
            unresponsive_after,
        };
        RedisHandle::new(
            "redis://127.0.0.1:1",
            "t:",
            timeouts,
            Duration::from_secs(60),
        )
    }

    fn io_error(kind: io::ErrorKind) -> RedisError {
        RedisError::Command(io::Error::new(kind, "test").into())
    }

    #[test]
    fn a_timeout_keeps_the_connection_while_redis_answered_recently() {
        let redis = handle(Duration::from_secs(3600));
        redis.answered();
        assert!(!redis.breaks_connection(&RedisError::Timeout));
        assert!(!redis.breaks_connection(&io_error(io::ErrorKind::TimedOut)));
    }

    #[test]
    fn timeouts_drop_the_connection_once_redis_answered_nothing_for_long() {
        let redis = handle(Duration::ZERO);
        assert!(redis.breaks_connection(&RedisError::Timeout));
        assert!(redis.breaks_connection(&io_error(io::ErrorKind::TimedOut)));
    }

    #[test]
    fn a_closed_connection_is_dropped_and_a_reply_from_redis_is_not() {
        let redis = handle(Duration::from_secs(3600));
        redis.answered();
        assert!(redis.breaks_connection(&io_error(io::ErrorKind::ConnectionReset)));
        assert!(redis.breaks_connection(&io_error(io::ErrorKind::UnexpectedEof)));
        let script_failed = (
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "script failed",
        );
        assert!(!redis.breaks_connection(&RedisError::Command(script_failed.into())));
        assert!(!redis.breaks_connection(&RedisError::Disconnected));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_drops_the_connection_once_unresponsive_after_passed_without_an_answer() {
        let redis = handle(Duration::from_secs(5));
        redis.answered();
        tokio::time::advance(Duration::from_millis(4_999)).await;
        assert!(
            !redis.breaks_connection(&RedisError::Timeout),
            "answered 4.999 s ago"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            redis.breaks_connection(&RedisError::Timeout),
            "nothing for 5 s"
        );
        redis.answered();
        assert!(
            !redis.breaks_connection(&RedisError::Timeout),
            "an answer starts it again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_announced_then_reminded_at_most_once_an_interval() {
        let redis = handle(Duration::from_secs(3600));
        let interval = redis.inner.outage_log_interval;
        redis.lost(&"refused");
        let announced = redis.outage().warned_at.expect("announced at once");
        tokio::time::advance(interval - Duration::from_millis(1)).await;
        redis.lost(&"refused");
        assert_eq!(redis.outage().warned_at, Some(announced), "no reminder yet");
        assert_eq!(redis.outage().failures, 1, "kept for the reminder");
        tokio::time::advance(Duration::from_millis(1)).await;
        redis.lost(&"refused");
        let outage = redis.outage();
        assert_eq!(outage.warned_at, Some(announced + interval), "reminded");
        assert_eq!(outage.failures, 0, "the reminder reported them");
    }
}
