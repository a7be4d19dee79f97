//! A sale's timeline, second by second, as a report carries it: written by the sale, read
//! back by the chart.

use serde_json::Value;

/// One second of the sale.
#[derive(Debug, Clone, Default)]
pub struct Slot {
    pub responses: u64,
    pub created: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// Units still available, as last sampled in this second (-1 if not sampled).
    pub available: i64,
}

/// The stock samples back out of a report: (seconds since start, units available).
pub fn stock_samples_from_report(report: &Value) -> Vec<(f64, i64)> {
    report["stock_samples"]
        .as_array()
        .map(|samples| {
            samples
                .iter()
                .filter_map(|s| Some((s[0].as_f64()?, s[1].as_i64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// The timeline back out of a report.
pub fn timeline_from_report(report: &Value) -> Vec<Slot> {
    let number = |slot: &Value, field: &str| slot[field].as_i64().unwrap_or(0);
    report["timeline"]
        .as_array()
        .map(|slots| {
            slots
                .iter()
                .map(|slot| Slot {
                    responses: number(slot, "responses") as u64,
                    created: number(slot, "created") as u64,
                    p50_us: number(slot, "p50_us") as u64,
                    p99_us: number(slot, "p99_us") as u64,
                    available: slot["available"].as_i64().unwrap_or(-1),
                })
                .collect()
        })
        .unwrap_or_default()
}
