//! The sale timeline as a self-contained SVG: three panels sharing the time axis —
//! responses per second (and orders created), latency p50/p99, and units still available.

use std::fmt::Write;

use crate::sale::Slot;

const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 170.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;

struct Series<'a> {
    name: &'a str,
    color: &'a str,
    values: Vec<f64>,
}

/// Renders `timeline` (one slot per second) with `title` on top.
pub fn svg(title: &str, timeline: &[Slot]) -> String {
    let panels: [(&str, Vec<Series>); 3] = [
        (
            "per second",
            vec![
                Series {
                    name: "responses",
                    color: "#1f77b4",
                    values: timeline.iter().map(|s| s.responses as f64).collect(),
                },
                Series {
                    name: "orders created",
                    color: "#2ca02c",
                    values: timeline.iter().map(|s| s.created as f64).collect(),
                },
            ],
        ),
        (
            "latency ms",
            vec![
                Series {
                    name: "p50",
                    color: "#ff7f0e",
                    values: timeline.iter().map(|s| s.p50_us as f64 / 1000.0).collect(),
                },
                Series {
                    name: "p99",
                    color: "#d62728",
                    values: timeline.iter().map(|s| s.p99_us as f64 / 1000.0).collect(),
                },
            ],
        ),
        (
            "units available",
            vec![Series {
                name: "available",
                color: "#9467bd",
                values: timeline.iter().map(|s| s.available.max(0) as f64).collect(),
            }],
        ),
    ];
    let height = TOP + PANEL_HEIGHT * panels.len() as f64 + 30.0;
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
    for (index, (label, series)) in panels.iter().enumerate() {
        panel(
            &mut out,
            TOP + PANEL_HEIGHT * index as f64,
            label,
            series,
            timeline.len(),
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds since start</text>"#,
        WIDTH / 2.0,
        height - 8.0
    );
    out.push_str("</svg>\n");
    out
}

fn panel(out: &mut String, y0: f64, label: &str, series: &[Series], slots: usize) {
    let plot_height = PANEL_HEIGHT - 40.0;
    let plot_width = WIDTH - LEFT - RIGHT;
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let x = |i: usize| LEFT + plot_width * (i as f64 + 0.5) / slots.max(1) as f64;
    let y = |v: f64| y0 + 10.0 + plot_height * (1.0 - v / max);
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{}" width="{plot_width}" height="{plot_height}" fill="none" stroke="#999"/>"##,
        y0 + 10.0
    );
    let _ = writeln!(
        out,
        r#"<text x="8" y="{}">{}</text><text x="8" y="{}">{:.0}</text><text x="8" y="{}">0</text>"#,
        y0 + 10.0 + plot_height / 2.0,
        escape(label),
        y0 + 20.0,
        max,
        y0 + 10.0 + plot_height
    );
    for (n, s) in series.iter().enumerate() {
        let points: Vec<String> = s
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
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
            y0 + 26.0,
            s.color,
            escape(s.name)
        );
    }
    for tick in (0..slots).step_by((slots / 10).max(1)) {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{tick}</text>"#,
            x(tick),
            y0 + plot_height + 24.0
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series() {
        let slots = vec![
            Slot {
                responses: 100,
                created: 40,
                p50_us: 2_000,
                p99_us: 9_000,
                available: 60,
            },
            Slot {
                responses: 120,
                created: 60,
                p50_us: 2_500,
                p99_us: 11_000,
                available: 0,
            },
        ];
        let svg = svg("sale <1>", &slots);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 5);
        assert!(svg.contains("sale &lt;1&gt;"));
    }
}
