//! Every `flashgate …` and `flashgate-loadtest …` command shown in README.md and docs/*.md
//! parses: load-tester commands against the real clap definition
//! (`flashgate_loadtest::cli::Cli`), gateway commands by running the built `flashgate`
//! binary with a configuration file that does not exist, so that a command which parses
//! stops at loading the configuration (exit 64) and one that does not is refused by clap
//! (exit 2, with its usage). Sketches that list alternatives (`list|show`) or elide
//! arguments (`…`) are not commands and are skipped; placeholders (`<id>`, `N`) take a
//! value of the right kind.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use flashgate_loadtest::cli::Cli;

/// The workspace root: the load tester's parent folder.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("loadtest/ is inside the workspace")
        .to_owned()
}

fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let docs = std::fs::read_dir(root().join("docs")).expect("docs/ exists");
    for entry in docs.flatten() {
        if entry.path().extension().is_some_and(|e| e == "md") {
            files.push(entry.path());
        }
    }
    files.sort();
    files
}

/// Shell lines of fenced code blocks (continuations joined) and inline code spans.
fn snippets(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut fenced = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            let line = line.split(" #").next().unwrap_or_default();
            match line.trim_end().strip_suffix('\\') {
                Some(head) => pending.push_str(head),
                None => {
                    pending.push_str(line);
                    found.push(std::mem::take(&mut pending));
                }
            }
        } else {
            found.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
        }
    }
    found
}

