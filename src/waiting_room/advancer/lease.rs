//! The advancer's lease, and its sleep while no line has anything to do.
//!
//! One instance at a time holds the lease and moves the lines. When none of them has anyone
//! waiting (passes may still be outstanding), the holder gives the lease up and marks the advancer
//! asleep (`SLEEP`); every instance then stops its `advance_interval_ms` ticks, so an idle
//! gateway sends Redis next to nothing. A join into a line marks the line woken and clears
//! the mark (`WAKE`): the joining instance's own advancer wakes at once, the others within
//! `idle_check_ms`, and the first to renew takes the lease with the woken lines.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::redis_link::{RedisError, RedisHandle};
use crate::waiting_room::WaitingRoom;

/// The advancer's keys under `redis.key_prefix`, in the order the lease scripts expect (see
/// `scripts`). One hash tag: one Redis Cluster slot.
fn keys(redis: &RedisHandle) -> [String; 5] {
    ["lease", "lines_version", "epoch", "woken", "asleep"]
        .map(|name| redis.key(&format!("wr:{{advancer}}:{name}")))
}

/// What a renewal saw.
#[derive(Debug, Default)]
pub(super) struct Renewal {
    pub held: bool,
    /// The lines version: a new one means a new line to read.
    pub version: i64,
    /// Redis's clock, ms.
    pub now_ms: i64,
    pub epoch: i64,
    /// The advancer sleeps: nobody holds the lease until a join wakes it.
    pub asleep: bool,
    /// Deals someone joined since the holder last renewed.
    pub woken: Vec<String>,
}

/// Renews the lease if `token` holds it, takes it if free and the advancer is awake.
pub(super) async fn renew(room: &WaitingRoom, token: &str) -> Result<Renewal, RedisError> {
    let ttl = room.settings.lease_ttl_ms.to_string();
    let keys = keys(&room.redis);
    let (held, version, now_ms, epoch, asleep, woken): (i64, i64, i64, i64, i64, Vec<String>) =
        room.eval_keys(&room.scripts.renew, &keys, &[token, &ttl])
            .await?;
    Ok(Renewal {
        held: held == 1,
        version,
        now_ms,
        epoch,
        asleep: asleep == 1,
        woken,
    })
}

/// Gives the lease up on shutdown, if still `token`'s.
pub(super) async fn resign(room: &WaitingRoom, token: &str) {
    let keys = keys(&room.redis);
    let _ = room
        .eval_keys::<i64>(&room.scripts.resign, &keys[..1], &[token])
        .await;
}

/// Puts the advancer to sleep if `token` holds the lease and no line was woken since its
/// last renewal; true when it sleeps (and the lease is given up).
pub(super) async fn sleep(room: &WaitingRoom, token: &str) -> bool {
    let keys = keys(&room.redis);
    let slept = room
        .eval_keys::<i64>(&room.scripts.sleep, &keys, &[token])
        .await;
    slept.is_ok_and(|slept| slept == 1)
}

/// Someone waits in `deal_id`'s line (`first`: its first ticket ever): wakes the advancer
/// on every instance, this one at once.
pub(in crate::waiting_room) async fn wake(
    room: &WaitingRoom,
    deal_id: &str,
    first: bool,
) -> Result<(), RedisError> {
    let keys = keys(&room.redis);
    let first = if first { "1" } else { "0" };
    room.eval_keys::<i64>(&room.scripts.wake, &keys, &[deal_id, first])
        .await?;
    room.woken.notify_one();
    Ok(())
}

/// Waits while the advancer sleeps: until a join on this instance, a join elsewhere (the
/// asleep mark gone, read every `idle_check_ms`), or `shutdown` (false).
pub(super) async fn doze(room: &WaitingRoom, shutdown: &CancellationToken) -> bool {
    let every = Duration::from_millis(room.settings.idle_check_ms);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = room.woken.notified() => return true,
            () = tokio::time::sleep(every) => {
                if !still_asleep(room).await {
                    return true;
                }
            }
        }
    }
}

/// Whether the asleep mark is still set; an error wakes the advancer, whose next renewal
/// tells.
async fn still_asleep(room: &WaitingRoom) -> bool {
    let asleep = redis::cmd("EXISTS").arg(&keys(&room.redis)[4]).clone();
    room.redis.run::<i64>(&asleep).await.is_ok_and(|n| n == 1)
}
