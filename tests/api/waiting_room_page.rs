//! The waiting page in a real headless browser (Debian's chromium, driven over chromedriver's
//! WebDriver HTTP API) through a crowd's sale: the page shows the buyer's place, then the
//! admission, and hands the pass to the deal's checkout URL. A screenshot of each state is
//! kept in `target/artefacts/`. Needs `scripts/browser.sh` (run by `scripts/test.sh`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::helpers::{ChildGuard, TestApp, free_port, spawn_app_with, wait_for_port};
use crate::waiting_room::{join, order_with_pass, poll, room_deal};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One browser session over WebDriver.
struct Browser {
    _driver: ChildGuard,
    _profile: TempDir,
    client: reqwest::Client,
    session: String,
}

/// A fresh, empty profile directory, removed at the end.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    async fn start() -> Browser {
        assert!(
            std::path::Path::new(CHROMIUM).exists() && std::path::Path::new(CHROMEDRIVER).exists(),
            "chromium and chromedriver are missing: run scripts/browser.sh"
        );
        let port = free_port();
        let child = std::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = ChildGuard { child };
        assert!(
            wait_for_port(port, Duration::from_secs(30)).await,
            "chromedriver listens"
        );
        let profile = TempDir(std::env::temp_dir().join(format!(
            "flashgate-chromium-{}",
            crate::helpers::unique_suffix()
        )));
        std::fs::create_dir_all(&profile.0).unwrap();
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=800,640",
        ]
        .map(String::from)
        .into_iter()
        .chain([format!("--user-data-dir={}", profile.0.display())])
        .collect::<Vec<_>>();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let client = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let reply: Value = client
            .post(format!("{base}/session"))
            .json(&capabilities)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("a session")
            .json()
            .await
            .unwrap();
        let session = reply["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {reply}"));
        Browser {
            _driver: driver,
            _profile: profile,
            client,
            session: format!("{base}/session/{session}"),
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let request = self
            .client
            .request(method, format!("{}{path}", self.session))
            .timeout(Duration::from_secs(30));
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let reply: Value = request.send().await.unwrap().json().await.unwrap();
        reply["value"].clone()
    }

    async fn open(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", json!({"url": url}))
            .await;
    }

    /// The page's machine-readable state, its announced text and its address.
    async fn read(&self) -> (String, String, String) {
        let script = "return [document.body.dataset.state || '', \
                      (document.getElementById('state') || {}).textContent || '', location.href]";
        let value = self
            .command(
                reqwest::Method::POST,
                "/execute/sync",
                json!({"script": script, "args": []}),
            )
            .await;
        let text = |i: usize| value[i].as_str().unwrap_or_default().to_owned();
        (text(0), text(1), text(2))
    }

    async fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(&str, &str) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let (state, text, href) = self.read().await;
            if done(&state, &href) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "never {what}: {state} {text} {href}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self
            .command(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let png = STANDARD
            .decode(png.as_str().expect("a screenshot"))
            .unwrap();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/artefacts");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }

    async fn quit(self) {
        self.command(reqwest::Method::DELETE, "", Value::Null).await;
    }
}

/// A crowd member: polls and buys when admitted, until `stop`.
async fn crowd_member(app: Arc<TestApp>, user: String, deal: String, stop: Arc<AtomicBool>) {
    let ticket = join(&app, &user, &deal).await.expect(201)["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    while !stop.load(Ordering::SeqCst) {
        let body = poll(&app, &user, &deal, &ticket).await.json();
        if body["state"] == "admitted" {
            order_with_pass(&app, &user, &deal, body["pass"].as_str())
                .await
                .expect(201);
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_waiting_page_shows_the_place_then_the_admission_and_hands_over_the_pass() {
    // Arrange: one admission a second; six buyers ahead of ours, more behind.
    let app = Arc::new(
        spawn_app_with(|s| {
            crate::waiting_room_edge::fast_room(s);
            s.waiting_room.refresh_after_seconds_max = 1;
            s.waiting_room.page_title = "Summer sale — waiting room".into();
        })
        .await,
    );
    let checkout = app.url("/healthz");
    let room = json!({"admit_per_second": 1, "max_active": 2, "pass_ttl_seconds": 60,
                      "checkout_url": checkout});
    let deal = app
        .given_deal(&room_deal("wrpage", 30, room, json!({})))
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut crowd = Vec::new();
    for i in 0..6 {
        let member = crowd_member(app.clone(), format!("a{i}"), deal.clone(), stop.clone());
        crowd.push(tokio::spawn(member));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let page = app.get(&format!("/wait/{deal}")).await;
    assert_eq!(page.status, 200);
    assert!(
        page.header("cache-control")
            .is_some_and(|c| c.starts_with("public"))
    );
    assert!(page.text.contains("aria-live=\"polite\""));
    let browser = Browser::start().await;

    // Act: the buyer opens the page the shop links to, the token in the fragment.
    let token = app.token("page-buyer");
    browser
        .open(&app.url(&format!("/wait/{deal}#token={token}")))
        .await;
    for i in 0..6 {
        let member = crowd_member(app.clone(), format!("z{i}"), deal.clone(), stop.clone());
        crowd.push(tokio::spawn(member));
    }

    // Assert: first the place in line, then the admission, then the checkout with the pass.
    let minute = Duration::from_secs(60);
    browser
        .wait_for("waiting", minute, |state, _| state == "waiting")
        .await;
    let (_, waiting_text, _) = browser.read().await;
    assert!(waiting_text.contains("ahead of you"), "{waiting_text}");
    let waiting_png = browser.screenshot("wait-page-waiting.png").await;
    browser
        .wait_for("admitted", minute, |state, _| state == "admitted")
        .await;
    let admitted_png = browser.screenshot("wait-page-admitted.png").await;
    let (_, admitted_text, _) = browser.read().await;
    assert!(admitted_text.contains("your turn"), "{admitted_text}");
    browser
        .wait_for("at checkout", minute, |_, href| href.starts_with(&checkout))
        .await;
    let (_, _, href) = browser.read().await;
    let pass = href
        .split_once("#pass=")
        .map(|(_, p)| p.to_owned())
        .expect("pass");
    let pass = pass.replace("%2E", ".");
    order_with_pass(&app, "page-buyer", &deal, Some(&pass))
        .await
        .expect(201);
    eprintln!(
        "screenshots: {} and {}",
        waiting_png.display(),
        admitted_png.display()
    );
    browser.quit().await;
    stop.store(true, Ordering::SeqCst);
    for member in crowd {
        member.await.unwrap();
    }
    Arc::into_inner(app)
        .expect("all tasks done")
        .cleanup()
        .await;
}
