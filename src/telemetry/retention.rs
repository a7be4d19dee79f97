//! Series of deals that ended or were deleted leave `/metrics`.
//!
//! Without this the `deal` label grows with every deal ever sold, in the exporter's memory
//! and in Prometheus. The exporter can only drop series that went idle, for every series
//! of a kind alike; so every counter and gauge handle passes through [`Retaining`], which
//! remembers its key. Before each render every remembered key is touched (its generation
//! moves without its value changing); keys of retired deals are forgotten, not touched,
//! and the exporter's idle timeout drops them at the next render. Histograms carry no deal
//! label and are never dropped.

use std::collections::BTreeSet;
use std::sync::Arc;

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
}

impl Retention {
    /// Moves every remembered series' generation, so the idle timeout spares it.
    pub fn touch(&self) {
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