/// Splits out `$(…)` substitutions as commands of their own, then cuts at pipes, `&&`,
/// `||` and `;`.
fn segments(snippet: &str) -> Vec<String> {
    let mut outer = String::new();
    let mut inner = Vec::new();
    let mut rest = snippet;
    while let Some(start) = rest.find("$(") {
        outer.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find(')').unwrap_or(after.len());
        inner.push(after[..end].to_owned());
        outer.push_str("SUBSTITUTED");
        rest = after.get(end + 1..).unwrap_or_default();
    }
    outer.push_str(rest);
    inner.push(outer);
    inner
        .iter()
        .flat_map(|s| {
            s.split("&&")
                .flat_map(|s| s.split("||"))
                .flat_map(|s| s.split([';', '|']))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Words as a shell splits them (quotes, no expansion).
fn words(segment: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut any = false;
    let mut escaped = false;
    for c in segment.chars() {
        if escaped {
            word.push(c);
            escaped = false;
            continue;
        }
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                any = true;
            }
            None if c == '\\' => escaped = true,
            None if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            None => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Program {
    Gateway,
    LoadTester,
}

/// The program and its arguments, when the segment runs one of ours.
fn command(segment: &str) -> Option<(Program, Vec<String>)> {
    let mut words = words(segment);
    while words.first().is_some_and(|w| {
        w.contains('=') && !w.starts_with('-') || w == "exec" || w == "nice" || w == "-n"
    }) {
        words.remove(0);
    }
    words.retain(|w| !w.starts_with('>') && !w.starts_with("2>") && w != "&");
    let first = words.first()?.rsplit('/').next()?.to_owned();
    let (program, args) = match first.as_str() {
        "flashgate" => (Program::Gateway, words[1..].to_vec()),
        "flashgate-loadtest" => (Program::LoadTester, words[1..].to_vec()),
        "cargo" if words.get(1).is_some_and(|w| w == "run") => {
            let split = words.iter().position(|w| w == "--");
            let flags = &words[2..split.unwrap_or(words.len())];
            let named = flags
                .windows(2)
                .find(|w| ["-p", "--package", "--bin"].contains(&w[0].as_str()))
                .map(|w| w[1].as_str());
            let program = match named {
                None | Some("flashgate") => Program::Gateway,
                Some("flashgate-loadtest") => Program::LoadTester,
                Some(_) => return None,
            };
            (
                program,
                split.map_or(Vec::new(), |s| words[s + 1..].to_vec()),
            )
        }
        _ => return None,
    };
    Some((program, args))
}

/// A sketch rather than a command: alternatives, elisions or optional parts.
fn is_sketch(args: &[String]) -> bool {
    args.iter().any(|a| {
        a.contains('…')
            || a.contains("...")
            || a.contains("\\|")
            || a.starts_with('[')
            || (a.contains('|') && !a.contains(" | "))
    })
}

/// Placeholders take a value of their kind: order and endpoint ids are UUIDs, counts are
/// numbers.
fn fill(arg: &str) -> String {
    if arg.starts_with('<') && arg.ends_with('>') {
        if arg.contains("order") || arg.contains("endpoint") {
            "0190a000-0000-7000-8000-000000000000".to_owned()
        } else {
            "demo".to_owned()
        }
    } else if arg.len() == 1 && arg.chars().all(|c| c.is_ascii_uppercase()) {
        "3".to_owned()
    } else {
        arg.to_owned()
    }
}

/// The built `flashgate` binary next to this test's own binary (target/<profile>/).
fn gateway_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let binary = profile.join("flashgate");
    assert!(
        binary.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        binary.display()
    );
    binary
}

/// Why the gateway's command line refuses `args`, if it does.
fn gateway_refuses(binary: &Path, args: &[String]) -> Option<String> {
    let mut args = args.to_vec();
    match args.iter().position(|a| a == "--config") {
        Some(at) if at + 1 < args.len() => args[at + 1] = missing_config(),
        _ => args.extend(["--config".to_owned(), missing_config()]),
    }
    let output = Command::new(binary)
        .args(&args)
        .env_remove("DATABASE_URL")
        .output()
        .expect("run flashgate");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let refused = output.status.code() == Some(2) || stderr.contains("Usage:");
    refused.then(|| stderr.into_owned())
}

fn missing_config() -> String {
    "/nonexistent/flashgate-docs-check.toml".to_owned()
}

#[test]
fn every_documented_command_parses() {
    let binary = gateway_binary();
    let mut checked = Vec::new();
    let mut refused = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("read a doc");
        let name = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for snippet in snippets(&text) {
            if is_sketch(std::slice::from_ref(&snippet)) {
                continue;
            }
            for segment in segments(&snippet) {
                let Some((program, args)) = command(&segment) else {
                    continue;
                };
                // A bare name in the text mentions the program; it runs nothing.
                if args.is_empty() || is_sketch(&args) {
                    continue;
                }
                let args: Vec<String> = args.iter().map(|a| fill(a)).collect();
                let why = match program {
                    Program::LoadTester => {
                        let argv = std::iter::once("flashgate-loadtest".to_owned()).chain(args);
                        Cli::try_parse_from(argv).err().map(|e| e.to_string())
                    }
                    Program::Gateway => gateway_refuses(&binary, &args),
                };
                if let Some(why) = why {
                    refused.push(format!("{name}: `{}`\n{why}", segment.trim()));
                }
                checked.push((program, segment.trim().to_owned()));
            }
        }
    }
    assert!(
        refused.is_empty(),
        "commands in the docs that do not parse:\n{}",
        refused.join("\n")
    );
    let count = |p: Program| checked.iter().filter(|(program, _)| *program == p).count();
    assert!(
        count(Program::Gateway) >= 10,
        "too few flashgate commands found: {checked:#?}"
    );
    assert!(
        count(Program::LoadTester) >= 3,
        "too few flashgate-loadtest commands found: {checked:#?}"
    );
}

#[test]
fn commands_are_found_and_checked_as_written() {
    let found: Vec<_> = segments("TOKEN=$(cargo run -q --release -- token --user alice)")
        .iter()
        .filter_map(|s| command(s))
        .collect();
    assert_eq!(
        found,
        [(
            Program::Gateway,
            vec!["token".into(), "--user".into(), "alice".into()]
        )]
    );
    let (program, args) =
        command("target/release/flashgate-loadtest sale --base-url \"http://x\" >out.txt").unwrap();
    assert_eq!(program, Program::LoadTester);
    assert_eq!(args, ["sale", "--base-url", "http://x"]);
    assert!(
        Cli::try_parse_from(["flashgate-loadtest", "--base-url", "http://127.0.0.1:8080"]).is_err()
    );
    assert!(is_sketch(&["list|show".to_owned()]));
    assert_eq!(
        words(r#"--out /tmp/x\ y.json -d '{"a": 1}'"#),
        ["--out", "/tmp/x y.json", "-d", r#"{"a": 1}"#]
    );
    assert_eq!(fill("<order_id>").len(), 36);
}
