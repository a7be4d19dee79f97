//! Ordering with a pass, as every admitted client of the crowd does, patient or not.

use serde_json::json;

/// Orders one unit with the pass an admitted ticket collected (the gateway counts orders).
pub(super) async fn order_with_pass(
    http: &reqwest::Client,
    base: &str,
    ticket: &str,
    token: &str,
    pass: &str,
) {
    let _ordered = http
        .post(format!("{base}/orders"))
        .bearer_auth(token)
        .header("Idempotency-Key", format!("crowd-{ticket}"))
        .header("Flashgate-Pass", pass)
        .json(&json!({"quantity": 1}))
        .send()
        .await;
}
