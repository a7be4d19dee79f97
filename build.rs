//! Rebuilds the library when a migration is added, renamed or changed: `sqlx::migrate!`
//! embeds the `migrations/` folder at compile time, and cargo would not notice otherwise.
//! Also hands the git commit being built to `flashgate_build_info` (`FLASHGATE_GIT_COMMIT`
//! set by a packager wins; "unknown" outside a git checkout).
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
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
