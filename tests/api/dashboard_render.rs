//! `scripts/dashboard.py` draws every panel of the Grafana dashboard from a gateway's own
//! `/metrics`: recorded during the dashboard test's small sale, rendered into one page
//! that holds a chart for each panel, with lines where the sale made traffic.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::helpers::{ChildGuard, EVENTUALLY, crate_root, unique_suffix, wait_until};
use crate::ops_dashboard::{sale_app, small_sale};

const DASHBOARD: &str = include_str!("../../config/grafana/flashgate.json");

/// Panels the small sale certainly feeds.
const BUSY_PANELS: [&str; 4] = [
    "Requests/s by status",
    "Reservations/s by outcome",
    "Stock per deal",
    "p99 latency by route",
];

fn script() -> Command {
    let mut command = Command::new("python3");
    command.arg(crate_root().join("scripts/dashboard.py"));
    command
}

/// How many whole scrapes the recorder has written so far (one JSON line each).
fn scrapes_in(path: &std::path::Path) -> usize {
    let written = std::fs::read_to_string(path).unwrap_or_default();
    written.matches('\n').count()
}

/// The HTML of one panel: from its heading to the next panel's.
fn section<'a>(page: &'a str, title: &str) -> &'a str {
    let heading = format!("<h3>{}</h3>", title.replace('&', "&amp;"));
    let start = page
        .find(&heading)
        .unwrap_or_else(|| panic!("no panel {title:?} on the page"));
    let end = page[start..]
        .find("</section>")
        .map_or(page.len(), |e| start + e);
    &page[start..end]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_panel_is_drawn_from_a_recorded_sale() {
    // Arrange
    let dir = std::env::temp_dir().join(format!("fgtest-dashboard-{}", unique_suffix()));
    let scrapes = dir.join("scrapes.jsonl");
    let page = dir.join("index.html");
    let app = sale_app().await;
    let mut recorder = ChildGuard {
        child: script()
            .args(["record", "--metrics-url", &app.url("/metrics")])
            .args(["--seconds", "300", "--interval", "0.5", "--out"])
            .arg(&scrapes)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start scripts/dashboard.py record"),
    };

    // Act
    small_sale(&app).await;
    // Two more scrapes, so that one was certainly taken after the sale.
    let recorded = scrapes_in(&scrapes);
    wait_until("a scrape after the sale", EVENTUALLY, || async {
        scrapes_in(&scrapes) >= recorded + 2
    })
    .await;
    recorder.kill();
    let rendered = script()
        .args(["render", "--scrapes"])
        .arg(&scrapes)
        .arg("--out")
        .arg(&page)
        .output()
        .expect("run scripts/dashboard.py render");
    app.cleanup().await;

    // Assert
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let html = std::fs::read_to_string(&page).expect("the rendered page");
    let _ = std::fs::remove_dir_all(&dir);
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .expect("a list of panels")
        .iter()
        .filter(|panel| panel["type"] != "row")
        .map(|panel| panel["title"].as_str().expect("a title"))
        .collect();
    assert_eq!(
        html.matches("<section class=\"panel\">").count(),
        titles.len()
    );
    for title in &titles {
        section(&html, title);
    }
    for title in BUSY_PANELS {
        assert!(
            section(&html, title).contains("<polyline"),
            "{title}: {}",
            section(&html, title)
        );
    }
}
