//! Start-up errors name their cause: the setting as the operator gave it, where it points
//! (never a password), and the underlying reason; each is printed once, and a
//! configuration that cannot work exits 64 before anything is dialled.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{
    TestDb, base_database_url, free_port, redis_url, unique_suffix, wait_for_port, with_database,
};

const STRONG: &str = "a-secret-of-its-own-0123456789abcdef";

/// Exit code of a configuration that cannot be used.
const EXIT_BAD_CONFIG: i32 = 64;

/// What one `flashgate` run printed, and how long it took.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Run {
    /// Runs `command` with nothing on its stdin, and keeps what it printed and how long it
    /// took.
    pub fn of(command: &mut Command) -> Run {
        let started = Instant::now();
        let output = command
            .stdin(Stdio::null())
            .output()
            .expect("run flashgate");
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            took: started.elapsed(),
        }
    }

    /// The lines of stderr that contain `needle`: a message printed once has one.
    pub fn lines_with(&self, needle: &str) -> usize {
        self.stderr.lines().filter(|l| l.contains(needle)).count()
    }

    /// Asserts the run failed with `code`, saying every one of `needles` on one line,
    /// printed once.
    pub fn assert_error(&self, code: i32, needles: &[&str]) {
        assert_eq!(self.code, Some(code), "exit code; stderr: {}", self.stderr);
        let line = self
            .stderr
            .lines()
            .find(|line| needles.iter().all(|n| line.contains(n)))
            .unwrap_or_else(|| panic!("no line says all of {needles:?}: {}", self.stderr));
        assert_eq!(
            self.stderr.lines().filter(|l| *l == line).count(),
            1,
            "printed more than once: {}",
            self.stderr
        );
        assert_eq!(
            self.lines_with(needles[0]),
            1,
            "{:?} said on more than one line: {}",
            needles[0],
            self.stderr
        );
        for rust in ["alloc::", "&str", "core::", "std::"] {
            assert!(
                !self.stderr.contains(rust),
                "Rust type names: {}",
                self.stderr
            );
        }
    }
}

/// Runs `flashgate args` with only `env` (and secrets of its own) set, logging at info so
/// that any log line repeating the error would show. A run that does not end within a
/// minute is stopped (`timeout` exits 124), so a command that should fail cannot hang.
pub fn flashgate(args: &[&str], env: &[(&str, &str)]) -> Run {
    flashgate_without(args, env, &[])
}

/// As [`flashgate`], with the variables `unset` left out of the environment.
pub fn flashgate_without(args: &[&str], env: &[(&str, &str)], unset: &[&str]) -> Run {
    let mut command = Command::new("timeout");
    command
        .args(["60", env!("CARGO_BIN_EXE_flashgate")])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("REDIS_URL", redis_url())
        .env(
            "FLASHGATE__REDIS__KEY_PREFIX",
            format!("fgtest:{}:", unique_suffix()),
        )
        .env("FLASHGATE_LISTEN", "127.0.0.1:0")
        .env("FLASHGATE_OPS_LISTEN", "127.0.0.1:0")
        .env("FLASHGATE_JWT_SECRET", STRONG)
        .env("FLASHGATE_ADMIN_TOKEN", STRONG)
        .env("FLASHGATE__WAITING_ROOM__PASS_SECRET", STRONG)
        .envs(env.iter().copied());
    for name in unset {
        command.env_remove(name);
    }
    Run::of(&mut command)
}

/// Every command that needs PostgreSQL.
const DATABASE_COMMANDS: [&[&str]; 5] = [
    &["serve"],
    &["migrate"],
    &["deals", "list"],
    &["check"],
    &["reconcile"],
];

/// With payments on, so `reconcile` gets as far as the database.
const PAYMENTS_ON: (&str, &str) = ("FLASHGATE__PAYMENTS__ENABLED", "true");

#[test]
fn a_wrong_port_names_the_setting_the_address_and_the_refusal() {
    let port = free_port();
    let url = format!("postgres://postgres:hunter2@127.0.0.1:{port}/test");
    for args in DATABASE_COMMANDS {
        let run = flashgate(
            args,
            &[
                ("DATABASE_URL", &url),
                PAYMENTS_ON,
                ("FLASHGATE__PAYMENTS__WEBHOOK_SECRET", STRONG),
                ("FLASHGATE__PAYMENTS__API_KEY", STRONG),
            ],
        );
        run.assert_error(
            1,
            &[
                "DATABASE_URL",
                &format!("postgres://postgres:<redacted>@127.0.0.1:{port}/test"),
                "refused",
                "scripts/services.sh",
            ],
        );
        assert!(!run.stderr.contains("hunter2"), "{args:?}: {}", run.stderr);
        assert!(
            run.took < Duration::from_secs(4),
            "{args:?} took {:?}, as long as a pool timeout",
            run.took
        );
    }
}

