//! docs/METRICS.md lists every metric family the gateway exports, with its type, its
//! labels and its help text exactly as `/metrics` gives them, and nothing it does not
//! export: checked both ways against a live gateway after the dashboard test's small sale
//! (orders, payments through the simulator, a waiting room).

use std::collections::{BTreeMap, BTreeSet};

use crate::ops_dashboard::{sale_app, small_sale};

const METRICS_DOC: &str = include_str!("../../docs/METRICS.md");

/// A family as documented or exported: type, label names, help text.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
    help: String,
}

/// The rows of the table: `| `name` | type | `label`, `label` | help |`.
fn documented() -> BTreeMap<String, Family> {
    METRICS_DOC
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 4, "a metrics row has four cells: {line}");
            let name = cells[0].trim_matches('`').to_owned();
            let labels = cells[2]
                .split(',')
                .map(|l| l.trim().trim_matches('`').to_owned())
                .filter(|l| !l.is_empty() && l != "—")
                .collect();
            let family = Family {
                kind: cells[1].to_owned(),
                labels,
                help: cells[3].to_owned(),
            };
            (name, family)
        })
        .collect()
}

/// The families of a text exposition, from its `# HELP` and `# TYPE` lines and the label
/// names of its series (without the histogram's `le`).
fn exported(exposition: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    fn entry<'a>(families: &'a mut BTreeMap<String, Family>, name: &str) -> &'a mut Family {
        families.entry(name.to_owned()).or_insert_with(|| Family {
            kind: String::new(),
            labels: BTreeSet::new(),
            help: String::new(),
        })
    }
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            entry(&mut families, name).help = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            entry(&mut families, name).kind = kind.to_owned();
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let series = line.split(' ').next().unwrap_or_default();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| exposition.contains(&format!("# TYPE {base} histogram")))
                .unwrap_or(name);
            let names = labels
                .trim_end_matches('}')
                .split("\",")
                .filter_map(|pair| pair.split_once('=').map(|(k, _)| k.to_owned()))
                .filter(|k| k != "le");
            entry(&mut families, family).labels.extend(names);
        }
    }
    families
}

/// The table rows for families missing from the docs, ready to paste.
fn rows(families: &BTreeMap<String, Family>) -> String {
    families
        .iter()
        .map(|(name, f)| {
            let labels = if f.labels.is_empty() {
                "—".to_owned()
            } else {
                f.labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!("| `{name}` | {} | {labels} | {} |", f.kind, f.help)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_table_matches_what_the_gateway_exports() {
    // Arrange
    let app = sale_app().await;
    let docs = documented();

    // Act
    let exposition = small_sale(&app).await;
    let exported = exported(&exposition);

    // Assert
    let undocumented: BTreeMap<String, Family> = exported
        .iter()
        .filter(|(name, family)| docs.get(*name) != Some(family))
        .map(|(name, family)| (name.clone(), family.clone()))
        .collect();
    let unexported: Vec<&String> = docs.keys().filter(|n| !exported.contains_key(*n)).collect();
    assert!(
        undocumented.is_empty() && unexported.is_empty(),
        "docs/METRICS.md differs from /metrics.\nExported, but missing or different in the docs:\n{}\nDocumented, but not exported: {unexported:?}",
        rows(&undocumented)
    );
    app.cleanup().await;
}

#[test]
fn families_are_read_with_their_labels() {
    let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total{x=\"1\",y=\"2\"} 3\n\
                # HELP h_seconds Time.\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1\"} 1\nh_seconds_sum 1\nh_seconds_count 1\n";
    let families = exported(text);
    assert_eq!(
        families["a_total"].labels,
        BTreeSet::from(["x".into(), "y".into()])
    );
    assert_eq!(families["h_seconds"].kind, "histogram");
    assert!(families["h_seconds"].labels.is_empty());
    assert_eq!(families.len(), 2);
}
