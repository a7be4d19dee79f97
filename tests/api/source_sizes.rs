//! Every source file of the gateway, the payment simulator and the load tester stays a
//! reference one can read: at most 600 lines. A file that grows past it is split along a
//! seam of its own (see docs/ARCHITECTURE.md), not left to grow.

use crate::helpers::{crate_root, rust_files_under};

/// The most lines a source file may have.
const LINES_MAX: usize = 600;

#[test]
fn no_source_file_is_over_600_lines() {
    let mut over = Vec::new();
    let mut seen = 0;
    for dir in ["src", "loadtest/src", "psp-sim/src"] {
        for path in rust_files_under(dir) {
            seen += 1;
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            let lines = text.lines().count();
            if lines > LINES_MAX {
                let shown = path.strip_prefix(crate_root()).unwrap_or(&path);
                over.push(format!("{} ({lines} lines)", shown.display()));
            }
        }
    }
    assert!(seen > 100, "only {seen} source files found");
    assert!(over.is_empty(), "over {LINES_MAX} lines: {over:#?}");
}
