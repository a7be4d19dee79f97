//! The fast tier (`cargo nextest run --profile fast`, run first by `scripts/test.sh`) holds
//! only tests that stay inside the test process: no gateway binary, CLI, redis-server,
//! initdb, pgbouncer, browser or simulator process. Which test modules start one is read
//! from their sources here, so a new module that does cannot land in the fast tier
//! unnoticed: it fails until `.config/nextest.toml` lists it in the `rest` tier.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use figment::Figment;
use figment::providers::{Format, Toml};

use crate::helpers::crate_root;

/// Source text that starts a process, directly. Spelled in two halves so that this file,
/// which only reads sources, does not contain them.
const STARTS_A_PROCESS: [&str; 2] = [concat!("Command", "::new("), concat!("CARGO_BIN", "_EXE_")];

/// Where `rest` names the test modules of `tests/api` it takes: `test(/^(a|b)::/)`.
const MODULES_OPEN: &str = "test(/^(";
const MODULES_CLOSE: &str = ")::/)";

/// A top-level item of a source file (function, type, impl block, …), by name.
#[derive(Debug)]
struct Item {
    name: String,
    public: bool,
    text: String,
}

/// Splits rustfmt-formatted source at its top-level items: lines that start in column 0
/// with a keyword. Attributes and doc comments fall to the item before; that only widens
/// what an item is said to contain.
fn items(source: &str) -> Vec<Item> {
    let mut found: Vec<Item> = Vec::new();
    for line in source.lines() {
        match item_header(line) {
            Some((name, public)) => found.push(Item {
                name,
                public,
                text: format!("{line}\n"),
            }),
            None => {
                if let Some(item) = found.last_mut() {
                    item.text.push_str(line);
                    item.text.push('\n');
                }
            }
        }
    }
    found
}

/// The name an item line declares, and whether it is `pub`; `impl … for X` is named `X`.
fn item_header(line: &str) -> Option<(String, bool)> {
    let public = line.starts_with("pub ") || line.starts_with("pub(");
    let rest = line
        .trim_start_matches("pub(crate) ")
        .trim_start_matches("pub ");
    let rest = rest
        .trim_start_matches("async ")
        .trim_start_matches("unsafe ");
    let mut words = rest.split(|c: char| !(c.is_alphanumeric() || c == '_'));
    let keyword = words.next()?;
    let name = match keyword {
        "fn" | "struct" | "enum" | "const" | "static" | "type" | "trait" | "mod" => {
            words.find(|w| !w.is_empty())?
        }
        "impl" => {
            let target = rest.rsplit(" for ").next()?.trim_start_matches("impl");
            let target = target.trim_start_matches(['<', ' ']);
            target
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .find(|w| !w.is_empty() && w.chars().next().is_some_and(char::is_uppercase))?
        }
        _ => return None,
    };
    Some((name.to_owned(), public))
}

/// Whether `text` uses `name` as a whole word.
fn mentions(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !word(before) && !word(after)
    })
}

/// Files by module name (`helpers/process` for helpers' own files) and their sources.
type Sources = BTreeMap<String, String>;

/// The modules whose tests start a process: an item does when its text starts one
/// directly, or uses an item of its own file that does, or a public one of a file it
/// reaches (every helpers file; another test module through `module::`). Repeated until
/// nothing changes, so chains of helpers are followed.
fn modules_starting_processes(sources: &Sources) -> BTreeSet<String> {
    let parsed: BTreeMap<&str, Vec<Item>> = sources
        .iter()
        .map(|(module, text)| (module.as_str(), items(text)))
        .collect();
    let mut starting: BTreeSet<(&str, &str)> = BTreeSet::new();
    loop {
        let before = starting.len();
        for (module, module_items) in &parsed {
            for item in module_items {
                if starts_process(sources, &parsed, &starting, module, item) {
                    starting.insert((module, item.name.as_str()));
                }
            }
        }
        if starting.len() == before {
            break;
        }
    }
    starting
        .into_iter()
        .map(|(module, _)| module)
        .filter(|module| !module.starts_with("helpers"))
        .map(str::to_owned)
        .collect()
}

fn starts_process(
    sources: &Sources,
    parsed: &BTreeMap<&str, Vec<Item>>,
    starting: &BTreeSet<(&str, &str)>,
    module: &str,
    item: &Item,
) -> bool {
    if STARTS_A_PROCESS.iter().any(|m| item.text.contains(m)) {
        return true;
    }
    starting.iter().any(|&(other, name)| {
        let reachable = if other == module {
            true
        } else {
            let public = parsed[other].iter().any(|i| i.name == name && i.public);
            let other_leaf = other.rsplit('/').next().unwrap_or(other);
            public
                && (other.starts_with("helpers")
                    || sources[module].contains(&format!("{other_leaf}::")))
        };
        reachable && mentions(&item.text, name)
    })
}

