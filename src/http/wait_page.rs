//! The waiting page (`GET /wait/{deal_id}`): a plain HTML page with a small script, for shops
//! that want their buyers to wait on flashgate rather than build a page on the JSON API.
//!
//! The page is the same for every buyer of a language (the script reads the deal from the
//! path and the shop's user token from the fragment, which never reaches a server), so a
//! CDN caches it for `waiting_room.page_max_age_seconds`, keyed on `Accept-Language` (the
//! answer says `Vary: Accept-Language`) and the query. It joins the line, polls at
//! `refresh_after_seconds`, announces each change in an `aria-live` region in words (no
//! colour carries meaning) and shows how far the buyer has come since joining in a
//! progress bar with ARIA values and a text label. When admitted it hands the pass to the
//! deal's checkout URL in the fragment, or, for a deal without one, shows the pass and how
//! to order with it; it counts down to the pass's expiry (`pass_expires_in_ms`), and when
//! the pass has expired says so and offers to join the line again. Branding: `page_title`
//! and `page_stylesheet_url`.
//!
//! When the deal cannot be read (PostgreSQL busy or down), the standard page is served with
//! `Cache-Control: no-store`: the page needs nothing of the deal, and its script retries
//! what the gateway answers busy.
//!
//! A deal may bring its own page (`waiting_room.page_template`, checked when the deal was
//! created by `deals::page_template`): its placeholders become the elements the script
//! fills, and the script is added before `</body>`.
//!
//! Every word comes from one catalogue per language (`assets/i18n/*.json`), chosen by
//! `?lang=` or else by `Accept-Language` (English when neither names one it has); the
//! script formats numbers and times with `Intl` in that language.

use bytes::Bytes;
use http::header::{
    ACCEPT_LANGUAGE, CACHE_CONTROL, CONTENT_LANGUAGE, CONTENT_TYPE, HeaderValue, VARY,
};
use http::{Request, Response, StatusCode};
use http_body_util::Full;

use super::State;
use super::problem::Problem;
use crate::admission::Rejection;
use crate::deals::page_template::{self, Part};
use crate::domain::DealId;

const TEMPLATE: &str = include_str!("../../assets/wait.html");
const SCRIPT: &str = include_str!("../../assets/wait.js");

/// The languages the page speaks, with their catalogues; the first is the fallback.
const CATALOGUES: [(&str, &str); 2] = [
    ("en", include_str!("../../assets/i18n/en.json")),
    ("de", include_str!("../../assets/i18n/de.json")),
];

/// Longest `Accept-Language` header read, in bytes; the rest is ignored.
const ACCEPT_LANGUAGE_BYTES_MAX: usize = 512;