#[test]
fn another_databases_url_is_refused_at_once() {
    for args in DATABASE_COMMANDS {
        let run = flashgate(args, &[("DATABASE_URL", "mysql://x"), PAYMENTS_ON]);
        run.assert_error(
            EXIT_BAD_CONFIG,
            &["DATABASE_URL", "mysql://x", "postgres://"],
        );
        assert!(
            run.took < Duration::from_secs(2),
            "{args:?}: {:?}",
            run.took
        );
    }
}

#[test]
fn an_empty_database_url_is_refused_naming_it() {
    for args in [&["serve"][..], &["migrate"], &["deals", "list"]] {
        let run = flashgate(args, &[("DATABASE_URL", "")]);
        run.assert_error(EXIT_BAD_CONFIG, &["DATABASE_URL is empty", "postgres://"]);
    }
}

#[test]
fn a_missing_database_is_named_with_postgresqls_reason() {
    let name = format!("nosuchdb_{}", unique_suffix());
    let url = with_database(&base_database_url(), &name);
    for args in [&["serve"][..], &["migrate"], &["deals", "list"], &["check"]] {
        let run = flashgate(args, &[("DATABASE_URL", &url)]);
        run.assert_error(
            1,
            &[
                "DATABASE_URL",
                &format!("/{name}"),
                &format!("database \"{name}\" does not exist"),
                "create it first: createdb -h",
            ],
        );
        assert!(!run.stderr.contains(" at line "), "{}", run.stderr);
    }
}

#[test]
fn a_listen_address_that_is_no_address_names_the_variable() {
    let run = flashgate(&["serve"], &[("FLASHGATE_LISTEN", "localhost:notaport")]);
    run.assert_error(
        EXIT_BAD_CONFIG,
        &["FLASHGATE_LISTEN", "localhost:notaport", "host:port"],
    );

    let run = flashgate(&["serve"], &[("FLASHGATE_OPS_LISTEN", "8081")]);
    run.assert_error(EXIT_BAD_CONFIG, &["FLASHGATE_OPS_LISTEN", "no port"]);
}