/// `tests/api/*.rs` and `tests/api/helpers/*.rs`, by module name.
fn api_sources() -> Sources {
    let dir = crate_root().join("tests/api");
    let mut sources = read_rust_files(&dir, "");
    sources.extend(read_rust_files(&dir.join("helpers"), "helpers/"));
    sources.remove("main");
    sources
}

fn read_rust_files(dir: &Path, prefix: &str) -> Sources {
    std::fs::read_dir(dir)
        .expect("the test directory is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .map(|path| {
            let stem = path.file_stem().unwrap().to_string_lossy();
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            (format!("{prefix}{stem}"), text)
        })
        .collect()
}

/// Integration test binaries of the other workspace packages that start a process in any
/// of their files, as nextest names them (`package::binary`); they go to the rest tier
/// whole.
fn other_binaries_starting_processes() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for member in ["loadtest", "psp-sim"] {
        let root = crate_root().join(member);
        let package: String = Figment::from(Toml::file(root.join("Cargo.toml")))
            .extract_inner("package.name")
            .expect("a workspace member names its package");
        for entry in std::fs::read_dir(root.join("tests")).expect("its tests are readable") {
            let path = entry.expect("a directory entry").path();
            let sources = if path.is_dir() {
                read_rust_files(&path, "")
            } else {
                read_rust_files(path.parent().unwrap(), "")
                    .into_iter()
                    .filter(|(stem, _)| path.file_stem().is_some_and(|s| s == stem.as_str()))
                    .collect()
            };
            let starts = sources
                .values()
                .any(|text| STARTS_A_PROCESS.iter().any(|m| text.contains(m)));
            if starts {
                let binary = path.file_stem().unwrap().to_string_lossy();
                found.insert(format!("{package}::{binary}"));
            }
        }
    }
    found
}

/// A profile's `default-filter` in `.config/nextest.toml`.
fn tier_filter(profile: &str) -> String {
    Figment::from(Toml::file(crate_root().join(".config/nextest.toml")))
        .extract_inner(&format!("profile.{profile}.default-filter"))
        .unwrap_or_else(|e| panic!("profile `{profile}` has a default-filter: {e}"))
}

/// The `tests/api` modules a filter names in its `test(/^(a|b)::/)` term.
fn named_modules(filter: &str) -> BTreeSet<String> {
    let start = filter
        .find(MODULES_OPEN)
        .unwrap_or_else(|| panic!("no {MODULES_OPEN}…{MODULES_CLOSE} in {filter}"))
        + MODULES_OPEN.len();
    let end = start
        + filter[start..]
            .find(MODULES_CLOSE)
            .expect("the list closes");
    filter[start..end].split('|').map(str::to_owned).collect()
}

#[test]
fn every_module_that_starts_a_process_is_outside_the_fast_tier() {
    // Arrange
    let rest = tier_filter("rest");
    let fast = tier_filter("fast");
    let modules = api_sources();

    // Act
    let starting = modules_starting_processes(&modules);
    let in_rest = named_modules(&rest);
    let other_binaries = other_binaries_starting_processes();

    // Assert
    assert_eq!(
        fast,
        format!("not ({rest})"),
        "the fast tier is exactly what the rest tier is not"
    );
    let missing: Vec<_> = starting.difference(&in_rest).collect();
    assert!(
        missing.is_empty(),
        "these test modules start processes; list them in the rest tier of \
         .config/nextest.toml: {missing:?}"
    );
    let unknown: Vec<_> = in_rest
        .iter()
        .filter(|m| !modules.contains_key(m.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the rest tier names no such modules: {unknown:?}"
    );
    let whole: Vec<_> = other_binaries
        .iter()
        .filter(|binary| !rest.contains(&format!("binary_id({binary})")))
        .collect();
    assert!(
        whole.is_empty(),
        "these test binaries start processes; add binary_id(…) for each to the rest tier: \
         {whole:?}"
    );
}

#[test]
fn the_scan_follows_helpers_and_other_modules_to_the_process_they_start() {
    // Arrange
    let sources: Sources = [
        ("helpers/proc", "pub fn boot() -> Child {\n    START(\"x\").spawn()\n}\n\npub fn port() -> u16 {\n    1\n}\n"),
        ("starter", "use crate::helpers::boot;\n\nasync fn t() {\n    let _c = boot();\n}\n"),
        ("library", "pub fn run_it() {\n    inner();\n}\n\nfn inner() {\n    let _ = std::process::START(\"y\");\n}\n"),
        ("borrower", "use crate::library::run_it;\n\nfn t() {\n    run_it();\n}\n"),
        ("quiet", "use crate::helpers::port;\n\nfn t() {\n    boot_time(port());\n}\n"),
        ("namesake", "fn t() {\n    run_it();\n}\n"),
    ]
    .into_iter()
    .map(|(m, s)| (m.to_owned(), s.replace("START(", STARTS_A_PROCESS[0])))
    .collect();

    // Act
    let starting = modules_starting_processes(&sources);

    // Assert
    let expected: BTreeSet<String> = ["borrower", "library", "starter"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(starting, expected);
}
