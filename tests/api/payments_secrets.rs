//! `serve` refuses to start with a secret anyone can know: a development default, or one
//! shorter than 32 bytes. The error names the setting and how to set it; `demo` still runs.

use std::process::{Command, Stdio};

const STRONG: &str = "a-secret-of-its-own-0123456789abcdef";

/// Runs `flashgate serve` with only `env` set; returns its exit code and stderr. It must
/// exit on its own, before binding anything.
fn serve_with(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flashgate"))
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FLASHGATE_LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run flashgate serve");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn serve_refuses_default_secrets_naming_the_setting() {
    let (code, stderr) = serve_with(&[]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("auth.jwt_secret") && stderr.contains("FLASHGATE_JWT_SECRET"),
        "{stderr}"
    );

    let (code, stderr) = serve_with(&[
        ("FLASHGATE_JWT_SECRET", STRONG),
        ("FLASHGATE_ADMIN_TOKEN", STRONG),
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("waiting_room.pass_secret")
            && stderr.contains("FLASHGATE__WAITING_ROOM__PASS_SECRET"),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_short_secrets() {
    let (code, stderr) = serve_with(&[
        ("FLASHGATE_JWT_SECRET", "x"),
        ("FLASHGATE_ADMIN_TOKEN", STRONG),
        ("FLASHGATE__WAITING_ROOM__PASS_SECRET", STRONG),
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("auth.jwt_secret, set by FLASHGATE_JWT_SECRET, is 1 bytes long"),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_default_provider_secrets_when_payments_are_enabled() {
    let base = [
        ("FLASHGATE_JWT_SECRET", STRONG),
        ("FLASHGATE_ADMIN_TOKEN", STRONG),
        ("FLASHGATE__WAITING_ROOM__PASS_SECRET", STRONG),
        ("FLASHGATE__PAYMENTS__ENABLED", "true"),
    ];
    let (code, stderr) = serve_with(&base);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("payments.webhook_secret")
            && stderr.contains("FLASHGATE__PAYMENTS__WEBHOOK_SECRET"),
        "{stderr}"
    );
    let mut env = base.to_vec();
    env.push(("FLASHGATE__PAYMENTS__WEBHOOK_SECRET", STRONG));
    let (code, stderr) = serve_with(&env);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("payments.api_key") && stderr.contains("FLASHGATE__PAYMENTS__API_KEY"),
        "{stderr}"
    );
}
