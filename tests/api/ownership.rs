//! One owner per table: the bucket rows and the per-user counters are written only by
//! `src/inventory` (and read by the invariant audit). Any other mention of their names in
//! `src/` is SQL written by the wrong module, and fails here.

use std::path::{Path, PathBuf};

const OWNED: [&str; 2] = ["inventory_buckets", "user_deal_units"];
const ALLOWED: [&str; 2] = ["src/inventory/", "src/ops/audit.rs"];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn inventory_tables_are_named_only_by_inventory_and_the_audit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(files.len() > 20, "src/ was found");
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
