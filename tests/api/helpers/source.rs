//! The project's own source files, for tests that check rules about where code lives.

use std::path::{Path, PathBuf};

/// Every `.rs` file under the crate's `src/`.
pub fn source_files() -> Vec<PathBuf> {
    let mut found = Vec::new();
    rust_files(&crate_root().join("src"), &mut found);
    assert!(found.len() > 20, "src/ was found");
    found
}

/// Every `.rs` file under `dir` (relative to the workspace root: `src`, `loadtest/src`, …).
pub fn rust_files_under(dir: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    rust_files(&crate_root().join(dir), &mut found);
    found
}

/// The crate's directory, against which source paths are reported.
pub fn crate_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

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
