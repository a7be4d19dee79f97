//! Series of deals that ended or were deleted leave `/metrics`.
//!
//! Without this the `deal` label grows with every deal ever sold, in the exporter's memory
//! and in Prometheus. The exporter can only drop series that went idle, for every series
//! of a kind alike; so every counter and gauge handle passes through [`Retaining`], which
//! remembers its key. Before each render every remembered key is touched (its generation
//! moves without its value changing); keys of retired deals are forgotten, not touched,
//! and the exporter's idle timeout drops them at the next render. Histograms carry no deal
//! label and are never dropped.
//!
//! Renders take turns: the exporter drops a series whose generation did not move since the
//! render before, so two scrapers at once (two Prometheus replicas, say) could otherwise
//! touch, touch, render, render, and the second render would find every series unmoved
//! since the first and drop them all, for good: their handles live on here, orphaned.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::PrometheusRecorder;

/// The label that names a deal on every per-deal series.
const DEAL_LABEL: &str = "deal";

#[derive(Clone)]
enum Handle {
    Counter(Counter),
    Gauge(Gauge),
}

/// The counter and gauge handles handed out, by key.
#[derive(Default)]
pub struct Retention {
    handles: DashMap<Key, Handle>,
    /// Held from the touch to the end of the render it precedes.
    rendering: Mutex<()>,
}

impl Retention {
    /// Touches every remembered series, then runs `render`, one render at a time.
    pub fn rendered(&self, render: impl FnOnce() -> String) -> String {
        let _turn = self
            .rendering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.touch();
        render()
    }

    /// Moves every remembered series' generation, so the idle timeout spares it.
    fn touch(&self) {
        for entry in &self.handles {
            match entry.value() {
                Handle::Counter(counter) => counter.increment(0),
                Handle::Gauge(gauge) => gauge.increment(0.0),
            }
        }
    }

    /// The deals that have series.
    pub fn deals(&self) -> BTreeSet<String> {
        self.handles
            .iter()
            .filter_map(|entry| deal_of(entry.key()).map(str::to_owned))
            .collect()
    }

    /// Forgets every series of these deals; they leave `/metrics` at the next render
    /// unless recorded again.
    pub fn retire(&self, deals: &BTreeSet<String>) {
        self.handles
            .retain(|key, _| deal_of(key).is_none_or(|deal| !deals.contains(deal)));
    }
}

fn deal_of(key: &Key) -> Option<&str> {
    key.labels()
        .find(|label| label.key() == DEAL_LABEL)
        .map(|label| label.value())
}

/// The Prometheus recorder, remembering the counter and gauge handles it hands out.
pub struct Retaining {
    pub inner: PrometheusRecorder,
    pub retention: Arc<Retention>,
}

impl Recorder for Retaining {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if let Some(Handle::Counter(counter)) = self.retention.handles.get(key).as_deref() {
            return counter.clone();
        }
        let counter = self.inner.register_counter(key, metadata);
        self.retention
            .handles
            .insert(key.clone(), Handle::Counter(counter.clone()));
        counter
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if let Some(Handle::Gauge(gauge)) = self.retention.handles.get(key).as_deref() {
            return gauge.clone();
        }
        let gauge = self.inner.register_gauge(key, metadata);
        self.retention
            .handles
            .insert(key.clone(), Handle::Gauge(gauge.clone()));
        gauge
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(key, metadata)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use metrics_exporter_prometheus::PrometheusBuilder;
    use metrics_util::MetricKindMask;

    use super::*;

    /// Longer than the idle timeout below: the exporter's clock must see it pass.
    const IDLE_MS: u64 = 1;
    const PAST_IDLE: Duration = Duration::from_millis(3);
    /// How long the first scraper waits for the second to finish before rendering anyway
    /// (with renders taking turns the second cannot finish first).
    const TURN_WAIT: Duration = Duration::from_millis(100);

    #[test]
    fn a_scrape_that_overtakes_another_drops_no_live_series() {
        let inner = PrometheusBuilder::new()
            .idle_timeout(
                MetricKindMask::COUNTER | MetricKindMask::GAUGE,
                Some(Duration::from_millis(IDLE_MS)),
            )
            .build_recorder();
        let handle = inner.handle();
        let retaining = Retaining {
            inner,
            retention: Arc::new(Retention::default()),
        };
        metrics::with_local_recorder(&retaining, || {
            metrics::counter!("fg_sold_total").increment(1);
        });
        let (touched_tx, touched_rx) = mpsc::channel();
        let (overtaken_tx, overtaken_rx) = mpsc::channel();

        // The first scraper touches, then lingers; the second scrapes in full meanwhile if
        // it may, and the first renders once the idle timeout has passed since.
        let (retention, exporter) = (&retaining.retention, &handle);
        let (first, second) = std::thread::scope(|scope| {
            let first = scope.spawn(move || {
                retention.rendered(|| {
                    touched_tx.send(()).expect("the second scraper listens");
                    let _ = overtaken_rx.recv_timeout(TURN_WAIT);
                    std::thread::sleep(PAST_IDLE);
                    exporter.render()
                })
            });
            touched_rx.recv().expect("the first scraper touched");
            let second = retaining.retention.rendered(|| handle.render());
            let _ = overtaken_tx.send(());
            (first.join().expect("the first scraper"), second)
        });
        std::thread::sleep(PAST_IDLE);
        let third = retaining.retention.rendered(|| handle.render());

        for (scrape, text) in [("first", first), ("second", second), ("third", third)] {
            assert!(
                text.contains("fg_sold_total 1"),
                "the {scrape} scrape lost the series:\n{text}"
            );
        }
    }
}
