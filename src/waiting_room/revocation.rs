//! Revoked passes, known in memory on every instance.
//!
//! Passes are checked in memory, so ending a session must reach every instance's memory.
//! A revocation (`WaitingRoom::revoke`) appends the pass id and its expiry to one Redis
//! stream; each instance reads the stream from where it stopped every
//! `waiting_room.revocation_poll_ms` and keeps the ids until the passes would have expired
//! anyway. The revoking instance knows at once, the others within one poll. A stream rather
//! than pub/sub: an instance that was disconnected catches up from its last id, and a new
//! one reads the whole (trimmed to `revocations_max`) stream at start.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio_util::sync::CancellationToken;

use super::WaitingRoom;
use crate::redis_link::RedisError;
use crate::shutdown::Every;

/// The stream, under `redis.key_prefix`.
pub const STREAM_KEY: &str = "wr:revoked";

/// Entries read per poll; a longer backlog is read over the following polls.
const READ_COUNT: usize = 1000;

/// Pass ids revoked before their expiry, with that expiry (unix ms); cheap to clone.
#[derive(Clone, Default)]
pub struct Revoked(Arc<DashMap<String, i64>>);

impl Revoked {
    /// Keeps `pass_id` refused until `until_ms` at least: a later entry for the same pass
    /// (a repeated revocation) can only extend how long it is kept, never shorten it.
    pub fn insert(&self, pass_id: &str, until_ms: i64) {
        self.0
            .entry(pass_id.to_owned())
            .and_modify(|kept| *kept = (*kept).max(until_ms))
            .or_insert(until_ms);
    }

    pub fn contains(&self, pass_id: &str) -> bool {
        self.0.contains_key(pass_id)
    }

    /// Every pass id still refused, with how long (unix ms): the feed an edge follows.
    pub fn entries(&self) -> Vec<(String, i64)> {
        self.0
            .iter()
            .map(|entry| (entry.key().clone(), *entry.value()))
            .collect()
    }

    /// Forgets passes that have expired by themselves.
    fn forget_expired(&self, now_ms: i64) {
        self.0.retain(|_, until| *until >= now_ms);
    }
}

/// One stream entry: its id and its field/value pairs.
type Entry = (String, Vec<String>);

/// Appends a revoked pass to the stream, trimmed to about `revocations_max` entries.
pub(super) async fn announce(
    room: &WaitingRoom,
    deal_id: &str,
    pass_id: &str,
    until_ms: i64,
) -> Result<(), RedisError> {
    let cmd = redis::cmd("XADD")
        .arg(room.redis.key(STREAM_KEY))
        .arg("MAXLEN")
        .arg("~")
        .arg(room.settings.revocations_max)
        .arg("*")
        .arg("deal")
        .arg(deal_id)
        .arg("pass")
        .arg(pass_id)
        .arg("until")
        .arg(until_ms)
        .clone();
    room.redis.run::<String>(&cmd).await.map(drop)
}

/// Follows the revocation stream until `shutdown`.
pub async fn follow(room: WaitingRoom, shutdown: CancellationToken) {
    let interval = Duration::from_millis(room.settings.revocation_poll_ms);
    let mut every = Every::new(interval, shutdown);
    let key = room.redis.key(STREAM_KEY);
    let mut last = "0".to_owned();
    while every.tick().await {
        let start = format!("({last}");
        let cmd = redis::cmd("XRANGE")
            .arg(&key)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(READ_COUNT)
            .clone();
        let entries: Vec<Entry> = match room.redis.run(&cmd).await {
            Ok(entries) => entries,
            Err(error) => {
                tracing::debug!(%error, "revocations not read; retrying");
                continue;
            }
        };
        for (id, fields) in entries {
            if let Some((pass, until)) = parse(&fields) {
                room.revoked.insert(pass, until);
            }
            last = id;
        }
        room.revoked
            .forget_expired(room.clock().now().timestamp_millis());
    }
}

/// The pass id and expiry of an entry written by the revoke script.
fn parse(fields: &[String]) -> Option<(&str, i64)> {
    let value = |name: &str| {
        fields
            .chunks_exact(2)
            .find(|pair| pair[0] == name)
            .map(|pair| pair[1].as_str())
    };
    Some((value("pass")?, value("until")?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_and_expired_ids_are_forgotten() {
        let fields: Vec<String> = ["deal", "d1", "pass", "t1", "until", "1000"]
            .map(String::from)
            .to_vec();
        assert_eq!(parse(&fields), Some(("t1", 1000)));
        assert_eq!(parse(&fields[..4]), None);
        let revoked = Revoked::default();
        revoked.insert("t1", 1000);
        revoked.insert("t2", 3000);
        revoked.forget_expired(2000);
        assert!(!revoked.contains("t1") && revoked.contains("t2"));
    }

    #[test]
    fn a_repeated_revocation_never_shortens_how_long_a_pass_is_refused() {
        let revoked = Revoked::default();
        revoked.insert("t1", 5000);
        revoked.insert("t1", 1500);
        revoked.forget_expired(2000);
        assert!(revoked.contains("t1"));
        revoked.insert("t1", 9000);
        revoked.forget_expired(6000);
        assert!(revoked.contains("t1"));
        revoked.forget_expired(9001);
        assert!(!revoked.contains("t1"));
    }
}
