//! The sale timeline as a self-contained SVG: three panels sharing the time axis —
//! responses and orders created per second, latency p50/p99, and units still available
//! (starting at the stocked amount) — each with labelled, ticked axes. The time axis spans
//! the run's real length, so a sale over in half a second still draws its lines.

use std::fmt::Write;

use crate::timeline::Slot;

const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 190.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
/// Height of the plot inside its panel; the rest holds the tick labels.
const PLOT_HEIGHT: f64 = PANEL_HEIGHT - 50.0;
/// About this many ticks per axis.
const TICKS: f64 = 6.0;

struct Series<'a> {
    name: &'a str,
    color: &'a str,
    /// (seconds since start, value) points joined by straight lines.
    points: Vec<(f64, f64)>,
}

/// The run being drawn: what was stocked, how long it ran, one slot per second, and the
/// stock as sampled during the run (seconds since start, units available), which draws
/// the stock finer than a second when given.
pub struct Run<'a> {
    pub stock: i64,
    pub elapsed_seconds: f64,
    pub timeline: &'a [Slot],
    pub stock_samples: &'a [(f64, i64)],
}

impl Run<'_> {
    /// Length of the time axis: the run's, or its whole seconds when that is unknown.
    fn seconds(&self) -> f64 {
        if self.elapsed_seconds > 0.0 {
            self.elapsed_seconds
        } else {
            self.timeline.len().max(1) as f64
        }
    }

    /// Where slot `i` starts and ends on the time axis (the last may be partial).
    fn span(&self, i: usize) -> (f64, f64) {
        let start = i as f64;
        (start, (start + 1.0).min(self.seconds().max(start + 1e-3)))
    }

    /// A per-slot figure as a step line: level across each slot.
    fn steps(&self, value: impl Fn(&Slot, f64) -> f64) -> Vec<(f64, f64)> {
        let mut points = Vec::new();
        for (i, slot) in self.timeline.iter().enumerate() {
            let (start, end) = self.span(i);
            let v = value(slot, end - start);
            points.extend([(start, v), (end, v)]);
        }
        points
    }

    /// Units available: the stocked amount at the start, then every sample, or each
    /// slot's last sample when the samples are not at hand.
    fn available(&self) -> Vec<(f64, f64)> {
        let mut points = vec![(0.0, self.stock as f64)];
        if !self.stock_samples.is_empty() {
            points.extend(
                self.stock_samples
                    .iter()
                    .map(|(t, units)| (*t, *units as f64)),
            );
            return points;
        }
        for (i, slot) in self.timeline.iter().enumerate() {
            if slot.available >= 0 {
                points.push((self.span(i).1, slot.available as f64));
            }
        }
        points
    }
}

/// Renders the run with `title` on top.
pub fn svg(title: &str, run: &Run) -> String {
    let panels: [(&str, f64, Vec<Series>); 3] = [
        (
            "per second",
            0.0,
            vec![
                Series {
                    name: "responses",
                    color: "#1f77b4",
                    points: run.steps(|s, width| s.responses as f64 / width),
                },
                Series {
                    name: "orders created",
                    color: "#2ca02c",
                    points: run.steps(|s, width| s.created as f64 / width),
                },
            ],
        ),
        (
            "latency (ms)",
            0.0,
            vec![
                Series {
                    name: "p50",
                    color: "#ff7f0e",
                    points: run.steps(|s, _| s.p50_us as f64 / 1000.0),
                },
                Series {
                    name: "p99",
                    color: "#d62728",
                    points: run.steps(|s, _| s.p99_us as f64 / 1000.0),
                },
            ],
        ),
        (
            "units available",
            run.stock as f64,
            vec![Series {
                name: "available",
                color: "#9467bd",
                points: run.available(),
            }],
        ),
    ];
    let height = TOP + PANEL_HEIGHT * panels.len() as f64 + 20.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="18" font-size="14">{}</text>"#,
        escape(title)
    );
    for (index, (label, floor, series)) in panels.iter().enumerate() {
        let y0 = TOP + PANEL_HEIGHT * index as f64;
        panel(&mut out, y0, label, *floor, series, run.seconds());
    }
    out.push_str("</svg>\n");
    out
}

