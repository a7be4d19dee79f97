//! Embeds the `migrations/` folder in the library: writes `$OUT_DIR/migrations.rs`, one
//! `(version, description, sql)` per file in version order, read by `store::migrations`.
//! Doing it here rather than through sqlx's `migrate!` macro keeps sqlx's macros, and a
//! second build of sqlx and tokio for the compiler's side, out of every build. A file whose
//! name is not `<version>_<description>.sql` fails the build, naming the file.
//! Also hands the git commit being built to `flashgate_build_info` (`FLASHGATE_GIT_COMMIT`
//! set by a packager wins; "unknown" outside a git checkout).
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    embed_migrations(Path::new("migrations"));
    println!("cargo:rerun-if-env-changed=FLASHGATE_GIT_COMMIT");
    let commit = std::env::var("FLASHGATE_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FLASHGATE_GIT_COMMIT={commit}");
    // A new commit or checkout moves HEAD or the branch it points to.
    for path in ["HEAD", "packed-refs"] {
        watch_git_path(path);
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch_git_path(&branch);
    }
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn watch_git_path(path: &str) {
    if let Some(file) = git(&["rev-parse", "--git-path", path])
        && std::path::Path::new(&file).exists()
    {
        println!("cargo:rerun-if-changed={file}");
    }
}

/// Writes the migrations as a Rust slice literal of `(version, description, sql)`, the SQL
/// included from its file, named the way sqlx names a migration read from a folder (the
/// description is the name after the version, underscores read as spaces), so databases
/// migrated before keep matching.
fn embed_migrations(dir: &Path) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the migrations folder reads")
        .map(|entry| entry.expect("a migrations folder entry reads").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for path in files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let (version, rest) = name
            .split_once('_')
            .and_then(|(version, rest)| Some((version.parse::<i64>().ok()?, rest)))
            .unwrap_or_else(|| panic!("migrations/{name}: not <version>_<description>.sql"));
        let description = rest
            .strip_suffix(".sql")
            .filter(|d| !d.ends_with(".up") && !d.ends_with(".down"))
            .unwrap_or_else(|| panic!("migrations/{name}: not <version>_<description>.sql"))
            .replace('_', " ");
        let absolute = path.canonicalize().expect("a migration's path resolves");
        out.push_str(&format!(
            "    ({version}, {description:?}, include_str!({:?})),\n",
            absolute.display().to_string()
        ));
    }
    out.push_str("]\n");
    let target = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(target.join("migrations.rs"), out).expect("OUT_DIR is writable");
}
