//! The waiting page in the buyer's language, in a real browser (Debian's chromium): German
//! words and number grouping for a browser asking for German, English ones with `?lang=en`,
//! and the answer's `Content-Language`.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{spawn_app_with, wait_until};
use crate::waiting_room::room_deal;
use crate::waiting_room_page::Browser;

/// The page's language, its announced state and the units left as shown.
async fn spoken(browser: &Browser) -> (String, String, String) {
    let script = "return [document.documentElement.lang, \
        document.getElementById('state').textContent, \
        document.querySelector('[data-live=units_left]').textContent]";
    let value = browser.eval(script).await;
    let text = |i: usize| value[i].as_str().unwrap_or_default().to_owned();
    (text(0), text(1), text(2))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_speaks_the_buyers_language_and_writes_numbers_their_way() {
    // Arrange: a browser asking for German; a paused deal with five-digit stock, so the
    // buyer waits and the page shows the units left.
    let app = spawn_app_with(crate::waiting_room_edge::fast_room).await;
    let room = json!({"admit_per_second": 100, "max_active": 10, "pass_ttl_seconds": 60});
    let deal = app
        .given_deal(&room_deal("wrlang", 12_345, room, json!({})))
        .await;
    let pause = app.url(&format!("/admin/deals/{deal}/pause"));
    crate::helpers::send(app.client.post(pause).bearer_auth(&app.admin_token))
        .await
        .expect(200);
    let browser = Browser::start_speaking(Some("de-DE,de;q=0.9")).await;
    let minute = Duration::from_secs(60);
    let mut seen = Vec::new();

    // Act: the same buyer's page as the browser asks for it, then with `?lang=en`.
    for (user, query) in [("lang-de", ""), ("lang-en", "?lang=en")] {
        let token = app.token(user);
        browser
            .open(&app.url(&format!("/wait/{deal}{query}#token={token}")))
            .await;
        browser
            .wait_for("waiting", minute, |state, _| state == "waiting")
            .await;
        // The units left are shown once the advancer has read the stock.
        let shown = wait_until("the units left", minute, || async {
            let shown = spoken(&browser).await;
            if shown.2.starts_with("12") {
                Ok(shown)
            } else {
                Err(format!("{shown:?}"))
            }
        })
        .await;
        seen.push(shown);
    }

    // Assert: German words and grouping from Accept-Language, English ones when asked.
    let (de, en) = (&seen[0], &seen[1]);
    assert_eq!(de.0, "de", "{de:?}");
    assert!(de.1.contains("Sie stehen in der Warteschlange"), "{de:?}");
    assert_eq!(de.2, "12.345", "German grouping: {de:?}");
    assert_eq!(en.0, "en", "{en:?}");
    assert!(en.1.contains("You are in line"), "{en:?}");
    assert_eq!(en.2, "12,345", "English grouping: {en:?}");
    let page = app.get(&format!("/wait/{deal}?lang=de")).await;
    assert_eq!(page.header("content-language"), Some("de"));
    assert!(page.text.contains("<html lang=\"de\">"));
    browser.quit().await;
    app.cleanup().await;
}
