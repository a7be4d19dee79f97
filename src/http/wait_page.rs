//! The waiting page (`GET /wait/{deal_id}`): a plain HTML page with a small script, for shops
//! that want their buyers to wait on flashgate rather than build a page on the JSON API.
//!
//! The page is the same for every buyer and deal (the script reads the deal from the path
//! and the shop's user token from the fragment, which never reaches a server), so a CDN
//! caches it for `waiting_room.page_max_age_seconds`. It joins the line, polls at
//! `refresh_after_seconds`, announces each change in an `aria-live` region in words (no
//! colour carries meaning) and shows how far the buyer has come since joining in a
//! progress bar with ARIA values and a text label. When admitted it hands the pass to the
//! deal's checkout URL in the fragment, or, for a deal without one, shows the pass and how
//! to order with it; it counts down to the pass's expiry (`pass_expires_in_ms`), and when
//! the pass has expired says so and offers to join the line again. Branding: `page_title`
//! and `page_stylesheet_url`.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;

use super::State;
use super::problem::Problem;
use crate::domain::DealId;

const TEMPLATE: &str = include_str!("../../assets/wait.html");

/// The page, or a plain 404 for an id that cannot be a deal's.
pub fn page(state: &State, raw_id: &str) -> Result<Response<Full<Bytes>>, Problem> {
    if DealId::parse(raw_id).is_err() {
        return Err(Problem::not_found("no such deal"));
    }
    let settings = &state.settings.waiting_room;
    let stylesheet = match settings.page_stylesheet_url.as_str() {
        "" => String::new(),
        url => format!(r#"<link rel="stylesheet" href="{}">"#, escape(url)),
    };
    let html = TEMPLATE
        .replace("{{title}}", &escape(&settings.page_title))
        .replace("{{stylesheet}}", &stylesheet);
    let mut response = Response::new(Full::new(Bytes::from(html)));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    let cache = format!("public, max-age={}", settings.page_max_age_seconds);
    if let Ok(value) = HeaderValue::from_str(&cache) {
        headers.insert(CACHE_CONTROL, value);
    }
    Ok(response)
}

/// Escapes text for HTML content and attribute values.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    #[test]
    fn branding_is_escaped() {
        assert_eq!(
            super::escape(r#"<b>"Shop" & 'co'</b>"#),
            "&lt;b&gt;&quot;Shop&quot; &amp; &#39;co&#39;&lt;/b&gt;"
        );
    }
}
