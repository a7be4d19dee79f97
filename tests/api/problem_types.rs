//! Distinct problem types (405 with `Allow`, 409 `order-not-pending`, 413), details in the
//! API's words, and integer-valued numbers accepted as integers.

use serde_json::json;

use crate::helpers::{new_deal, send, spawn_app};

#[tokio::test(flavor = "multi_thread")]
async fn wrong_methods_answer_405_with_allow_including_head() {
    let app = spawn_app().await;

    let deal = send(app.client.delete(app.url("/v1/deals/d1"))).await;
    let orders = send(app.client.get(app.url("/v1/deals/d1/orders"))).await;
    let queue = send(app.client.put(app.url("/v1/deals/d1/queue"))).await;
    let head = send(app.client.head(app.url("/healthz"))).await;

    deal.expect_problem(405, "method-not-allowed");
    assert_eq!(deal.header("allow"), Some("GET, HEAD"));
    orders.expect_problem(405, "method-not-allowed");
    assert_eq!(orders.header("allow"), Some("POST"));
    queue.expect_problem(405, "method-not-allowed");
    assert_eq!(queue.header("allow"), Some("GET, HEAD, POST"));
    assert_eq!(head.status, 200, "HEAD is served where GET is");
    assert!(head.text.is_empty());
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_an_order_twice_is_order_not_pending() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("pt1", 10, 2)).await;
    let token = app.token("alice");
    let order = app.place_order(&token, &id, "k1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap();
    app.cancel_order(&token, order_id).await.expect(200);

    let again = app.cancel_order(&token, order_id).await;

    let body = again.expect_problem(409, "order-not-pending");
    assert!(
        body["detail"].as_str().unwrap().contains("CANCELLED"),
        "{body}"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_limit_is_payload_too_large() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("pt2", 10, 2)).await;
    let padding = "x".repeat(app.settings.server.body_bytes_max + 1);

    let reply = send(
        app.client
            .post(app.url(&format!("/v1/deals/{id}/orders")))
            .bearer_auth(app.token("alice"))
            .header("Idempotency-Key", "k1")
            .body(format!(r#"{{"quantity":1,"p":"{padding}"}}"#)),
    )
    .await;

    reply.expect_problem(413, "payload-too-large");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn details_name_the_field_not_rust_types() {
    let app = spawn_app().await;
    let id = app.given_deal(&new_deal("pt3", 10, 2)).await;
    let token = app.token("alice");
    let order = |body: &'static str, key: &'static str| {
        app.client
            .post(app.url(&format!("/v1/deals/{id}/orders")))
            .bearer_auth(&token)
            .header("Idempotency-Key", key)
            .body(body)
    };

    for (body, says) in [
        (r#"{"quantity":"2"}"#, "quantity must be an integer"),
        (r#"{"quantity":49.5}"#, "quantity must be an integer"),
        (
            r#"{"quantity":1e20}"#,
            "quantity: 100000000000000000000 is out of range",
        ),
        ("{}", "quantity is required"),
        (r#"{"quantity":"#, "the body is not valid JSON"),
    ] {
        let reply = send(order(body, "k-bad")).await;
        let problem = reply.expect_problem(400, "invalid-request");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.starts_with(says), "{body}: {detail}");
        for rust in ["i64", "i32", "u32", "struct ", "serde"] {
            assert!(!detail.contains(rust), "{body}: {detail}");
        }
    }
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn integer_valued_numbers_are_integers() {
    let app = spawn_app().await;
    let mut deal = new_deal("pt4", 10, 2);
    deal["stock"] = json!(10.0);
    deal["buckets"] = json!(2.0);
    deal["per_user_limit"] = json!(2e0);
    let id = app.given_deal(&deal).await;

    let order = send(
        app.client
            .post(app.url(&format!("/v1/deals/{id}/orders")))
            .bearer_auth(app.token("alice"))
            .header("Idempotency-Key", "k1")
            .json(&json!({"quantity": 2.0})),
    )
    .await;
    let stock = send(
        app.client
            .post(app.url(&format!("/admin/deals/{id}/stock")))
            .bearer_auth(&app.settings.auth.admin_token)
            .json(&json!({"delta": 5.0})),
    )
    .await;
    let rebalance = send(
        app.client
            .post(app.url(&format!("/admin/deals/{id}/rebalance")))
            .bearer_auth(&app.settings.auth.admin_token)
            .json(&json!({"buckets": 4.0})),
    )
    .await;

    assert_eq!(order.expect(201)["quantity"], 2);
    assert_eq!(stock.status, 200, "{}", stock.text);
    assert_eq!(rebalance.status, 200, "{}", rebalance.text);
    assert_eq!(app.inventory(&id).await["reserved"], 2);
    app.cleanup().await;
}
