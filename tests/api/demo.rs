//! `flashgate demo` (what `scripts/demo.sh` runs): a rerun on a database whose demo deal an
//! earlier run sold out says so and how to start over, instead of serving a sale that
//! refuses every order; and Ctrl-C stops it without the drain delay meant for load
//! balancers, which a demo does not have.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::helpers::{ChildGuard, TestDb, eventually, redis_url, unique_suffix};
use crate::startup_errors::flashgate;

/// The last line of the instructions the demo prints.
const LAST_LINE: &str = "Press Ctrl-C to stop.";

/// Longer than a start with every migration on a busy machine.
const START_MAX: Duration = Duration::from_secs(60);

/// What one demo run printed before its instructions ended, and its log after Ctrl-C.
struct DemoRun {
    stdout: String,
    stderr: String,
    code: Option<i32>,
}

/// Runs `flashgate demo` on `database_url` until it has printed its instructions, then
/// sends SIGINT (Ctrl-C) and waits for it to exit.
async fn demo_until_ready_then_interrupt(database_url: &str, key_prefix: &str) -> DemoRun {
    let mut guard = ChildGuard {
        child: Command::new(env!("CARGO_BIN_EXE_flashgate"))
            .arg("demo")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("DATABASE_URL", database_url)
            .env("REDIS_URL", redis_url())
            .env("FLASHGATE__REDIS__KEY_PREFIX", key_prefix)
            .env("FLASHGATE_LISTEN", "127.0.0.1:0")
            .env("FLASHGATE_OPS_LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start flashgate demo"),
    };
    let stdout = guard.child.stdout.take().expect("piped stdout");
    // Read at once, so the gateway never blocks on a full pipe; ends when it exits.
    let mut stderr_pipe = guard.child.stderr.take().expect("piped stderr");
    let stderr = std::thread::spawn(move || {
        let mut log = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr_pipe, &mut log);
        log
    });
    let read = tokio::task::spawn_blocking(move || {
        let mut printed = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            printed.push_str(&line);
            printed.push('\n');
            if line == LAST_LINE {
                break;
            }
        }
        printed
    });
    let stdout = tokio::time::timeout(START_MAX, read)
        .await
        .expect("the demo prints its instructions")
        .expect("the reader thread");
    let code = interrupt(&mut guard).await;
    DemoRun {
        stdout,
        stderr: stderr.join().expect("the stderr reader"),
        code,
    }
}

/// Sends SIGINT, as Ctrl-C in a terminal does, and waits for the exit code (None: killed
/// by a signal, or still running after `START_MAX`).
async fn interrupt(guard: &mut ChildGuard) -> Option<i32> {
    let sent = Command::new("kill")
        .args(["-INT", &guard.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -INT {}", guard.pid());
    let exited = eventually(START_MAX, || {
        let status = guard.child.try_wait().expect("wait for the demo");
        async move { status }
    })
    .await;
    exited.and_then(|status| status.code())
}

#[tokio::test]
async fn a_rerun_after_a_sell_out_says_so_and_how_to_start_over() {
    // Arrange: a first run creates the demo deal; then every seat is taken away.
    let database = TestDb::create().await;
    let prefix = format!("fgtest:{}:", unique_suffix());
    let first = demo_until_ready_then_interrupt(&database.url, &prefix).await;
    let emptied = flashgate(
        &["deals", "stock", "demo", "--delta=-100"],
        &[("DATABASE_URL", &database.url)],
    );

    // Act
    let rerun = demo_until_ready_then_interrupt(&database.url, &prefix).await;
    database.drop_database().await;

    // Assert
    assert!(
        first.stdout.ends_with(&format!("{LAST_LINE}\n")),
        "{}",
        first.stdout
    );
    assert!(!first.stdout.contains("earlier run"), "{}", first.stdout);
    assert_eq!(emptied.code, Some(0), "{}", emptied.stderr);
    let notice = rerun
        .stdout
        .lines()
        .find(|line| line.contains("sold out"))
        .unwrap_or_else(|| panic!("no sold-out notice: {}", rerun.stdout));
    assert!(notice.contains("scripts/demo.sh --reset"), "{notice}");
    assert!(
        rerun.stdout.ends_with(&format!("{LAST_LINE}\n")),
        "{}",
        rerun.stdout
    );
}

#[tokio::test]
async fn ctrl_c_stops_the_demo_without_a_drain_delay() {
    // Arrange
    let database = TestDb::create().await;
    let prefix = format!("fgtest:{}:", unique_suffix());

    // Act
    let run = demo_until_ready_then_interrupt(&database.url, &prefix).await;
    database.drop_database().await;

    // Assert: it exits cleanly, and its log shows the drain took no time.
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let draining = run
        .stderr
        .lines()
        .find(|line| line.contains("draining: not ready"))
        .unwrap_or_else(|| panic!("no drain line: {}", run.stderr));
    assert!(draining.contains("drain_delay=0ns"), "{draining}");
}

#[tokio::test]
async fn the_demos_printed_commands_and_the_cli_see_the_same_database() {
    // Arrange: a demo on a database of the test's own, not the shipped default.
    let database = TestDb::create().await;
    let prefix = format!("fgtest:{}:", unique_suffix());
    let run = demo_until_ready_then_interrupt(&database.url, &prefix).await;
    let printed = run
        .stdout
        .lines()
        .map(str::trim)
        .find(|line| line.ends_with(" deals list"))
        .unwrap_or_else(|| panic!("no CLI command printed: {}", run.stdout))
        .to_owned();

    // Act: the printed line as a user pastes it, in a shell that has nothing else set.
    let listed = Command::new("sh")
        .args(["-c", &printed])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .expect("run the printed command");
    let url = database.url.clone();
    database.drop_database().await;

    // Assert
    assert!(printed.contains(&url), "{printed}");
    assert!(listed.status.success(), "{printed}: {listed:?}");
    let deals: serde_json::Value =
        serde_json::from_slice(&listed.stdout).expect("deals list prints JSON");
    let ids: Vec<&str> = deals
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|deal| deal["id"].as_str())
        .collect();
    assert_eq!(ids, ["demo"], "{printed}");
}
