//! The one shutdown path: SIGTERM or SIGINT cancels a token that the server and every
//! background task watch.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The pace of a periodic background task: a tick every `interval` until `shutdown`. A
/// tick that comes late (a slow round, a busy runtime) delays the next ones rather than
/// firing a burst to catch up.
pub struct Every {
    ticker: tokio::time::Interval,
    shutdown: CancellationToken,
}

impl Every {
    /// The first tick comes at once.
    pub fn new(interval: Duration, shutdown: CancellationToken) -> Self {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { ticker, shutdown }
    }

    /// Waits for the next tick: `false` once shutdown began.
    pub async fn tick(&mut self) -> bool {
        tokio::select! {
            () = self.shutdown.cancelled() => false,
            _ = self.ticker.tick() => true,
        }
    }

    /// The next tick comes at once.
    pub fn reset_immediately(&mut self) {
        self.ticker.reset_immediately();
    }
}

/// Installs the handlers for SIGTERM and SIGINT now, and returns the task that cancels
/// `token` on the first of them. Installing before the gateway announces itself matters: a
/// signal sent as soon as it says it is ready (an operator's Ctrl-C, an orchestrator's
/// SIGTERM) must drain it, not meet the default action and kill it.
#[cfg(unix)]
pub fn cancel_on_signal(
    token: CancellationToken,
) -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutdown signal received; draining");
        token.cancel();
    })
}

/// Ctrl-C alone where there are no Unix signals.
#[cfg(not(unix))]
pub fn cancel_on_signal(
    token: CancellationToken,
) -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    Ok(async move {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown signal received; draining");
        token.cancel();
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_at_once_then_every_interval_until_shutdown() {
        let shutdown = CancellationToken::new();
        let mut every = Every::new(Duration::from_millis(100), shutdown.clone());
        let started = crate::clock::monotonic();

        assert!(every.tick().await);
        assert_eq!(crate::clock::elapsed_since(started), Duration::ZERO);
        assert!(every.tick().await);
        assert_eq!(
            crate::clock::elapsed_since(started),
            Duration::from_millis(100)
        );

        shutdown.cancel();
        assert!(!every.tick().await, "no tick once shutdown began");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_tick_delays_the_next_instead_of_bunching() {
        let mut every = Every::new(Duration::from_millis(100), CancellationToken::new());
        let started = crate::clock::monotonic();
        every.tick().await;
        tokio::time::sleep(Duration::from_millis(350)).await;

        every.tick().await;
        every.tick().await;

        assert_eq!(
            crate::clock::elapsed_since(started),
            Duration::from_millis(450)
        );
    }
}
