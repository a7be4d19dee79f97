//! The operator CLI against a real database: creating, listing, stocking and showing
//! deals, and how each command reports a mistake.

use std::process::Command;

use flashgate::config::Settings;
use serde_json::{Value, json};

use crate::helpers::{TestDb, delete_redis_keys, test_settings};

/// What one `flashgate` command did.
pub struct CliOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// Runs the `flashgate` binary with `args` against the database and Redis prefix of
/// `settings`.
pub async fn flashgate_cli(settings: &Settings, args: &[&str]) -> CliOutput {
    let mut command = cli_command(settings, args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("CLI task")
        .expect("run flashgate");
    CliOutput {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The `flashgate args` command with only the environment `settings` call for.
pub fn cli_command(settings: &Settings, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flashgate"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .env("DATABASE_URL", &settings.database.url)
        .env("DATABASE_DIRECT_URL", &settings.database.direct_url)
        .env(
            "FLASHGATE__DATABASE__TRANSACTION_POOLER",
            settings.database.transaction_pooler.to_string(),
        )
        .env("REDIS_URL", &settings.redis.url)
        .env("FLASHGATE__REDIS__KEY_PREFIX", &settings.redis.key_prefix)
        .env(
            "FLASHGATE__SOLDOUT__REFRESH_INTERVAL_MS",
            settings.soldout.refresh_interval_ms.to_string(),
        );
    command
}

#[tokio::test]
async fn deals_are_created_stocked_listed_and_shown_from_the_cli() {
    // Arrange: a migrated database with no gateway running.
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    let migrated = flashgate_cli(&settings, &["migrate"]).await;
    assert!(migrated.success, "{}", migrated.stderr);

    // Act
    let created = flashgate_cli(
        &settings,
        &[
            "deals",
            "create",
            "--id",
            "cli-deal",
            "--name",
            "CLI deal",
            "--stock",
            "40",
            "--buckets",
            "4",
            "--unit-price-minor",
            "1999",
            "--per-user-limit",
            "2",
        ],
    )
    .await;
    let stocked = flashgate_cli(&settings, &["deals", "stock", "cli-deal", "--delta", "-10"]).await;
    let listed = flashgate_cli(&settings, &["deals", "list"]).await;
    let too_much =
        flashgate_cli(&settings, &["deals", "stock", "cli-deal", "--delta", "-31"]).await;
    let unknown = flashgate_cli(&settings, &["deals", "pause", "no-such-deal"]).await;

    // Assert
    assert!(created.success, "{}", created.stderr);
    assert_eq!(created.json()["buckets"], json!(4));
    assert_eq!(created.json()["paused"], json!(false));
    assert!(stocked.success, "{}", stocked.stderr);
    let shown = stocked.json();
    assert_eq!(shown["stock_total"], json!(30));
    assert_eq!(shown["available"], json!(30));
    assert_eq!(shown["invariant_holds"], json!(true));
    assert_eq!(shown["buckets"].as_array().unwrap().len(), 4);
    assert!(listed.success, "{}", listed.stderr);
    let deals = listed.json();
    assert_eq!(deals[0]["id"], json!("cli-deal"));
    assert_eq!(deals[0]["available"], json!(30));
    assert!(!too_much.success, "removing more than available must fail");
    assert!(
        too_much.stderr.contains("only 30 are available"),
        "{}",
        too_much.stderr
    );
    assert!(!unknown.success);
    assert!(unknown.stderr.contains("not found"), "{}", unknown.stderr);
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}
