//! One owner per table: every table the migrations create is written (INSERT, UPDATE,
//! DELETE, TRUNCATE) only by the module that owns it, and the status values of a table
//! appear in SQL only in its owner. Everyone else calls the owner's functions, so a
//! table's rules are read in one place. docs/ARCHITECTURE.md holds the same table.

use std::collections::BTreeSet;

use crate::helpers::{crate_root, source_files};

/// Each table and the source path (a folder or a file) that owns it.
const OWNERS: [(&str, &str); 16] = [
    ("deals", "src/deals/"),
    ("inventory_buckets", "src/inventory/"),
    ("reservation_lines", "src/inventory/"),
    ("user_deal_units", "src/inventory/"),
    ("orders", "src/orders/"),
    ("payment_attempts", "src/payments/attempts.rs"),
    ("payment_events", "src/payments/webhook.rs"),
    ("refunds", "src/payments/refunds.rs"),
    ("outbox", "src/payments/outbox.rs"),
    ("events", "src/events/"),
    ("event_positions", "src/events/"),
    ("event_sequencer", "src/events/sequencer.rs"),
    ("event_endpoints", "src/events/endpoints.rs"),
    ("operator_log", "src/operators/"),
    ("access_codes", "src/waiting_room/access_codes.rs"),
    ("waiting_room_orders", "src/waiting_room/report.rs"),
];

/// Status values as SQL literals, and the owners allowed to write them out.
const STATUSES: [(&str, &[&str]); 10] = [
    ("'PENDING_PAYMENT'", &["src/orders/"]),
    ("'PAID'", &["src/orders/"]),
    ("'CANCELLED'", &["src/orders/"]),
    ("'REFUND_PENDING'", &["src/orders/"]),
    ("'REFUNDED'", &["src/orders/"]),
    ("'MANUAL_REVIEW'", &["src/orders/"]),
    ("'EXPIRED'", &["src/orders/", "src/payments/attempts.rs"]),
    (
        "'PENDING'",
        &["src/payments/attempts.rs", "src/payments/refunds.rs"],
    ),
    (
        "'SUCCEEDED'",
        &["src/payments/attempts.rs", "src/payments/refunds.rs"],
    ),
    (
        "'FAILED'",
        &["src/payments/attempts.rs", "src/payments/refunds.rs"],
    ),
];

/// The invariant audit reads every table and states the invariant in SQL of its own; it
/// writes nothing (checked below like everyone else).
const STATUS_READERS: [&str; 1] = ["src/ops/audit.rs"];

fn relative(file: &std::path::Path) -> String {
    file.strip_prefix(crate_root())
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/")
}

/// Tables created by the migrations.
fn tables() -> BTreeSet<String> {
    let mut tables = BTreeSet::new();
    for entry in std::fs::read_dir(crate_root().join("migrations")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let words = words(&text);
        for window in words.windows(3) {
            if window[0] == "create" && window[1] == "table" {
                tables.insert(window[2].clone());
            }
        }
    }
    tables
}

fn words(text: &str) -> Vec<String> {
    text.to_ascii_lowercase()
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The tables a text writes to, as SQL names them after a writing keyword.
fn written(text: &str, tables: &BTreeSet<String>) -> BTreeSet<String> {
    let words = words(text);
    let mut found = BTreeSet::new();
    for (i, word) in words.iter().enumerate() {
        let target = match word.as_str() {
            "insert" | "delete" => words
                .get(i + 2)
                .filter(|_| matches!(words.get(i + 1).map(String::as_str), Some("into" | "from"))),
            "update" => words.get(i + 1),
            "truncate" => match words.get(i + 1).map(String::as_str) {
                Some("table") => words.get(i + 2),
                _ => words.get(i + 1),
            },
            _ => None,
        };
        if let Some(table) = target.filter(|t| tables.contains(*t)) {
            found.insert(table.clone());
        }
    }
    found
}

#[test]
fn every_table_has_an_owner() {
    let owned: BTreeSet<String> = OWNERS.iter().map(|(t, _)| (*t).to_owned()).collect();
    let tables = tables();
    assert!(tables.len() >= 9, "the migrations were read: {tables:?}");
    let orphans: Vec<_> = tables.difference(&owned).collect();
    assert!(
        orphans.is_empty(),
        "tables without an owner in OWNERS: {orphans:?}"
    );
}

#[test]
fn every_table_is_written_only_by_its_owner() {
    let tables = tables();
    let mut offenders = Vec::new();
    for file in source_files() {
        let path = relative(&file);
        let text = std::fs::read_to_string(&file).unwrap();
        for table in written(&text, &tables) {
            let (_, owner) = OWNERS.iter().find(|(t, _)| *t == table).unwrap();
            if !path.starts_with(owner) {
                offenders.push(format!("{path} writes {table}, which {owner} owns"));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

#[test]
fn status_values_appear_in_sql_only_in_their_owner() {
    let mut offenders = Vec::new();
    for file in source_files() {
        let path = relative(&file);
        if STATUS_READERS.contains(&path.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for (status, owners) in STATUSES {
                if line.contains(status) && !owners.iter().any(|o| path.starts_with(o)) {
                    offenders.push(format!("{path}:{}: {status}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "bind the status instead:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_write_finder_sees_every_kind_of_write() {
    let tables: BTreeSet<String> = ["orders", "deals", "outbox", "refunds"]
        .map(str::to_owned)
        .into();
    let sql = "INSERT INTO orders (id) VALUES (1); update deals set x = 1;
               DELETE FROM outbox; TRUNCATE TABLE refunds; SELECT 1 FOR UPDATE SKIP LOCKED";
    assert_eq!(written(sql, &tables), tables);
    assert!(written("-- update the orders later\nSELECT * FROM orders", &tables).is_empty());
}

#[test]
fn the_architecture_page_names_the_same_owners() {
    let page = std::fs::read_to_string(crate_root().join("docs/ARCHITECTURE.md")).unwrap();
    let documented: BTreeSet<(String, String)> = page
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let [_, table, owner, _] = cells.as_slice() else {
                return None;
            };
            let unquote = |cell: &str| cell.trim_matches('`').to_owned();
            Some((unquote(table), unquote(owner)))
        })
        .filter(|(table, _)| OWNERS.iter().any(|(t, _)| t == table))
        .collect();
    let owners: BTreeSet<(String, String)> = OWNERS
        .iter()
        .map(|(t, o)| ((*t).to_owned(), (*o).to_owned()))
        .collect();
    assert_eq!(
        documented, owners,
        "docs/ARCHITECTURE.md, \"Who writes each table\""
    );
}
