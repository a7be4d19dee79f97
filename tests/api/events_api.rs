//! The events' admin API in-process: the endpoint contract, bad input refused without a
//! change, and the pull feed holding one event per committed change, each order's in
//! sequence, with refused orders leaving none.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{TestApp, new_deal, send, spawn_app_with, wait_until};

const SETTLE: Duration = Duration::from_secs(20);

async fn admin(
    app: &crate::helpers::Api,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = app
        .client
        .request(method, app.url(path))
        .bearer_auth(&app.admin_token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let reply = send(request).await;
    let json = serde_json::from_str(&reply.text).unwrap_or(Value::Null);
    (reply.status, json)
}

/// Every event of the feed, page by page.
pub async fn pull_all(app: &crate::helpers::Api) -> Vec<Value> {
    let mut events = Vec::new();
    let mut path = "/admin/events?limit=2".to_owned();
    loop {
        let (status, page) = admin(app, reqwest::Method::GET, &path, None).await;
        assert_eq!(status, 200, "{page}");
        events.extend(page["events"].as_array().unwrap().iter().cloned());
        match page["next"].as_str() {
            Some(next) => path = format!("/admin/events?limit=2&after={next}"),
            None => return events,
        }
    }
}

async fn endpoint_count(app: &TestApp) -> usize {
    let (_, list) = admin(app, reqwest::Method::GET, "/admin/event-endpoints", None).await;
    list["endpoints"].as_array().unwrap().len()
}

#[tokio::test]
async fn bad_endpoints_and_cursors_are_refused_and_change_nothing() {
    let app = spawn_app_with(|_| {}).await;
    let long = format!("https://shop.example/{}", "a".repeat(3000));
    for url in [
        "ftp://shop.example/hooks",
        "javascript:alert(1)",
        "http://127.0.0.1:9/hooks",
        "http://169.254.169.254/latest",
        "http://[::1]/hooks",
        "http://10.0.0.7/hooks",
        long.as_str(),
    ] {
        let body = json!({"url": url});
        let (status, problem) = admin(
            &app,
            reqwest::Method::POST,
            "/admin/event-endpoints",
            Some(body),
        )
        .await;
        assert_eq!(status, 400, "{url}: {problem}");
        assert!(
            problem["type"]
                .as_str()
                .unwrap()
                .ends_with("invalid-request"),
            "{problem}"
        );
    }
    let body = json!({"url": "https://shop.example/h", "event_types": ["order.shipped"]});
    let (status, _) = admin(
        &app,
        reqwest::Method::POST,
        "/admin/event-endpoints",
        Some(body),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(endpoint_count(&app).await, 0, "nothing was saved");
    for cursor in ["abc", "999999", "evt_424242", "-1"] {
        let (status, problem) = admin(
            &app,
            reqwest::Method::GET,
            &format!("/admin/events?after={cursor}"),
            None,
        )
        .await;
        assert_eq!(status, 400, "{cursor}: {problem}");
    }
    let (status, _) = admin(&app, reqwest::Method::GET, "/admin/events?limit=0", None).await;
    assert_eq!(status, 400);
    app.cleanup().await;
}

#[tokio::test]
async fn an_endpoint_is_created_shown_changed_rotated_and_deleted() {
    let app = spawn_app_with(|_| {}).await;
    let body = json!({"url": "https://shop.example/hooks", "event_types": ["order.paid"], "enabled": true});
    let (status, created) = admin(
        &app,
        reqwest::Method::POST,
        "/admin/event-endpoints",
        Some(body),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["url"], "https://shop.example/hooks");
    assert_eq!(created["event_types"], json!(["order.paid"]));
    assert_eq!(created["enabled"], true);
    assert!(created["secret"].as_str().unwrap().starts_with("whsec_"));
    let id = created["id"].as_str().unwrap().to_owned();
    let path = format!("/admin/event-endpoints/{id}");
    let (status, shown) = admin(&app, reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 200);
    assert_eq!(shown["state"], "active");
    assert_eq!(shown["pending"], 0);
    assert!(shown["oldest_pending_seconds"].is_number());
    assert!(shown.get("secret").is_none(), "the secret is shown once");
    let (status, changed) = admin(
        &app,
        reqwest::Method::PATCH,
        &path,
        Some(json!({"enabled": false, "event_types": null})),
    )
    .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["enabled"], false);
    assert_eq!(
        changed["event_types"].as_array().unwrap().len(),
        flashgate::events::TYPES.len()
    );
    let (status, _) = admin(
        &app,
        reqwest::Method::PATCH,
        &path,
        Some(json!({"url": "gopher://x"})),
    )
    .await;
    assert_eq!(status, 400);
    let (_, still) = admin(&app, reqwest::Method::GET, &path, None).await;
    assert_eq!(
        still["url"], "https://shop.example/hooks",
        "a refused change changes nothing"
    );
    let rotate = format!("{path}/rotate-secret");
    let (status, rotated) = admin(
        &app,
        reqwest::Method::POST,
        &rotate,
        Some(json!({"overlap_seconds": 60})),
    )
    .await;
    assert_eq!(status, 200);
    assert_ne!(rotated["secret"], created["secret"]);
    let (status, _) = admin(
        &app,
        reqwest::Method::POST,
        &rotate,
        Some(json!({"overlap_seconds": 99_999_999})),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = admin(
        &app,
        reqwest::Method::POST,
        &format!("{path}/replay"),
        Some(json!({"after": "nope"})),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = admin(&app, reqwest::Method::PUT, &path, None).await;
    assert_eq!(status, 405);
    let (status, _) = admin(&app, reqwest::Method::DELETE, &path, None).await;
    assert_eq!(status, 204);
    let (status, _) = admin(&app, reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 404);
    app.cleanup().await;
}

#[tokio::test]
async fn the_feed_holds_one_event_per_committed_change_in_sequence() {
    let app = spawn_app_with(crate::events_delivery::fast_events).await;
    let deal = app.given_deal(&new_deal("evfeed", 2, 2)).await;
    let first = app.order("u1", &deal, 1).await.expect(201);
    let second = app.order("u2", &deal, 1).await.expect(201);
    app.order("u3", &deal, 1).await.expect(409);
    let first_id = first["order_id"].as_str().unwrap();
    app.cancel_order(&app.token("u1"), first_id)
        .await
        .expect(200);
    let events = wait_until("the feed to hold five events", SETTLE, || async {
        let events = pull_all(&app).await;
        if events.len() >= 5 {
            Ok(events)
        } else {
            Err(format!("{events:?}"))
        }
    })
    .await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "order.reserved",
            "order.reserved",
            "deal.sold_out",
            "order.cancelled",
            "deal.reopened"
        ],
        "{events:#?}"
    );
    let of_first: Vec<&Value> = events
        .iter()
        .filter(|e| e["data"]["order_id"] == first["order_id"])
        .collect();
    assert_eq!(
        of_first
            .iter()
            .map(|e| e["data"]["sequence"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(of_first[1]["data"]["status"], "CANCELLED");
    assert_eq!(of_first[1]["data"]["user_id"], "u1");
    assert_eq!(of_first[1]["data"]["quantity"], 1);
    assert!(
        events
            .iter()
            .all(|e| e["id"].as_str().unwrap().starts_with("evt_"))
    );
    assert!(
        events
            .iter()
            .any(|e| e["data"]["order_id"] == second["order_id"])
    );
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        orders, 2,
        "the refused order left neither a row nor an event"
    );
    let last = events.last().unwrap()["id"].as_str().unwrap();
    let (status, rest) = admin(
        &app,
        reqwest::Method::GET,
        &format!("/admin/events?after={last}"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(rest, json!({"events": [], "next": null}));
    app.cleanup().await;
}
