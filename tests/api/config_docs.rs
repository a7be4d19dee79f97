//! docs/CONFIGURATION.md lists every setting the code reads, with its environment
//! variables, its default and its unit, and the README's table every short alias: a setting
//! added, renamed or given another default without its documentation fails here.

use std::collections::BTreeMap;

use flashgate::config::env;
use flashgate::config::explain;

/// One row of the settings table: the cells between the outer pipes, unescaped.
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut escaped = false;
    for c in inner.chars() {
        match c {
            '\\' if !escaped => escaped = true,
            '|' if !escaped => cells.push(String::new()),
            c => {
                if escaped && c != '|' {
                    cells.last_mut().unwrap().push('\\');
                }
                escaped = false;
                cells.last_mut().unwrap().push(c);
            }
        }
    }
    cells
        .into_iter()
        .map(|cell| cell.trim().to_owned())
        .collect()
}

/// The settings table of docs/CONFIGURATION.md, by setting.
fn documented() -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/CONFIGURATION.md"
    ))
    .expect("docs/CONFIGURATION.md");
    let table = text
        .split("## Settings")
        .nth(1)
        .expect("a Settings section");
    let mut rows = BTreeMap::new();
    for line in table.lines().filter(|line| line.starts_with("| `")) {
        let cells = cells(line);
        assert_eq!(cells.len(), 5, "five cells: {line}");
        let key = cells[0].trim_matches('`').to_owned();
        assert!(rows.insert(key.clone(), cells).is_none(), "{key} twice");
    }
    rows
}

/// The unit a setting's name promises, as the table writes it.
fn unit_of(key: &str) -> &'static str {
    let name = key.rsplit('.').next().unwrap();
    if name.ends_with("_ms") {
        "ms"
    } else if name.contains("_seconds") {
        "s"
    } else if name.contains("bytes") {
        "bytes"
    } else if name.ends_with("per_second") {
        "1/s"
    } else if name.contains("bits") {
        "bits"
    } else {
        "—"
    }
}

fn variables_of(key: &str) -> String {
    match env::alias(key) {
        Some(alias) => format!("`{}` or `{alias}`", env::canonical(key)),
        None => format!("`{}`", env::canonical(key)),
    }
}

#[test]
fn the_settings_table_matches_the_code() {
    let defaults = explain::defaults();
    let documented = documented();

    let missing: Vec<&String> = defaults
        .keys()
        .filter(|key| !documented.contains_key(*key))
        .collect();
    let unknown: Vec<&String> = documented
        .keys()
        .filter(|key| !defaults.contains_key(*key))
        .collect();
    assert!(
        missing.is_empty(),
        "settings missing from the table: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "documented settings the code lacks: {unknown:?}"
    );
    for (key, default) in &defaults {
        let row = &documented[key];
        assert_eq!(row[1], variables_of(key), "variables of {key}");
        assert_eq!(
            row[2],
            format!("`{}`", explain::render(default)),
            "default of {key}"
        );
        assert_eq!(row[3], unit_of(key), "unit of {key}");
        assert!(row[4].len() > 10, "{key} says what it is for: {:?}", row[4]);
    }
}

#[test]
fn the_readme_table_names_every_alias() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for (alias, key) in env::ALIASES {
        assert!(
            readme.contains(&format!("| `{alias}` | `{key}` |")),
            "README's table lacks {alias}"
        );
    }
    assert!(readme.contains("| `FLASHGATE__SECTION__KEY` |"));
}