#[test]
fn config_errors_name_the_setting_in_words() {
    let run = flashgate(
        &["migrate"],
        &[("FLASHGATE__SERVER__BODY_BYTES_MAX", "lots")],
    );
    run.assert_error(
        EXIT_BAD_CONFIG,
        &[
            "FLASHGATE__SERVER__BODY_BYTES_MAX",
            "expected a whole number",
        ],
    );
    assert!(!run.stderr.contains("usize"), "{}", run.stderr);

    let dir = std::env::temp_dir().join(format!("fgtest-config-{}", unique_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(&file, "[server]\nconnections_max = \"many\"\n").unwrap();
    let run = flashgate(&["serve", "--config", file.to_str().unwrap()], &[]);
    run.assert_error(
        EXIT_BAD_CONFIG,
        &[
            &format!("server.connections_max in {}", file.display()),
            "expected a whole number",
        ],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_config_directory_is_called_a_directory() {
    let dir = std::env::temp_dir();
    let run = flashgate(&["migrate", "--config", dir.to_str().unwrap()], &[]);
    run.assert_error(EXIT_BAD_CONFIG, &["--config", "is a directory"]);

    let missing = dir.join(format!("fgtest-missing-{}.toml", unique_suffix()));
    let run = flashgate(&["migrate", "--config", missing.to_str().unwrap()], &[]);
    run.assert_error(EXIT_BAD_CONFIG, &["--config", "does not exist"]);
}

#[test]
fn serve_names_every_secret_left_at_its_default() {
    let run = flashgate(
        &["serve"],
        &[
            ("FLASHGATE_JWT_SECRET", "flashgate-dev-secret-change-me"),
            ("FLASHGATE__WAITING_ROOM__PASS_SECRET", "short-but-16-bytes"),
        ],
    );
    run.assert_error(
        EXIT_BAD_CONFIG,
        &[
            "auth.jwt_secret, set by FLASHGATE_JWT_SECRET,",
            "is left at its public development default",
        ],
    );
    run.assert_error(
        EXIT_BAD_CONFIG,
        &[
            "waiting_room.pass_secret, set by FLASHGATE__WAITING_ROOM__PASS_SECRET,",
            "is 18 bytes long",
        ],
    );
    assert!(!run.stderr.contains("auth.admin_token"), "{}", run.stderr);
}

/// The secrets every run of [`flashgate`] is given, to take away.
const SECRET_VARIABLES: [&str; 3] = [
    "FLASHGATE_JWT_SECRET",
    "FLASHGATE_ADMIN_TOKEN",
    "FLASHGATE__WAITING_ROOM__PASS_SECRET",
];

#[test]
fn a_weak_secret_is_named_by_the_variable_that_set_it() {
    let run = flashgate_without(
        &["serve"],
        &[("FLASHGATE__AUTH__JWT_SECRET", "short")],
        &["FLASHGATE_JWT_SECRET"],
    );
    run.assert_error(
        EXIT_BAD_CONFIG,
        &[
            "auth.jwt_secret, set by FLASHGATE__AUTH__JWT_SECRET,",
            "is 5 bytes long",
        ],
    );
    assert!(
        !run.stderr.contains("FLASHGATE_JWT_SECRET"),
        "names a variable that was not used: {}",
        run.stderr
    );
}

#[test]
fn every_secret_left_at_its_default_has_a_line_of_its_own() {
    let run = flashgate_without(&["serve"], &[], &SECRET_VARIABLES);
    for (key, variables) in [
        (
            "auth.jwt_secret",
            "FLASHGATE__AUTH__JWT_SECRET or FLASHGATE_JWT_SECRET",
        ),
        (
            "auth.admin_token",
            "FLASHGATE__AUTH__ADMIN_TOKEN or FLASHGATE_ADMIN_TOKEN",
        ),
        (
            "waiting_room.pass_secret",
            "FLASHGATE__WAITING_ROOM__PASS_SECRET",
        ),
    ] {
        run.assert_error(
            EXIT_BAD_CONFIG,
            &[
                &format!("{key} is left at its public development default"),
                &format!("set {variables}, or {key} in the --config file"),
            ],
        );
    }
    let longest = run.stderr.lines().map(str::len).max().unwrap_or_default();
    assert!(
        longest < 200,
        "a line of {longest} characters: {}",
        run.stderr
    );
}

#[test]
fn a_config_file_that_is_not_toml_is_named_by_its_path_as_given() {
    let dir = std::env::temp_dir().join(format!("fgtest-toml-{}", unique_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broken.toml");
    std::fs::write(&file, "[server]\nlisten = \n").unwrap();
    let given = file.to_str().unwrap();

    let run = flashgate(&["migrate", "--config", given], &[]);

    run.assert_error(
        EXIT_BAD_CONFIG,
        &[&format!("--config {given}: "), "TOML parse error"],
    );
    assert!(!run.stderr.contains("../"), "{}", run.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_host_name_is_accepted_as_the_listen_address() {
    // Arrange: a migrated database of the test's own.
    let database = TestDb::create().await;
    let migrated = flashgate(&["migrate"], &[("DATABASE_URL", &database.url)]);
    assert_eq!(migrated.code, Some(0), "{}", migrated.stderr);
    let port = free_port();

    // Act
    let mut child = crate::helpers::ChildGuard {
        child: Command::new(env!("CARGO_BIN_EXE_flashgate"))
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", &database.url)
            .env("REDIS_URL", redis_url())
            .env("FLASHGATE_LISTEN", format!("localhost:{port}"))
            .env("FLASHGATE_OPS_LISTEN", "127.0.0.1:0")
            .env("FLASHGATE_JWT_SECRET", STRONG)
            .env("FLASHGATE_ADMIN_TOKEN", STRONG)
            .env("FLASHGATE__WAITING_ROOM__PASS_SECRET", STRONG)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start flashgate serve"),
    };

    // Assert: localhost resolves to loopback, IPv4 first.
    let listening = wait_for_port(port, Duration::from_secs(30)).await;
    let exited = child.child.try_wait().unwrap();
    child.kill();
    database.drop_database().await;
    assert!(
        listening,
        "nothing listens on 127.0.0.1:{port} (exited: {exited:?})"
    );
}

/// Starts `redis-server` without persistence on `port`.
fn redis_on(port: u16) -> crate::helpers::ChildGuard {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server (is it on PATH?)");
    crate::helpers::ChildGuard { child }
}

/// The lines a child writes to stderr, collected as they come.
fn collect_lines(
    stderr: std::process::ChildStderr,
) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use std::io::BufRead;
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if crate::helpers::test_log() {
                eprintln!("{line}");
            }
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

#[tokio::test]
async fn losing_and_regaining_redis_is_logged_once_each_time() {
    // Arrange: a gateway whose private Redis is not running yet.
    let database = TestDb::create().await;
    let migrated = flashgate(&["migrate"], &[("DATABASE_URL", &database.url)]);
    assert_eq!(migrated.code, Some(0), "{}", migrated.stderr);
    let redis_port = free_port();
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_flashgate"))
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("DATABASE_URL", &database.url)
        .env("REDIS_URL", format!("redis://127.0.0.1:{redis_port}"))
        .env("FLASHGATE__REDIS__RECONNECT_INTERVAL_MS", "100")
        .env("FLASHGATE__REDIS__OUTAGE_LOG_INTERVAL_MS", "1000")
        .env("FLASHGATE_LISTEN", "127.0.0.1:0")
        .env("FLASHGATE_OPS_LISTEN", "127.0.0.1:0")
        .env("FLASHGATE_JWT_SECRET", STRONG)
        .env("FLASHGATE_ADMIN_TOKEN", STRONG)
        .env("FLASHGATE__WAITING_ROOM__PASS_SECRET", STRONG)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start flashgate serve");
    let lines = collect_lines(gateway.stderr.take().unwrap());
    let gateway = crate::helpers::ChildGuard { child: gateway };
    let count = |needle: &str| {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    };
    let wait_for = |needle: &'static str, times: usize| {
        let count = &count;
        async move {
            crate::helpers::eventually(Duration::from_secs(20), || async move {
                (count(needle) >= times).then_some(())
            })
            .await
            .is_some()
        }
    };
    const LOST: &str = "redis unreachable";
    const BACK: &str = "redis reachable again";

    // Act and assert: unreachable at start, then up, down, up again. Reconnecting every
    // 100 ms, each outage fails many attempts and calls; the log says each change once
    // (the second outage begins more than the 1 s log interval after the first warning).
    assert!(wait_for(LOST, 1).await, "{:#?}", lines.lock().unwrap());
    let mut redis = redis_on(redis_port);
    assert!(wait_for(BACK, 1).await, "{:#?}", lines.lock().unwrap());
    // The log interval runs on the gateway process's real clock (its subject here): the
    // second outage must begin after it.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    redis.kill();
    assert!(wait_for(LOST, 2).await, "{:#?}", lines.lock().unwrap());
    let redis = redis_on(redis_port);
    assert!(wait_for(BACK, 2).await, "{:#?}", lines.lock().unwrap());
    // No further line is logged.
    let settled = || async { count(LOST) == 2 && count(BACK) == 2 };
    crate::helpers::holds_for("two of each line", Duration::from_millis(500), settled).await;

    let log = lines.lock().unwrap().clone();
    assert_eq!(count(LOST), 2, "{log:#?}");
    assert_eq!(count(BACK), 2, "{log:#?}");
    // Reminders come at most once a second, only while an outage lasts that long.
    assert!(count("redis still unreachable") <= 4, "{log:#?}");
    let warning = log.iter().find(|l| l.contains(LOST)).unwrap();
    assert!(
        warning.contains("WARN") && warning.contains(&format!("127.0.0.1:{redis_port}")),
        "{warning}"
    );
    drop((gateway, redis));
    database.drop_database().await;
}

#[test]
fn a_port_in_use_names_the_listener_and_its_setting_before_anything_is_dialled() {
    // Arrange: both ports taken, and PostgreSQL and Redis where nothing answers, so an
    // error about them would show that they were dialled first.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let nowhere = format!("postgres://postgres@127.0.0.1:{}/test", free_port());
    let no_redis = format!("redis://127.0.0.1:{}", free_port());
    let cases = [
        (
            "FLASHGATE_LISTEN",
            "public listener",
            "server.listen",
            "FLASHGATE__SERVER__LISTEN",
        ),
        (
            "FLASHGATE_OPS_LISTEN",
            "operations listener",
            "server.ops_listen",
            "FLASHGATE__SERVER__OPS_LISTEN",
        ),
    ];
    for (variable, listener, setting, canonical) in cases {
        // Act
        let run = flashgate(
            &["serve"],
            &[
                (variable, &format!("127.0.0.1:{port}")),
                ("DATABASE_URL", &nowhere),
                ("REDIS_URL", &no_redis),
            ],
        );

        // Assert
        run.assert_error(
            1,
            &[
                &format!("cannot listen on 127.0.0.1:{port}"),
                listener,
                setting,
                canonical,
                variable,
                "Address already in use",
            ],
        );
        assert!(!run.stderr.contains("PostgreSQL"), "{}", run.stderr);
        assert!(!run.stderr.contains("redis"), "{}", run.stderr);
    }
    drop(taken);
}
