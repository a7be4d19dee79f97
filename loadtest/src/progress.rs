//! A live progress line while a sale runs: elapsed time, requests per second over the last
//! moment, the count of each outcome so far, and the units left. Written to stderr, over
//! itself, only when stderr is a terminal, so logs and piped output stay clean.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How often the line is redrawn.
const REFRESH: Duration = Duration::from_millis(250);

/// The running progress line; [`Progress::finish`] ends it.
pub struct Progress {
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Progress {
    /// Starts redrawing the line, if stderr is a terminal. `counts` reads the count of
    /// each outcome so far; `samples` holds the units left as last sampled.
    pub(crate) fn start(
        started: Instant,
        stock: i64,
        counts: impl Fn() -> Vec<(String, u64)> + Send + 'static,
        samples: Arc<Mutex<Vec<(Duration, i64)>>>,
    ) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self { running: None };
        }
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut last = (Instant::now(), 0_u64);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(REFRESH) => {}
                }
                let outcomes = counts();
                let total: u64 = outcomes.iter().map(|(_, n)| n).sum();
                let rate = (total - last.1) as f64 / last.0.elapsed().as_secs_f64().max(1e-3);
                last = (Instant::now(), total);
                let available = samples
                    .lock()
                    .ok()
                    .and_then(|s| s.last().map(|(_, units)| *units));
                let text = line(started.elapsed(), rate, &outcomes, available, stock);
                let mut stderr = std::io::stderr().lock();
                let _ = write!(stderr, "\r{text}\x1b[K");
                let _ = stderr.flush();
            }
            let _ = writeln!(std::io::stderr());
        });
        Self {
            running: Some((stop, task)),
        }
    }

    /// Stops redrawing and leaves the last line on the terminal.
    pub async fn finish(self) {
        if let Some((stop, task)) = self.running {
            let _ = stop.send(());
            let _ = task.await;
        }
    }
}

/// One progress line, e.g. `3.2 s | 5120 req/s | 201: 800, 409: 3000 | stock 200/1000`.
pub fn line(
    elapsed: Duration,
    rate: f64,
    outcomes: &[(String, u64)],
    available: Option<i64>,
    stock: i64,
) -> String {
    let outcomes = if outcomes.is_empty() {
        "no answers yet".to_owned()
    } else {
        outcomes
            .iter()
            .map(|(outcome, n)| format!("{outcome}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let left = available.map_or_else(|| "?".to_owned(), |units| units.to_string());
    format!(
        "{:.1} s | {rate:.0} req/s | {outcomes} | stock {left}/{stock}",
        elapsed.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_rate_outcomes_and_stock() {
        let outcomes = [("201".to_owned(), 800), ("409".to_owned(), 3000)];
        assert_eq!(
            line(
                Duration::from_millis(3210),
                5120.4,
                &outcomes,
                Some(200),
                1000
            ),
            "3.2 s | 5120 req/s | 201: 800, 409: 3000 | stock 200/1000"
        );
        assert_eq!(
            line(Duration::ZERO, 0.0, &[], None, 10),
            "0.0 s | 0 req/s | no answers yet | stock ?/10"
        );
    }
}
