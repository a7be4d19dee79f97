//! The environment scheme through the binary: `FLASHGATE__SECTION__KEY` for every setting,
//! the short aliases where they exist, both names of one setting refused, any unknown
//! `FLASHGATE_` name refused with the closest known one, the names in `--help`, and
//! `flashgate config` telling every effective value and where it came from.

use std::process::Command;

use figment::Figment;
use figment::providers::{Format, Toml};
use flashgate::config::{Settings, env, explain};

use crate::helpers::{free_port, unique_suffix};
use crate::startup_errors::Run;

/// Exit code of a configuration that cannot be used.
const EXIT_BAD_CONFIG: i32 = 64;

/// Runs `flashgate args` with nothing in its environment but `PATH` and `vars`, and
/// PostgreSQL somewhere nothing answers: a command that dials it fails fast.
fn flashgate(args: &[&str], vars: &[(&str, &str)]) -> Run {
    Run::of(
        Command::new("timeout")
            .args(["60", env!("CARGO_BIN_EXE_flashgate")])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(
                "DATABASE_URL",
                format!("postgres://postgres@127.0.0.1:{}/none", free_port()),
            )
            .envs(vars.iter().copied()),
    )
}

/// The line `flashgate config` printed for `key`.
fn line_of<'a>(run: &'a Run, key: &str) -> &'a str {
    let prefix = format!("{key} = ");
    run.stdout
        .lines()
        .find(|line| line.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line for {key}: {}", run.stdout))
}

#[test]
fn a_typo_in_either_form_is_refused_with_the_closest_name() {
    for (typo, meant) in [
        ("FLASHGATE_LISTN", "FLASHGATE_LISTEN"),
        ("FLASHGATE__SERVER__LISTN", "FLASHGATE__SERVER__LISTEN"),
        (
            "FLASHGATE_SERVER__REQUEST_TIMEOUT_MS",
            "FLASHGATE__SERVER__REQUEST_TIMEOUT_MS",
        ),
    ] {
        for args in [&["config"][..], &["migrate"]] {
            let run = flashgate(args, &[(typo, "1")]);
            run.assert_error(
                EXIT_BAD_CONFIG,
                &[
                    typo,
                    "is not a flashgate setting",
                    &format!("did you mean {meant}?"),
                ],
            );
        }
    }
}

#[test]
fn both_names_of_one_setting_are_refused_naming_both() {
    let run = flashgate(
        &["config"],
        &[
            ("FLASHGATE_LISTEN", "127.0.0.1:1"),
            ("FLASHGATE__SERVER__LISTEN", "127.0.0.1:2"),
        ],
    );
    run.assert_error(
        EXIT_BAD_CONFIG,
        &["FLASHGATE_LISTEN and FLASHGATE__SERVER__LISTEN both set server.listen"],
    );

    let run = flashgate(
        &["migrate"],
        &[("FLASHGATE__DATABASE__URL", "postgres://h/db")],
    );
    run.assert_error(
        EXIT_BAD_CONFIG,
        &["DATABASE_URL and FLASHGATE__DATABASE__URL both set database.url"],
    );
}

#[test]
fn the_canonical_name_sets_a_setting_that_has_an_alias() {
    let run = flashgate(
        &["config"],
        &[("FLASHGATE__SERVER__OPS_LISTEN", "127.0.0.1:9911")],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        line_of(&run, "server.ops_listen"),
        "server.ops_listen = \"127.0.0.1:9911\"  # environment FLASHGATE__SERVER__OPS_LISTEN"
    );
}

#[test]
fn other_programs_variables_are_let_through() {
    let run = flashgate(
        &["config"],
        &[
            ("FLASHGATE_PSP_API_KEY", "for the simulator"),
            ("FLASHGATE_GIT_COMMIT", "abc"),
            ("FLASHGATE_TEST_NO_SYSTEM", "0"),
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[test]
fn config_prints_every_setting_with_where_it_came_from_and_no_secret() {
    // Arrange: a file, the environment and the defaults each setting something.
    let dir = std::env::temp_dir().join(format!("fgtest-explain-{}", unique_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prod.toml");
    std::fs::write(
        &file,
        "[server]\nworker_threads = 3\n[auth]\nadmin_token = \"file-admin-token-0123456789abcdef\"\n",
    )
    .unwrap();
    let given = file.to_str().unwrap();

    // Act
    let run = flashgate(
        &["--config", given, "config"],
        &[
            (
                "FLASHGATE__AUTH__JWT_SECRET",
                "env-jwt-secret-0123456789abcdef",
            ),
            (
                "DATABASE_URL",
                "postgres://app:hunter2@db.example:5433/sale",
            ),
            ("FLASHGATE__SERVER__BODY_BYTES_MAX", "65536"),
        ],
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // Assert
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), explain::defaults().len());
    assert_eq!(
        line_of(&run, "server.worker_threads"),
        format!("server.worker_threads = 3  # file {given}")
    );
    assert_eq!(
        line_of(&run, "server.body_bytes_max"),
        "server.body_bytes_max = 65536  # environment FLASHGATE__SERVER__BODY_BYTES_MAX"
    );
    assert_eq!(
        line_of(&run, "database.url"),
        "database.url = \"postgres://app:<redacted>@db.example:5433/sale\"  # environment DATABASE_URL"
    );
    assert_eq!(
        line_of(&run, "auth.jwt_secret"),
        "auth.jwt_secret = \"<redacted>\"  # environment FLASHGATE__AUTH__JWT_SECRET"
    );
    assert_eq!(
        line_of(&run, "auth.admin_token"),
        format!("auth.admin_token = \"<redacted>\"  # file {given}")
    );
    assert_eq!(
        line_of(&run, "server.request_timeout_ms"),
        "server.request_timeout_ms = 10000  # default"
    );
    for secret in [
        "hunter2",
        "file-admin-token",
        "env-jwt-secret",
        "flashgate-dev-",
    ] {
        assert!(
            !run.stdout.contains(secret),
            "{secret} shown: {}",
            run.stdout
        );
    }
    // Every line is TOML: the output reads back as settings.
    let read_back: Settings = Figment::from(Toml::string(&run.stdout))
        .extract()
        .expect("the output is a configuration");
    assert_eq!(read_back.server.worker_threads, 3);
    assert_eq!(read_back.server.body_bytes_max, 65536);
}

#[test]
fn help_shows_the_environment_names() {
    let top = flashgate(&["--help"], &[]);
    assert_eq!(top.code, Some(0), "{}", top.stderr);
    assert!(
        top.stdout.contains("FLASHGATE__SECTION__KEY"),
        "{}",
        top.stdout
    );
    for (alias, key) in env::ALIASES {
        let line = top
            .stdout
            .lines()
            .find(|line| line.split_whitespace().next() == Some(alias))
            .unwrap_or_else(|| panic!("--help lacks {alias}: {}", top.stdout));
        assert!(
            line.contains(key) && line.contains(&env::canonical(key)),
            "{line}"
        );
    }

    let config = flashgate(&["config", "--help"], &[]);
    assert_eq!(config.code, Some(0), "{}", config.stderr);
    for key in explain::defaults().keys() {
        let line = config
            .stdout
            .lines()
            .find(|line| line.split_whitespace().next() == Some(key.as_str()))
            .unwrap_or_else(|| panic!("config --help lacks {key}: {}", config.stdout));
        assert!(line.contains(&env::canonical(key)), "{line}");
    }
}
