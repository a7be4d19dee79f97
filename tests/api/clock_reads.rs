//! Time is an input: production code asks the application's clock (`src/clock.rs`), never
//! the system's directly, so that a test can run the gateway on a clock it moves. This
//! reads every source file and fails on a direct clock read anywhere but the clock module.

use crate::helpers::{crate_root, source_files};

/// The ways to read a clock without asking `flashgate::clock`: the wall clock (chrono,
/// std) and monotonic time (std's and tokio's `Instant`, and `elapsed()`, which reads it).
const DIRECT_READS: [&str; 5] = [
    "Utc::now(",
    "Local::now(",
    "SystemTime::now(",
    "Instant::now(",
    ".elapsed()",
];

/// The one module allowed to read the system's clock.
const CLOCK_MODULE: &str = "src/clock.rs";

#[test]
fn no_source_file_but_the_clock_module_reads_a_clock() {
    let mut found = Vec::new();
    for path in source_files() {
        let relative = path.strip_prefix(crate_root()).expect("under the crate");
        if relative.to_string_lossy() == CLOCK_MODULE {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable source file");
        for (number, line) in text.lines().enumerate() {
            if DIRECT_READS.iter().any(|read| line.contains(read)) {
                found.push(format!(
                    "{}:{}: {}",
                    relative.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "read the time through flashgate::clock (Clock::now/instant, monotonic, \
         elapsed_since) instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_clock_module_is_where_the_clock_is_read() {
    let text = std::fs::read_to_string(crate_root().join(CLOCK_MODULE)).expect("src/clock.rs");
    assert!(text.contains("Utc::now()") && text.contains("Instant::now()"));
}
