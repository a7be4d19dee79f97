//! The one shutdown path: SIGTERM or SIGINT cancels a token that the server and every
//! background task watch.

use std::future::Future;

use tokio_util::sync::CancellationToken;

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
