//! The CLI's output is made to be piped, and a reader may stop early (`… | head`): a
//! command whose stdout is closed still does its work and ends quietly, without a panic
//! or a message about the pipe.

use std::process::{Command, Stdio};

use crate::helpers::{TestDb, delete_redis_keys, test_settings};
use crate::ops_cli::{cli_command, flashgate_cli};

/// How a command ended with nobody reading its stdout.
struct Ended {
    code: Option<i32>,
    stderr: String,
}

/// Runs `command` with stdout a pipe whose reading end is already closed, so the first
/// write fails with a broken pipe every time (no race with a reader closing later).
fn with_stdout_closed(mut command: Command) -> Ended {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let output = command
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run flashgate");
    Ended {
        code: output.status.code(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn assert_quiet(args: &[&str], ended: &Ended) {
    assert_eq!(ended.code, Some(0), "{args:?}: {}", ended.stderr);
    assert!(ended.stderr.is_empty(), "{args:?}: {}", ended.stderr);
}

#[tokio::test]
async fn commands_piped_into_a_reader_that_left_end_quietly() {
    // Arrange: a migrated database with one deal.
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    assert!(flashgate_cli(&settings, &["migrate"]).await.success);
    let created = flashgate_cli(
        &settings,
        &[
            "deals",
            "create",
            "--id",
            "demo",
            "--name",
            "Demo",
            "--stock",
            "10",
            "--unit-price-minor",
            "100",
        ],
    )
    .await;
    assert!(created.success, "{}", created.stderr);

    // Act and assert: reading, writing and printing-only commands alike.
    let commands: [&[&str]; 8] = [
        &["deals", "show", "demo"],
        &["deals", "list"],
        &["deals", "pause", "demo"],
        &["migrate"],
        &["review", "list"],
        &["token", "--user", "alice"],
        &["config"],
        &["--help"],
    ];
    for args in commands {
        let command = cli_command(&settings, args);
        let ended = tokio::task::spawn_blocking(move || with_stdout_closed(command))
            .await
            .unwrap();
        assert_quiet(args, &ended);
    }
    // The write after the closed pipe was still made.
    let shown = flashgate_cli(&settings, &["deals", "list"]).await;
    assert_eq!(shown.json()[0]["paused"], serde_json::json!(true));
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}