fn panel(out: &mut String, y0: f64, label: &str, floor: f64, series: &[Series], seconds: f64) {
    let plot_width = WIDTH - LEFT - RIGHT;
    let top = y0 + 10.0;
    let y_ticks = ticks(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(floor, f64::max),
    );
    let y_max = *y_ticks.last().unwrap_or(&1.0);
    let x_ticks = ticks(seconds);
    let x_max = *x_ticks.last().unwrap_or(&1.0);
    let x = |t: f64| LEFT + plot_width * t / x_max;
    let y = |v: f64| top + PLOT_HEIGHT * (1.0 - v / y_max);
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_width}" height="{PLOT_HEIGHT}" fill="none" stroke="#999"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        top + PLOT_HEIGHT / 2.0,
        escape(label)
    );
    for &v in &y_ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_width,
            y(v),
            y(v),
            LEFT - 6.0,
            y(v) + 4.0,
            number(v)
        );
    }
    for &t in &x_ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            x(t),
            x(t),
            top + PLOT_HEIGHT,
            top + PLOT_HEIGHT + 5.0,
            x(t),
            top + PLOT_HEIGHT + 18.0,
            number(t)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since start</text>"#,
        LEFT + plot_width / 2.0,
        top + PLOT_HEIGHT + 34.0
    );
    for (n, s) in series.iter().enumerate() {
        let points: Vec<String> = s
            .points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            s.color,
            points.join(" ")
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" fill="{}">{}</text>"#,
            LEFT + 10.0 + 130.0 * n as f64,
            top + 16.0,
            s.color,
            escape(s.name)
        );
    }
}

/// Round tick values from 0 to at least `max`: steps of 1, 2 or 5 times a power of ten.
fn ticks(max: f64) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / TICKS;
    let magnitude = 10_f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= raw)
        .unwrap_or(10.0 * magnitude);
    let count = (max / step - 1e-9).ceil().max(1.0) as usize;
    (0..=count).map(|i| i as f64 * step).collect()
}

/// A tick label: no needless decimals.
fn number(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(responses: u64, created: u64, available: i64) -> Slot {
        Slot {
            responses,
            created,
            p50_us: 2_000,
            p99_us: 9_000,
            available,
        }
    }

    #[test]
    fn renders_every_series_with_labelled_axes() {
        let slots = [slot(100, 40, 60), slot(120, 60, 0)];
        let run = Run {
            stock: 100,
            elapsed_seconds: 1.6,
            timeline: &slots,
            stock_samples: &[],
        };
        let svg = svg("sale <1>", &run);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 5);
        assert!(svg.contains("sale &lt;1&gt;"));
        assert_eq!(svg.matches("seconds since start").count(), 3);
        for label in ["per second", "latency (ms)", "units available"] {
            assert!(svg.contains(label), "{label}");
        }
        // The stock line starts at the stocked amount, at time zero.
        assert!(svg.contains(&format!(r#"points="{LEFT:.1},"#)));
        assert!(svg.contains(">100</text>"), "a tick at the stocked amount");
        assert!(
            svg.contains(">2</text>"),
            "time ticks reach past the end of the run"
        );
    }

    #[test]
    fn a_sub_second_sale_draws_lines() {
        let slots = [slot(500, 10, 0)];
        let run = Run {
            stock: 10,
            elapsed_seconds: 0.4,
            timeline: &slots,
            stock_samples: &[(0.1, 8), (0.25, 3), (0.35, 0)],
        };
        let svg = svg("short", &run);
        for polyline in svg.lines().filter(|l| l.starts_with("<polyline")) {
            let points = polyline.split("points=\"").nth(1).unwrap_or_default();
            assert!(
                points.split(' ').count() >= 2,
                "a line, not a dot: {polyline}"
            );
        }
        assert!(svg.contains(">0.4</text>"), "{svg}");
        let stock_line = svg
            .lines()
            .find(|l| l.contains("#9467bd"))
            .unwrap_or_default();
        assert_eq!(
            stock_line.matches(',').count(),
            4,
            "the stocked amount and three samples: {stock_line}"
        );
        // 500 responses in 0.4 s are 1250 per second.
        assert!(svg.contains(">1400</text>") || svg.contains(">1500</text>"));
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(1.6), [0.0, 0.5, 1.0, 1.5, 2.0]);
        assert_eq!(ticks(100.0), [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let empty = ticks(0.0);
        assert_eq!((empty.len(), empty.last().copied()), (6, Some(1.0)));
    }
}
