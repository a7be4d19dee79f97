//! A deal's own waiting page (`waiting_room.page_template`): a broken, unknown or oversized
//! placeholder is refused when the deal is created, naming it, and nothing is created; a
//! valid template is served for the deal, and in a real browser (Debian's chromium) its
//! placeholders show the buyer's place, the people ahead and the wait as the script fills
//! them, in the buyer's language.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{spawn_app_with, wait_until};
use crate::waiting_room::{join, room_deal};
use crate::waiting_room_page::Browser;

/// The operator's page: every live part once, one twice.
const TEMPLATE: &str = "<!doctype html><html lang=\"{{lang}}\"><head><title>{{title}}</title></head>\
<body><h1 id=\"brand\">Acme drop</h1><p id=\"status\">{{status}}</p>\
<p id=\"place\">You are number {{position}}; {{ahead}} ahead, wait: {{eta}}.</p>\
<p id=\"again\">Still number {{position}}.</p><p id=\"units\">{{units_left}} left, {{odds}}</p>\
<p id=\"progress\">{{progress}}</p><p id=\"timer\">{{countdown}}</p><p>{{pass}}</p></body></html>";

fn with_template(id: &str, template: &str) -> Value {
    let room = json!({"admit_per_second": 100, "max_active": 10, "pass_ttl_seconds": 60,
                      "page_template": template});
    room_deal(id, 1_500, room, json!({}))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_with_a_broken_unknown_or_oversized_placeholder_is_refused_naming_it() {
    let app = spawn_app_with(crate::waiting_room_edge::fast_room).await;
    let oversized = format!("<p>{}</p>", "x".repeat(12_288));
    for (id, template, named) in [
        ("tplunknown", "<p>{{positon}}</p>", "`{{positon}}`"),
        ("tplspaces", "<p>{{ eta }}</p>", "`{{ eta }}`"),
        (
            "tplbroken",
            "<p>{{position</p>",
            "`{{position</p>` is not closed",
        ),
        ("tplbig", oversized.as_str(), "at most 12288 bytes"),
    ] {
        let problem = app
            .create_deal(&with_template(id, template))
            .await
            .expect_problem(400, "invalid-request");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("waiting_room.page_template"), "{detail}");
        assert!(detail.contains(named), "{named} in {detail}");
        assert_eq!(app.get_deal(id).await.status, 404, "{id} was not created");
    }
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deal_with_its_own_template_shows_its_placeholders_filled_live() {
    // Arrange: a paused deal with the operator's page, three buyers ahead of ours.
    let app = spawn_app_with(crate::waiting_room_edge::fast_room).await;
    let deal = app.given_deal(&with_template("tplpage", TEMPLATE)).await;
    let pause = app.url(&format!("/admin/deals/{deal}/pause"));
    crate::helpers::send(app.client.post(pause).bearer_auth(&app.admin_token))
        .await
        .expect(200);
    for user in ["t1", "t2", "t3"] {
        join(&app, user, &deal).await.expect(201);
    }
    let served = app.get(&format!("/wait/{deal}?lang=de")).await;
    assert_eq!(served.status, 200);
    assert!(
        served.text.contains("<h1 id=\"brand\">Acme drop</h1>"),
        "{}",
        served.text
    );
    assert!(served.text.contains("<html lang=\"de\">"));
    assert!(!served.text.contains("{{"), "every placeholder replaced");
    let standard = app.get("/wait/otherdeal").await;
    assert!(
        !standard.text.contains("Acme drop"),
        "only this deal has the page"
    );

    // Act: the buyer opens the deal's page in a browser asking for German.
    let browser = Browser::start_speaking(Some("de-DE,de")).await;
    let token = app.token("tpl-buyer");
    browser
        .open(&app.url(&format!("/wait/{deal}#token={token}")))
        .await;
    browser
        .wait_for("waiting", Duration::from_secs(60), |state, _| {
            state == "waiting"
        })
        .await;
    let read = "const text = (id) => document.getElementById(id).textContent; \
        return {place: text('place'), again: text('again'), status: text('status'), \
          units: text('units'), progress: text('progress'), brand: text('brand')}";
    let shown = wait_until("the units left", Duration::from_secs(60), || async {
        let shown = browser.eval(read).await;
        match shown["units"]
            .as_str()
            .unwrap_or_default()
            .starts_with("1.5")
        {
            true => Ok(shown),
            false => Err(shown),
        }
    })
    .await;

    // Assert: the live parts filled in place, in German, numbers written the German way.
    assert_eq!(
        shown["place"], "You are number 4; 3 ahead, wait: unter einer Minute.",
        "{shown}"
    );
    assert_eq!(shown["again"], "Still number 4.", "{shown}");
    assert_eq!(shown["brand"], "Acme drop");
    let status = shown["status"].as_str().unwrap_or_default();
    assert!(status.contains("3 Personen vor Ihnen"), "{shown}");
    assert!(
        shown["units"].as_str().unwrap().starts_with("1.500 left"),
        "{shown}"
    );
    assert!(shown["progress"].as_str().unwrap().contains('%'), "{shown}");
    browser.quit().await;
    app.cleanup().await;
}
