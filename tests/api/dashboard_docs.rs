//! docs/DASHBOARD.md lists every panel of the Grafana dashboard under its row, in the
//! dashboard's order, and nothing else: a panel added, renamed, moved or removed in
//! `config/grafana/flashgate.json` fails here until the list follows.

use serde_json::Value;

const DASHBOARD: &str = include_str!("../../config/grafana/flashgate.json");
const DASHBOARD_DOC: &str = include_str!("../../docs/DASHBOARD.md");

/// (row, panel title) of every panel that is not a row, in order.
fn dashboard_panels() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut row = String::new();
    let mut found = Vec::new();
    for panel in dashboard["panels"].as_array().expect("a list of panels") {
        let title = panel["title"]
            .as_str()
            .expect("every panel has a title")
            .to_owned();
        if panel["type"] == "row" {
            row = title;
        } else {
            found.push((row.clone(), title));
        }
    }
    found
}

/// The rows of the doc's `| row | panel |` table.
fn documented_panels() -> Vec<(String, String)> {
    DASHBOARD_DOC
        .lines()
        .skip_while(|line| *line != "| row | panel |")
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 2, "a panel row has two cells: {line}");
            (cells[0].to_owned(), cells[1].to_owned())
        })
        .collect()
}

#[test]
fn the_panel_list_matches_the_dashboard() {
    // Arrange
    let expected = dashboard_panels();

    // Act
    let documented = documented_panels();

    // Assert
    assert!(expected.len() > 20, "only {} panels found", expected.len());
    assert_eq!(documented, expected, "docs/DASHBOARD.md's panel table");
}