/// The page (the deal's own, or the standard one), or a plain 404 for an id that cannot be
/// a deal's.
pub async fn page<B>(
    state: &State,
    request: &Request<B>,
    raw_id: &str,
) -> Result<Response<Full<Bytes>>, Problem> {
    let Ok(id) = DealId::parse(raw_id) else {
        return Err(Problem::not_found("no such deal"));
    };
    // The standard page needs nothing of the deal (its script reads the line through the
    // API and retries when that is busy), so a deal that cannot be read right now still
    // gets it, uncached, rather than an error a browser would show as JSON.
    let (deal, readable) = match state
        .admission
        .deal(&state.pools.request, id.as_str())
        .await
    {
        Ok(deal) => (Some(deal), true),
        Err(Rejection::UnknownDeal) => (None, true),
        Err(other) => {
            tracing::debug!(deal = id.as_str(), error = %other, "waiting page without its deal");
            (None, false)
        }
    };
    let template = deal
        .as_ref()
        .and_then(|d| d.waiting_room.page_template.as_deref());
    let accept = request
        .headers()
        .get(ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    let (lang, catalogue) = choose(asked_lang(request.uri().query()), accept);
    let settings = &state.settings.waiting_room;
    let stylesheet = match settings.page_stylesheet_url.as_str() {
        "" => String::new(),
        url => format!(r#"<link rel="stylesheet" href="{}">"#, escape(url)),
    };
    let html = match template {
        Some(own) => custom(own, lang, catalogue, &settings.page_title),
        None => translate(TEMPLATE, catalogue)
            .replace("{{lang}}", lang)
            .replace("{{title}}", &escape(&settings.page_title))
            .replace("{{stylesheet}}", &stylesheet)
            .replace("{{script}}", &script(catalogue)),
    };
    let mut response = Response::new(Full::new(Bytes::from(html)));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CONTENT_LANGUAGE, HeaderValue::from_static(lang));
    headers.insert(VARY, HeaderValue::from_static("Accept-Language"));
    let cache = if readable {
        format!("public, max-age={}", settings.page_max_age_seconds)
    } else {
        "no-store".to_owned()
    };
    if let Ok(value) = HeaderValue::from_str(&cache) {
        headers.insert(CACHE_CONTROL, value);
    }
    Ok(response)
}

/// The script with its catalogue, as the page embeds them. The catalogue is JSON in a
/// data block; `</` is escaped so no text in it can close the block.
fn script(catalogue: &str) -> String {
    let data = catalogue.replace("</", "<\\/");
    format!(
        "<script type=\"application/json\" id=\"flashgate-i18n\">{data}</script>\n<script>\n{SCRIPT}</script>"
    )
}

/// A deal's own page: its placeholders as the elements the script fills, the script before
/// `</body>` (at the end without one). A template that no longer parses (it was checked at
/// creation) shows its text without live parts.
fn custom(template: &str, lang: &str, catalogue: &str, title: &str) -> String {
    let parts = page_template::parse(template).unwrap_or_else(|_| vec![Part::Text(template)]);
    let mut html = String::with_capacity(template.len() + SCRIPT.len() + catalogue.len() + 256);
    for part in parts {
        match part {
            Part::Text(text) => html.push_str(text),
            Part::Placeholder("title") => html.push_str(&escape(title)),
            Part::Placeholder("lang") => html.push_str(lang),
            Part::Placeholder("status") => html.push_str(
                r#"<span data-live="status" role="status" aria-live="polite" aria-atomic="true"></span>"#,
            ),
            Part::Placeholder("countdown") => {
                html.push_str(r#"<span data-live="countdown" role="timer"></span>"#);
            }
            Part::Placeholder(name) => html.push_str(&format!(r#"<span data-live="{name}"></span>"#)),
        }
    }
    let script = script(catalogue);
    match html.to_ascii_lowercase().rfind("</body>") {
        Some(at) => html.insert_str(at, &script),
        None => html.push_str(&script),
    }
    html
}

/// `?lang=xx` from the query, if any.
fn asked_lang(query: Option<&str>) -> Option<String> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(key, _)| key == "lang")
        .map(|(_, value)| value.into_owned())
}

/// The language and catalogue for `?lang=` (when the page speaks it), else the first of
/// `Accept-Language` it speaks by weight (`de-CH` is `de`), else English.
fn choose(asked: Option<String>, accept: Option<&str>) -> (&'static str, &'static str) {
    let speaks = |tag: &str| {
        let primary = tag.split(['-', '_']).next().unwrap_or("").trim();
        CATALOGUES
            .iter()
            .find(|(lang, _)| lang.eq_ignore_ascii_case(primary))
            .copied()
    };
    if let Some(found) = asked.as_deref().and_then(speaks) {
        return found;
    }
    let accept = accept.unwrap_or("");
    let accept = accept.get(..ACCEPT_LANGUAGE_BYTES_MAX).unwrap_or(accept);
    let mut ranked: Vec<(f32, &str)> = accept
        .split(',')
        .filter_map(|item| {
            let mut parts = item.split(';');
            let tag = parts.next()?.trim();
            let q = parts
                .find_map(|p| p.trim().strip_prefix("q="))
                .map_or(Some(1.0), |q| q.trim().parse::<f32>().ok())?;
            (q > 0.0).then_some((q, tag))
        })
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranked
        .iter()
        .find_map(|(_, tag)| speaks(tag))
        .unwrap_or(CATALOGUES[0])
}

/// Fills `{{t:key}}` with the catalogue's (plain) text for `key`, escaped.
fn translate(template: &str, catalogue: &str) -> String {
    let words: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(catalogue).unwrap_or_default();
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{t:") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 4..];
        let Some(end) = after.find("}}") else {
            break;
        };
        let text = words
            .get(&after[..end])
            .and_then(|v| v.as_str())
            .unwrap_or("");
        out.push_str(&escape(text));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Escapes text for HTML content and attribute values.
pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deals_own_page_gets_its_live_parts_and_the_script() {
        let own = "<html lang=\"{{lang}}\"><body><h1>{{title}}</h1><p>{{status}}</p>\
                   <p>No. {{position}}, {{eta}}</p></body></html>";
        let html = custom(own, "de", CATALOGUES[1].1, "<Sale>");
        assert!(
            html.starts_with("<html lang=\"de\"><body><h1>&lt;Sale&gt;</h1>"),
            "{html}"
        );
        assert!(html.contains(
            r#"<p>No. <span data-live="position"></span>, <span data-live="eta"></span></p>"#
        ));
        assert!(html.contains(r#"<span data-live="status" role="status""#));
        let script_at = html.find("id=\"flashgate-i18n\"").unwrap();
        assert!(script_at < html.find("</body>").unwrap());
        assert!(custom("<p>{{ahead}}</p>", "en", CATALOGUES[0].1, "").ends_with("</script>"));
    }

    #[test]
    fn branding_is_escaped() {
        assert_eq!(
            escape(r#"<b>"Shop" & 'co'</b>"#),
            "&lt;b&gt;&quot;Shop&quot; &amp; &#39;co&#39;&lt;/b&gt;"
        );
    }

    #[test]
    fn the_language_is_asked_then_accepted_then_english() {
        let lang =
            |asked: Option<&str>, accept: Option<&str>| choose(asked.map(String::from), accept).0;
        assert_eq!(lang(Some("de"), Some("en-US")), "de");
        assert_eq!(lang(Some("xx"), Some("de-CH, en;q=0.5")), "de");
        assert_eq!(lang(None, Some("fr;q=1, en;q=0.2, de;q=0.8")), "de");
        assert_eq!(lang(None, Some("de;q=0, en")), "en");
        assert_eq!(lang(None, Some("fr, it")), "en");
        assert_eq!(lang(None, Some("de;q=nonsense")), "en");
        assert_eq!(lang(None, None), "en");
        assert_eq!(asked_lang(Some("x=1&lang=de")).as_deref(), Some("de"));
    }

    #[test]
    fn every_catalogue_has_every_word_of_the_page_and_the_script() {
        let english: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(CATALOGUES[0].1).unwrap();
        for (lang, catalogue) in CATALOGUES {
            let words: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(catalogue).unwrap();
            let keys = |m: &serde_json::Map<String, serde_json::Value>| {
                m.keys().cloned().collect::<Vec<_>>()
            };
            assert_eq!(keys(&words), keys(&english), "{lang}");
            let page = translate(TEMPLATE, catalogue);
            assert!(!page.contains("{{t:"), "{lang}");
            for key in TEMPLATE.split("{{t:").skip(1) {
                let key = key.split("}}").next().unwrap();
                assert!(words[key].is_string(), "{lang}: {key}");
            }
            // Calls of the script's `t("key", …)`, not of `split("…")` and the like.
            for (at, _) in SCRIPT.match_indices("t(\"") {
                let before = SCRIPT[..at].chars().next_back().unwrap_or(' ');
                if before.is_alphanumeric() || before == '_' || before == '.' {
                    continue;
                }
                let key = SCRIPT[at + 3..].split('"').next().unwrap();
                assert!(words.contains_key(key), "{lang}: {key} used by the script");
            }
        }
    }
}
