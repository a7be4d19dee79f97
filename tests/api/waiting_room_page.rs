//! The waiting page in a real headless browser (Debian's chromium, driven over chromedriver's
//! WebDriver HTTP API): through a crowd's sale the page shows the buyer's place and a
//! progress bar that screen readers read as it grows, then the admission, and hands the
//! pass to the deal's checkout URL; for a deal without a checkout URL it shows the pass and
//! the order API, counts down to the pass's expiry, says when it has expired and joins the
//! line again on request. A screenshot of each state is kept in `target/artefacts/`. Needs
//! `scripts/browser.sh` (run by `scripts/test.sh`).

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::helpers::{ChildGuard, TestApp, free_port, spawn_app_with, wait_for_port, wait_until};
use crate::waiting_room::{join, order_with_pass, poll, room_deal};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One browser session over WebDriver.
pub(crate) struct Browser {
    _driver: ChildGuard,
    _profile: TempDir,
    client: reqwest::Client,
    session: String,
}

/// The page's progress bar as a screen reader sees it.
#[derive(Debug)]
struct Progress {
    state: String,
    shown: bool,
    now: u64,
    min: String,
    max: String,
    text: String,
    name: String,
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
        Browser::start_speaking(None).await
    }

    /// A browser whose requests say `Accept-Language: accept` (its own default without).
    pub(crate) async fn start_speaking(accept: Option<&str>) -> Browser {
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
        .chain(accept.map(|a| format!("--accept-lang={a}")))
        .collect::<Vec<_>>();
        let prefs = accept.map_or(json!({}), |a| json!({"intl.accept_languages": a}));
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args, "prefs": prefs},
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

    pub(crate) async fn open(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", json!({"url": url}))
            .await;
    }

    /// Runs `script` in the page and returns what it returns.
    pub(crate) async fn eval(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Clicks the element `css` selects, as a person would (WebDriver's element click).
    async fn click(&self, css: &str) {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        let id = found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_owned();
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            json!({}),
        )
        .await;
    }

    /// The page's machine-readable state, its announced text and its address. On a page
    /// that is not the waiting page (an error the browser was shown instead), the text is
    /// the start of what it shows, so a failed wait says what the buyer saw.
    async fn read(&self) -> (String, String, String) {
        let script = "return [document.body.dataset.state || '', \
                      ((document.getElementById('state') || document.body || {}).textContent || '') \
                      .slice(0, 300), location.href]";
        let value = self.eval(script).await;
        let text = |i: usize| value[i].as_str().unwrap_or_default().to_owned();
        (text(0), text(1), text(2))
    }

    pub(crate) async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&str, &str) -> bool,
    ) {
        wait_until(what, timeout, || async {
            let (state, text, href) = self.read().await;
            if done(&state, &href) {
                Ok(())
            } else {
                Err(format!("{state} {text} {href}"))
            }
        })
        .await
    }

    /// The progress bar as assistive technology reads it, with the page's state.
    async fn progress(&self) -> Progress {
        let script = "const b = document.querySelector('[role=progressbar]'); \
            const name = (b.getAttribute('aria-labelledby') || '').split(' ') \
              .map((id) => (document.getElementById(id) || {}).textContent || '').join(' '); \
            return {state: document.body.dataset.state || '', shown: b.closest('[hidden]') === null, \
              now: b.getAttribute('aria-valuenow'), min: b.getAttribute('aria-valuemin'), \
              max: b.getAttribute('aria-valuemax'), text: b.getAttribute('aria-valuetext') || '', name}";
        let value = self.eval(script).await;
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
        Progress {
            state: text("state"),
            shown: value["shown"] == true,
            now: text("now")
                .parse()
                .unwrap_or_else(|_| panic!("aria-valuenow: {value}")),
            min: text("min"),
            max: text("max"),
            text: text("text"),
            name: text("name"),
        }
    }

    /// The page's requests to the line so far (Resource Timing): the public state read
    /// (`…/queue?behind=…`, the join's POST to `…/queue` counted among them) and the
    /// ticket's own polls.
    pub(crate) async fn line_requests(&self) -> (u64, u64) {
        let script = "const names = performance.getEntriesByType('resource').map(e => e.name); \
            return [names.filter(n => /\\/queue(\\?behind=\\d+)?$/.test(n)).length, \
                    names.filter(n => /\\/queue\\/[0-9a-f]+$/.test(n)).length];";
        let counts = self.eval(script).await;
        (
            counts[0].as_u64().unwrap_or(0),
            counts[1].as_u64().unwrap_or(0),
        )
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

    pub(crate) async fn quit(self) {
        self.command(reqwest::Method::DELETE, "", Value::Null).await;
    }
}

