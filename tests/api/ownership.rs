//! One owner per table: the bucket rows and the per-user counters are written only by
//! `src/inventory` (and read by the invariant audit). Any other mention of their names in
//! `src/` is SQL written by the wrong module, and fails here.

use crate::helpers::{crate_root, source_files};

const OWNED: [&str; 2] = ["inventory_buckets", "user_deal_units"];
const ALLOWED: [&str; 2] = ["src/inventory/", "src/ops/audit.rs"];

#[test]
fn inventory_tables_are_named_only_by_inventory_and_the_audit() {
    let root = crate_root();
    let files = source_files();
    let mut offenders = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if ALLOWED.iter().any(|allowed| relative.starts_with(allowed)) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if OWNED.iter().any(|table| line.contains(table)) {
                offenders.push(format!("{relative}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "inventory tables named outside src/inventory:\n{}",
        offenders.join("\n")
    );
}
