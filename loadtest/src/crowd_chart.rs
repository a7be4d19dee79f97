//! The crowd rehearsals as one SVG chart: load per second against the crowd's size, both
//! on log scales, so a flat line is load that does not grow with the crowd.

use serde_json::Value;

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// (label, colour, where in a result, dashed).
const SERIES: [(&str, &str, &str, bool); 5] = [
    (
        "crowd's public polls (modelled)",
        "#888888",
        "crowd_public_polls_per_second_modelled",
        true,
    ),
    (
        "public requests at the edge",
        "#1f77b4",
        "edge_public_requests_per_second",
        false,
    ),
    (
        "public requests at the origin",
        "#2ca02c",
        "origin_public_per_second",
        false,
    ),
    (
        "ticket polls at the origin",
        "#d62728",
        "origin_personal_per_second",
        false,
    ),
    (
        "Redis commands",
        "#9467bd",
        "redis_commands_per_second",
        false,
    ),
];

fn x_of(tickets: f64, min: f64, max: f64) -> f64 {
    let span = (max.log10() - min.log10()).max(1e-9);
    LEFT + (tickets.log10() - min.log10()) / span * (WIDTH - LEFT - RIGHT)
}

fn y_of(value: f64) -> f64 {
    // 0.1/s to 1,000,000/s.
    let v = value.max(0.1).log10();
    TOP + (6.0 - v) / 7.0 * (HEIGHT - TOP - BOTTOM)
}

/// The chart of `runs` (results of `crowd --out`), sorted by crowd size.
pub fn svg(runs: &[Value]) -> String {
    let mut runs: Vec<&Value> = runs.iter().collect();
    runs.sort_by_key(|r| r["tickets"].as_u64().unwrap_or(0));
    let sizes: Vec<f64> = runs
        .iter()
        .map(|r| r["tickets"].as_f64().unwrap_or(1.0))
        .collect();
    let min = sizes.first().copied().unwrap_or(1.0) / 1.5;
    let max = sizes.last().copied().unwrap_or(10.0) * 1.5;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="22" font-size="15">A line behind the edge: load per second against the crowd waiting</text>
"#
    );
    for power in -1..=6 {
        let y = y_of(10f64.powi(power));
        let label = if power < 0 {
            "0.1".to_owned()
        } else {
            format_count(10f64.powi(power))
        };
        out += &format!(
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e5e5e5\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}/s</text>\n",
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0
        );
    }
    for (size, run) in sizes.iter().zip(&runs) {
        let x = x_of(*size, min, max);
        let hit = run["measured"]["edge_hit_ratio"].as_f64().unwrap_or(0.0) * 100.0;
        out += &format!(
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{TOP}\" y2=\"{}\" stroke=\"#e5e5e5\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{} waiting</text><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#1f77b4\">edge hits {hit:.2} %</text>\n",
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 16.0,
            format_count(*size),
            HEIGHT - BOTTOM + 32.0
        );
    }
    for (i, (label, colour, field, dashed)) in SERIES.iter().enumerate() {
        let points: Vec<String> = sizes
            .iter()
            .zip(&runs)
            .map(|(size, run)| {
                let value = run["measured"][field].as_f64().unwrap_or(0.0);
                format!("{:.1},{:.1}", x_of(*size, min, max), y_of(value))
            })
            .collect();
        let dash = if *dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        out += &format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2.5\"{dash}/>\n",
            points.join(" ")
        );
        for point in &points {
            let (x, y) = point.split_once(',').unwrap_or(("0", "0"));
            out += &format!("<circle cx=\"{x}\" cy=\"{y}\" r=\"3.5\" fill=\"{colour}\"/>\n");
        }
        let ly = TOP + 20.0 + i as f64 * 22.0;
        let lx = WIDTH - RIGHT + 14.0;
        out += &format!(
            "<line x1=\"{lx}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"2.5\"{dash}/><text x=\"{}\" y=\"{}\">{label}</text>\n",
            lx + 20.0,
            lx + 26.0,
            ly + 4.0
        );
    }
    out += "</svg>\n";
    out
}

fn format_count(n: f64) -> String {
    match n {
        n if n >= 1e6 => format!("{}M", n / 1e6),
        n if n >= 1e3 => format!("{}k", n / 1e3),
        n => format!("{n}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn draws_one_point_per_run_and_series() {
        let run = |n: u64| {
            json!({"tickets": n, "measured": {"edge_hit_ratio": 0.99,
            "origin_public_per_second": 1.0, "redis_commands_per_second": 900.0}})
        };
        let svg = super::svg(&[run(1_000_000), run(10_000)]);
        assert_eq!(svg.matches("<circle").count(), 10);
        assert!(svg.contains("10k waiting") && svg.contains("1M waiting"));
    }
}
