//! The events receiver (`scripts/events_receiver.py`) as a child process: it verifies every
//! delivery with the Standard Webhooks reference library and tells the tests what arrived.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::{crate_root, free_port, http_client};

/// A running receiver on a port of its own, which a restart keeps, as it keeps the log of
/// what arrived.
pub struct Receiver {
    pub port: u16,
    log: std::path::PathBuf,
    child: Option<Child>,
    client: reqwest::Client,
}

impl Receiver {
    /// Starts a receiver verifying with `secrets`.
    pub async fn start(secrets: &[&str]) -> Receiver {
        let port = free_port();
        let log = std::env::temp_dir().join(format!(
            "flashgate-receiver-{port}-{}.jsonl",
            super::unique_suffix()
        ));
        let mut receiver = Receiver {
            port,
            log,
            child: None,
            client: http_client(),
        };
        receiver.restart(secrets).await;
        receiver
    }

    /// Starts it again on the same port (after [`Receiver::stop`]).
    pub async fn restart(&mut self, secrets: &[&str]) {
        let mut command = Command::new("python3");
        command
            .arg(crate_root().join("scripts/events_receiver.py"))
            .args(["--port", &self.port.to_string()])
            .arg("--log")
            .arg(&self.log)
            .stdout(Stdio::piped());
        for secret in secrets {
            command.args(["--secret", secret]);
        }
        let mut child = command
            .spawn()
            .expect("python3 runs scripts/events_receiver.py");
        let stdout = child.stdout.take().expect("the receiver's stdout");
        let read = tokio::task::spawn_blocking(move || {
            let mut first = String::new();
            BufReader::new(stdout).read_line(&mut first).map(|_| first)
        });
        let first = tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("the receiver starts within 20 s (is standardwebhooks installed? scripts/services.sh)")
            .expect("the reading task")
            .expect("the receiver's first line");
        assert_eq!(first.trim(), format!("listening {}", self.port));
        self.child = Some(child);
    }

    /// Kills it: its port is closed until a restart.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        }
    }

    /// Where the gateway sends events.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks", self.port)
    }

    /// Sets the receiver's behaviour: `{"mode": "ok" | "fail" | "hang", "secrets": [...]}`.
    pub async fn control(&self, settings: Value) {
        let url = format!("http://127.0.0.1:{}/control", self.port);
        let answer = self
            .client
            .post(url)
            .json(&settings)
            .send()
            .await
            .expect("control");
        assert_eq!(answer.status(), 204);
    }

    /// Every delivery so far, in arrival order, across restarts.
    pub async fn received(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The `webhook-id` of every delivery answered 500 so far (since its last start).
    pub async fn refused(&self) -> Vec<String> {
        let url = format!("http://127.0.0.1:{}/refused", self.port);
        let answer = self.client.get(url).send().await.expect("refused");
        answer.json().await.expect("a JSON array of ids")
    }

    /// Answers 500 to everything from now on.
    pub async fn fail(&self) {
        self.control(json!({"mode": "fail"})).await;
    }

    /// Answers normally again.
    pub async fn heal(&self) {
        self.control(json!({"mode": "ok"})).await;
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// How many different `webhook-id`s arrived.
pub fn distinct_ids(received: &[Value]) -> usize {
    received
        .iter()
        .filter_map(|r| r["webhook_id"].as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}