/// Whether `text` opens with the percentage `now` as the page's language writes it (`45%`,
/// `45 %` with a no-break space).
fn opens_with_percent(text: &str, now: u64) -> bool {
    text.strip_prefix(&now.to_string())
        .map(|rest| rest.trim_start_matches(['\u{a0}', '\u{202f}', ' ']))
        .is_some_and(|rest| rest.starts_with('%'))
}

/// Reads the progress bar until the buyer is admitted; checks it reads as a percentage
/// labelled with `label` that only grows while waiting, grows at least once, and is full at
/// the turn.
async fn progress_until_admitted(browser: &Browser, label: &str, timeout: Duration) -> Vec<u64> {
    let readings: RefCell<Vec<u64>> = RefCell::default();
    wait_until("admitted", timeout, || async {
        let bar = browser.progress().await;
        assert!(bar.shown, "{bar:?}");
        assert_eq!(
            (bar.min.as_str(), bar.max.as_str()),
            ("0", "100"),
            "{bar:?}"
        );
        assert!(bar.name.contains(label), "{bar:?}");
        assert!(opens_with_percent(&bar.text, bar.now), "{bar:?}");
        if bar.state == "admitted" {
            assert_eq!(bar.now, 100, "{bar:?}");
            return Ok(());
        }
        assert!(bar.now < 100, "{bar:?}");
        let mut readings = readings.borrow_mut();
        if readings.last() != Some(&bar.now) {
            assert!(
                readings.last() < Some(&bar.now),
                "{readings:?} then {bar:?}"
            );
            readings.push(bar.now);
        }
        Err(format!("{bar:?}"))
    })
    .await;
    let readings = readings.into_inner();
    assert!(
        readings.len() >= 2,
        "the bar moved while waiting: {readings:?}"
    );
    readings
}

