//! Announcing a change to every instance at once, over Redis publish/subscribe.
//!
//! Shared state in Redis is otherwise read on each instance's own schedule, so a change
//! made through one instance is seen by the others up to a refresh later. A message on a
//! channel only wakes them early: it carries no state, each listener reads what changed
//! the way it always does. So a message lost (Redis away, a connection dropped) costs only
//! that wait, and a listener that (re)connects wakes once, for what it may have missed.
//! An idle listener sends Redis nothing.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::RedisHandle;

impl RedisHandle {
    /// Publishes `message` on `channel` (under the key prefix). A message Redis did not
    /// take is only logged: listeners still read the change at their next refresh.
    pub async fn announce(&self, channel: &str, message: &str) {
        let publish = redis::cmd("PUBLISH")
            .arg(self.key(channel))
            .arg(message)
            .clone();
        if let Err(error) = self.run::<i64>(&publish).await {
            tracing::debug!(%error, channel, "change not announced");
        }
    }

    /// Listens on `channel` (under the key prefix) until `shutdown`, waking `heard` on each
    /// message and on each (re)connection. A connection that fails or ends is made again
    /// after `retry`.
    pub async fn follow(
        self,
        channel: &str,
        heard: Arc<Notify>,
        retry: Duration,
        shutdown: CancellationToken,
    ) {
        let channel = self.key(channel);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.listen(&channel, &heard) => {}
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(retry) => {}
            }
        }
    }

    /// One connection's life: subscribes, then wakes `heard` for every message until the
    /// connection ends.
    async fn listen(&self, channel: &str, heard: &Notify) {
        let Some(target) = self.inner.client.as_ref() else {
            return std::future::pending().await;
        };
        let timeout = self.inner.command_timeout;
        let subscribed = tokio::time::timeout(timeout * 5, async {
            let mut listener = target.listener().await?;
            listener.subscribe(channel).await?;
            Ok::<_, redis::RedisError>(listener)
        })
        .await;
        let mut listener = match subscribed {
            Ok(Ok(listener)) => listener,
            Ok(Err(error)) => {
                tracing::debug!(%error, channel, "not listening for changes");
                return;
            }
            Err(_) => {
                tracing::debug!(channel, "not listening for changes: Redis did not answer");
                return;
            }
        };
        heard.notify_one();
        let mut messages = listener.on_message();
        while messages.next().await.is_some() {
            heard.notify_one();
        }
        tracing::debug!(
            channel,
            "stopped listening for changes; listening again soon"
        );
    }
}
