//! `/metrics` in the OpenMetrics text format, for a scraper that asks for it (`Accept:
//! application/openmetrics-text`), with exemplars on the request-latency histogram: the
//! trace id of a recent traced request in each bucket, so a slow bucket on a dashboard
//! leads to a trace.
//!
//! The Prometheus exporter writes only the classic text format and has no exemplars, so
//! its output is rewritten here: counter families are named without `_total` in `# TYPE`
//! and `# HELP` (their samples keep it), and the exposition ends with `# EOF`. Exemplars
//! come only from requests whose trace was exported, so each one names a trace the
//! collector has; recording one is a map write on an exported trace, never on the hot path.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

use super::{HTTP_DURATION, LATENCY_BUCKETS_SECONDS};

/// What a scraper asking for OpenMetrics is answered with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One exemplar: the trace, the request's duration and when it was answered.
#[derive(Clone)]
struct Exemplar {
    trace_id: String,
    seconds: f64,
    unix_seconds: f64,
}

/// The latest exemplar per route and bucket (index into the buckets, `len` for `+Inf`):
/// bounded by routes × buckets.
fn exemplars() -> &'static Mutex<HashMap<(String, usize), Exemplar>> {
    static EXEMPLARS: OnceLock<Mutex<HashMap<(String, usize), Exemplar>>> = OnceLock::new();
    EXEMPLARS.get_or_init(Mutex::default)
}

/// Keeps the exported trace `trace_id` as the exemplar of `route`'s latency bucket.
pub fn record_exemplar(route: &str, seconds: f64, trace_id: String, unix_seconds: f64) {
    let bucket = LATENCY_BUCKETS_SECONDS
        .iter()
        .position(|le| seconds <= *le)
        .unwrap_or(LATENCY_BUCKETS_SECONDS.len());
    let exemplar = Exemplar {
        trace_id,
        seconds,
        unix_seconds,
    };
    exemplars()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((route.to_owned(), bucket), exemplar);
}

/// The classic text exposition `text` as OpenMetrics, with the exemplars.
pub fn render(text: &str) -> String {
    let counters: HashSet<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let exemplars = exemplars()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut out = String::with_capacity(text.len() + 1024);
    // OpenMetrics allows no blank line; the classic format puts one between families.
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        match line.strip_prefix('#') {
            Some(comment) => out.push_str(&comment_line(comment, &counters)),
            None => {
                out.push_str(&sample_line(line, &counters));
                if let Some(exemplar) = exemplar_of(line, &exemplars) {
                    out.push_str(&exemplar);
                }
            }
        }
        out.push('\n');
    }
    out.push_str("# EOF\n");
    out
}

/// A `# HELP` or `# TYPE` line with a counter's family named without `_total`.
fn comment_line(comment: &str, counters: &HashSet<&str>) -> String {
    let mut words = comment.trim_start().splitn(3, ' ');
    let (Some(kind), Some(name)) = (words.next(), words.next()) else {
        return format!("#{comment}");
    };
    let rest = words.next().unwrap_or_default();
    let rest = if kind == "TYPE" && rest == "untyped" {
        "unknown"
    } else {
        rest
    };
    let family = match counters.contains(name) {
        true => name.strip_suffix("_total").unwrap_or(name),
        false => name,
    };
    format!("# {kind} {family} {rest}")
}

/// A sample line; a counter sample whose name lacks `_total` gets it, as OpenMetrics asks.
fn sample_line(line: &str, counters: &HashSet<&str>) -> String {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if counters.contains(name) && !name.ends_with("_total") {
        return format!("{name}_total{}", &line[name_end..]);
    }
    line.to_owned()
}

/// ` # {trace_id="…"} value timestamp` for a latency bucket line that has an exemplar.
fn exemplar_of(line: &str, exemplars: &HashMap<(String, usize), Exemplar>) -> Option<String> {
    let labels = line.strip_prefix(HTTP_DURATION)?.strip_prefix("_bucket{")?;
    let labels = &labels[..labels.rfind('}')?];
    let route = label(labels, "route")?;
    let le = label(labels, "le")?;
    let bucket = match le {
        "+Inf" => LATENCY_BUCKETS_SECONDS.len(),
        le => {
            let le: f64 = le.parse().ok()?;
            LATENCY_BUCKETS_SECONDS.iter().position(|b| *b == le)?
        }
    };
    let exemplar = exemplars.get(&(route.to_owned(), bucket))?;
    Some(format!(
        " # {{trace_id=\"{}\"}} {} {:.3}",
        exemplar.trace_id, exemplar.seconds, exemplar.unix_seconds
    ))
}

/// The value of `name` in a label list (`a="x",b="y"`); values here hold no quotes.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split("\",").find_map(|pair| {
        let (key, value) = pair.split_once("=\"")?;
        (key == name).then(|| value.trim_end_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_lose_total_in_their_family_name_and_the_exposition_ends_with_eof() {
        let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n\
                    # TYPE b counter\nb 1\n# TYPE g gauge\ng 2\n";
        let rendered = render(text);
        assert_eq!(
            rendered,
            "# HELP a Things.\n# TYPE a counter\na_total{x=\"1\"} 3\n\
             # TYPE b counter\nb_total 1\n# TYPE g gauge\ng 2\n# EOF\n"
        );
    }

    #[test]
    fn a_latency_bucket_carries_the_exemplar_recorded_for_it() {
        record_exemplar("/exemplar/{id}", 0.004, "abcd".into(), 1_800_000_000.5);
        let le = LATENCY_BUCKETS_SECONDS
            .iter()
            .find(|b| 0.004 <= **b)
            .unwrap();
        let line = format!("{HTTP_DURATION}_bucket{{route=\"/exemplar/{{id}}\",le=\"{le}\"}} 7");
        let rendered = render(&format!("# TYPE {HTTP_DURATION} histogram\n{line}\n"));
        assert!(
            rendered.contains(&format!(
                "{line} # {{trace_id=\"abcd\"}} 0.004 1800000000.500"
            )),
            "{rendered}"
        );
    }
}