/// A place in line for `user`.
async fn ticket(app: &TestApp, user: &str, deal: &str) -> String {
    join(app, user, deal).await.expect(201)["ticket"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A crowd member in line with `ticket`: polls and buys when admitted, until `stop`.
async fn crowd_member(
    app: Arc<TestApp>,
    user: String,
    deal: String,
    ticket: String,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        let body = poll(&app, &user, &deal, &ticket).await.json();
        if body["state"] == "admitted" {
            order_with_pass(&app, &user, &deal, body["pass"].as_str())
                .await
                .expect(201);
            return;
        }
        // A buyer's own pace between polls: the crowd's load is part of the sale.
        crate::helpers::pace(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_waiting_page_shows_the_place_then_the_admission_and_hands_over_the_pass_in_german() {
    // Arrange: one admission a second and a check-in window of five seconds (five tickets);
    // twenty-five buyers ahead of ours, more behind. The line moves from the first ticket
    // on, so the page is far from the front for about twenty seconds, whatever its start
    // and the buyers' tickets take on a busy machine.
    let app = Arc::new(
        spawn_app_with(|s| {
            crate::waiting_room_edge::fast_room(s);
            s.waiting_room.refresh_after_seconds_max = 1;
            s.waiting_room.checkin_window_seconds = 5;
            s.waiting_room.page_title = "Summer sale — waiting room".into();
        })
        .await,
    );
    let checkout = app.url("/healthz");
    let room = json!({"admit_per_second": 1, "max_active": 2, "pass_ttl_seconds": 60,
                      "checkout_url": checkout});
    let deal = app
        .given_deal(&room_deal("wrpage", 40, room, json!({})))
        .await;
    let page = app.get(&format!("/wait/{deal}")).await;
    assert_eq!(page.status, 200);
    assert!(
        page.header("cache-control")
            .is_some_and(|c| c.starts_with("public"))
    );
    assert!(page.text.contains("aria-live=\"polite\""));
    assert_eq!(page.header("vary"), Some("Accept-Language"));
    // The browser starts before the buyers ahead join: on a busy machine its start can take
    // longer than their turns, and the buyer would find nobody ahead. It asks for German.
    let browser = Browser::start_speaking(Some("de-DE,de;q=0.9,en;q=0.5")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut crowd = Vec::new();
    for i in 0..25 {
        let user = format!("a{i}");
        let ticket = ticket(&app, &user, &deal).await;
        let member = crowd_member(app.clone(), user, deal.clone(), ticket, stop.clone());
        crowd.push(tokio::spawn(member));
    }

    // Act: the buyer opens the page the shop links to, the token in the fragment.
    let token = app.token("page-buyer");
    browser
        .open(&app.url(&format!("/wait/{deal}#token={token}")))
        .await;
    for i in 0..6 {
        let (app, deal, stop) = (app.clone(), deal.clone(), stop.clone());
        crowd.push(tokio::spawn(async move {
            let user = format!("z{i}");
            let ticket = ticket(&app, &user, &deal).await;
            crowd_member(app, user, deal, ticket, stop).await;
        }));
    }

    // Assert: first the place in line, then the admission, then the checkout with the pass.
    let minute = Duration::from_secs(60);
    browser
        .wait_for("waiting", minute, |state, _| state == "waiting")
        .await;
    let (_, waiting_text, _) = browser.read().await;
    assert!(waiting_text.contains("vor Ihnen"), "{waiting_text}");
    assert_eq!(
        browser.eval("return document.documentElement.lang").await,
        "de"
    );
    // Far from the front the page follows the public state and leaves its ticket alone.
    wait_until("two reads of the public state", minute, || async {
        let (public, _) = browser.line_requests().await;
        match public >= 3 {
            true => Ok(()),
            false => Err(format!("{public} requests to the public state")),
        }
    })
    .await;
    let (_, personal_far) = browser.line_requests().await;
    assert_eq!(personal_far, 0, "no ticket poll while far from the front");
    let waiting_png = browser.screenshot("wait-page-waiting.png").await;
    let readings = progress_until_admitted(&browser, "Fortschritt", minute).await;
    let admitted_png = browser.screenshot("wait-page-admitted.png").await;
    let (_, admitted_text, _) = browser.read().await;
    assert!(admitted_text.contains("an der Reihe"), "{admitted_text}");
    let (_, personal_near) = browser.line_requests().await;
    assert!(personal_near >= 1, "checked in near the front");
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
        "screenshots: {} and {}; progress while waiting: {readings:?} %",
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

/// What the admitted page without a checkout URL shows: the countdown, the order
/// instructions, the pass, and whether a checkout link or the join button is visible.
async fn admitted_view(browser: &Browser) -> Value {
    let script = "const shown = (id) => document.getElementById(id).closest('[hidden]') === null; \
        const text = (id) => document.getElementById(id).textContent; \
        return {state: document.body.dataset.state || '', countdown: text('countdown'), \
          countdown_shown: shown('countdown'), api: text('api'), api_shown: shown('api'), \
          pass: text('pass'), checkout_shown: shown('next'), rejoin_shown: shown('rejoin')}";
    browser.eval(script).await
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_checkout_url_the_page_shows_the_order_api_counts_down_and_rejoins_after_expiry()
{
    // Arrange: a deal without a checkout URL whose passes last five seconds (a pass carries
    // whole seconds, so it works for four to five).
    let app = spawn_app_with(crate::waiting_room_edge::fast_room).await;
    let room = json!({"admit_per_second": 100, "max_active": 10, "pass_ttl_seconds": 5});
    let deal = app
        .given_deal(&room_deal("wrnocheckout", 10, room, json!({})))
        .await;
    let browser = Browser::start().await;
    let minute = Duration::from_secs(60);

    // Act: the buyer opens the page and is admitted at once, then lets the pass run out.
    let token = app.token("late-buyer");
    browser
        .open(&app.url(&format!("/wait/{deal}#token={token}")))
        .await;
    browser
        .wait_for("admitted", minute, |state, _| state == "admitted")
        .await;
    let admitted = admitted_view(&browser).await;
    let admitted_png = browser.screenshot("wait-page-no-checkout.png").await;
    let countdowns = RefCell::new(Vec::new());
    let expired = wait_until("the pass to run out", minute, || async {
        let view = admitted_view(&browser).await;
        if view["state"] != "admitted" {
            return Ok(view);
        }
        let text = view["countdown"].as_str().unwrap_or_default().to_owned();
        let mut countdowns = countdowns.borrow_mut();
        if countdowns.last() != Some(&text) {
            countdowns.push(text);
        }
        Err(view)
    })
    .await;
    let countdowns = countdowns.into_inner();
    let expired_png = browser.screenshot("wait-page-expired.png").await;
    let (_, expired_text, _) = browser.read().await;

    // Assert: while admitted the page points at the order API with the pass (no link to
    // nowhere) and counts down; once the pass ran out it says so and offers to join again.
    let first_pass = admitted["pass"].as_str().unwrap().to_owned();
    assert!(first_pass.len() > 20, "{admitted}");
    let api = admitted["api"].as_str().unwrap();
    assert!(
        api.contains(&format!("POST /v1/deals/{deal}/orders")),
        "{api}"
    );
    assert!(api.contains("Flashgate-Pass"), "{api}");
    assert_eq!(admitted["api_shown"], true, "{admitted}");
    assert_eq!(admitted["checkout_shown"], false, "{admitted}");
    assert_eq!(admitted["countdown_shown"], true, "{admitted}");
    assert!(
        countdowns.len() >= 2 && countdowns.iter().all(|c| c.contains("expires in")),
        "a live countdown: {countdowns:?}"
    );
    assert_eq!(expired["state"], "expired", "{expired}");
    assert!(expired_text.contains("expired"), "{expired_text}");
    assert_eq!(expired["rejoin_shown"], true, "{expired}");
    assert_eq!(expired["countdown_shown"], false, "{expired}");
    assert_eq!(expired["api_shown"], false, "{expired}");
    order_with_pass(&app, "late-buyer", &deal, Some(&first_pass))
        .await
        .expect_problem(403, "waiting-room-required");

    // Act and assert: joining again from the page gives a new place and a new pass that buys.
    browser.click("#again").await;
    browser
        .wait_for("admitted again", minute, |state, _| state == "admitted")
        .await;
    let again = admitted_view(&browser).await;
    let second_pass = again["pass"].as_str().unwrap().to_owned();
    assert_ne!(second_pass, first_pass, "{again}");
    order_with_pass(&app, "late-buyer", &deal, Some(&second_pass))
        .await
        .expect(201);
    eprintln!(
        "screenshots: {} and {}; countdown: {countdowns:?}",
        admitted_png.display(),
        expired_png.display()
    );
    browser.quit().await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_join_answered_busy_is_tried_again_until_the_line_answers() {
    // Arrange: a gateway whose Redis is not running yet, so a join is answered 503 with
    // Retry-After; the page is served all the same.
    let redis_port = free_port();
    let app = spawn_app_with(|s| {
        crate::waiting_room_edge::fast_room(s);
        s.redis.url = format!("redis://127.0.0.1:{redis_port}");
    })
    .await;
    let room = json!({"admit_per_second": 100, "max_active": 10, "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal("wrbusy", 10, room, json!({})))
        .await;
    let browser = Browser::start().await;
    let minute = Duration::from_secs(60);

    // Act 1: the buyer opens the page while the line cannot answer.
    let token = app.token("busy-buyer");
    browser
        .open(&app.url(&format!("/wait/{deal}#token={token}")))
        .await;
    wait_until("the page to say it lost contact", minute, || async {
        let (state, text, _) = browser.read().await;
        if state == "busy" && text.contains("retrying") {
            Ok(())
        } else {
            Err(format!("{state} {text}"))
        }
    })
    .await;

    // Act 2: Redis comes up on the gateway's address; nobody touches the page.
    let _redis = crate::redis_outage::start_redis_on(redis_port).await;

    // Assert: the page's next try joins the line.
    browser
        .wait_for("a place in the line", minute, |state, _| {
            state == "waiting" || state == "admitted"
        })
        .await;
    browser.quit().await;
    app.cleanup().await;
}
