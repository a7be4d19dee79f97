//! The admin API: authentication, deal creation and stock adjustments.

use serde_json::{Value, json};

use crate::helpers::{db_snapshot, new_deal, send, spawn_app};

async fn deal_count(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM deals")
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_routes_need_the_admin_token() {
    let app = spawn_app().await;
    let deal = new_deal("guarded", 10, 2);
    let user_token = app.token("alice");
    let requests = |auth: Option<&str>| {
        let routes = [
            app.client.post(app.url("/admin/deals")).json(&deal),
            app.client
                .post(app.url("/admin/deals/guarded/stock"))
                .json(&json!({"delta": 1})),
            app.client.get(app.url("/admin/deals/guarded/inventory")),
        ];
        routes.map(|r| match auth {
            Some(token) => r.bearer_auth(token),
            None => r,
        })
    };

    for request in requests(None) {
        send(request).await.expect_problem(401, "unauthorized");
    }
    for token in ["wrong-admin-token-0000", user_token.as_str()] {
        for request in requests(Some(token)) {
            send(request).await.expect_problem(403, "forbidden");
        }
    }

    assert_eq!(
        deal_count(&app.db).await,
        0,
        "a refused admin request created a deal"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn created_deal_has_its_stock_spread_over_buckets() {
    let app = spawn_app().await;

    let created = app.create_deal(&new_deal("spread", 10, 3)).await;
    let duplicate = app.create_deal(&new_deal("spread", 5, 1)).await;

    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(duplicate.status, 409, "duplicate id: {}", duplicate.text);
    let inventory = app.inventory("spread").await;
    assert_eq!(inventory["deal_id"], "spread");
    assert_eq!(inventory["stock_total"], 10);
    assert_eq!(inventory["available"], 10);
    assert_eq!(inventory["reserved"], 0);
    assert_eq!(inventory["sold"], 0);
    assert_eq!(inventory["invariant_holds"], true);
    let buckets = inventory["buckets"].as_array().expect("buckets array");
    assert_eq!(buckets.len(), 3, "{inventory}");
    assert!(
        buckets
            .iter()
            .all(|b| b["bucket"].is_i64() && b["available"].is_i64()),
        "{inventory}"
    );
    assert_eq!(
        buckets
            .iter()
            .map(|b| b["available"].as_i64().unwrap())
            .sum::<i64>(),
        10
    );
    app.assert_invariants("spread").await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_deals_are_refused() {
    let app = spawn_app().await;
    let variant = |field: &str, value: Value| {
        let mut deal = new_deal("invalid", 10, 2);
        deal[field] = value;
        (format!("{field} = {}", deal[field]), deal)
    };
    let cases = [
        variant("id", json!("has spaces")),
        variant("name", json!("")),
        variant("stock", json!(-1)),
        variant("buckets", json!(0)),
        variant("unit_price_minor", json!(-5)),
        variant("currency", json!("EURO")),
        variant("per_user_limit", json!(0)),
        variant("reservation_ttl_seconds", json!(0)),
        variant("starts_at", json!("tomorrow")),
    ];
    // Each time is valid on its own: the rule between them is answered 422.
    let window = |starts: &str, ends: &str| {
        let mut deal = new_deal("invalid", 10, 2);
        deal["starts_at"] = json!(starts);
        deal["ends_at"] = json!(ends);
        (format!("starts_at {starts}, ends_at {ends}"), deal)
    };
    let windows = [
        window("2030-01-02T00:00:00Z", "2030-01-01T00:00:00Z"),
        window("2030-01-01T00:00:00Z", "2030-01-01T00:00:00Z"),
    ];

    for (name, deal) in cases {
        let reply = app.create_deal(&deal).await;
        assert_eq!(reply.status, 400, "{name}: {}", reply.text);
        reply.expect_problem(400, "invalid-request");
    }
    for (name, deal) in windows {
        let reply = app.create_deal(&deal).await;
        assert_eq!(reply.status, 422, "{name}: {}", reply.text);
        let problem = reply.expect_problem(422, "invalid-request");
        assert_eq!(problem["detail"], "starts_at must be before ends_at");
    }
    // An adaptive line's floor above its ceiling, given or defaulted (100), is the same kind.
    for admission in [
        json!({"mode": "adaptive", "min_per_second": 50, "max_per_second": 10}),
        json!({"mode": "adaptive", "min_per_second": 2397}),
    ] {
        let mut deal = new_deal("invalid", 10, 2);
        deal["waiting_room"] = json!({"enabled": true, "admission": admission});
        let reply = app.create_deal(&deal).await;
        assert_eq!(reply.status, 422, "{admission}: {}", reply.text);
        reply.expect_problem(422, "invalid-request");
    }

    assert_eq!(deal_count(&app.db).await, 0);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stock_adjustments_add_and_remove_available_units_only() {
    // Arrange: 10 units, 2 of them reserved.
    let app = spawn_app().await;
    let mut deal = new_deal("stock", 10, 3);
    deal["per_user_limit"] = json!(2);
    let id = app.given_deal(&deal).await;
    app.order("alice", &id, 2).await.expect(201);

    // Act + Assert: add five.
    let added = app.adjust_stock(&id, 5).await.expect(200);
    assert_eq!(
        (added["stock_total"].as_i64(), added["available"].as_i64()),
        (Some(15), Some(13)),
        "{added}"
    );
    assert_eq!(added["invariant_holds"], true);
    app.assert_invariants(&id).await;

    // Removing more than is available is refused and changes nothing.
    let before = db_snapshot(&app.db, &id).await;
    let too_many = app.adjust_stock(&id, -14).await;
    assert_eq!(too_many.status, 409, "{}", too_many.text);
    let beyond_total = app.adjust_stock(&id, -16).await;
    beyond_total.expect_problem(409, "invalid-request");
    assert_eq!(
        db_snapshot(&app.db, &id).await,
        before,
        "a refused adjustment changed the database"
    );
    assert_eq!(app.inventory(&id).await["stock_total"], 15);

    // Removing all available units sells the deal out; the reserved units stay reserved.
    let removed = app.adjust_stock(&id, -13).await.expect(200);
    assert_eq!(
        (
            removed["stock_total"].as_i64(),
            removed["available"].as_i64()
        ),
        (Some(2), Some(0)),
        "{removed}"
    );
    assert_eq!(removed["reserved"], 2);
    app.order("bob", &id, 1)
        .await
        .expect_problem(409, "sold-out");
    app.assert_invariants(&id).await;

    // Adding a unit makes the deal orderable again.
    app.adjust_stock(&id, 1).await.expect(200);
    app.order_eventually("bob", &id, 1).await;
    app.assert_invariants(&id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_requests_for_unknown_deals_are_not_found() {
    let app = spawn_app().await;

    let inventory = send(
        app.client
            .get(app.url("/admin/deals/nope/inventory"))
            .bearer_auth(&app.admin_token),
    )
    .await;
    let stock = app.adjust_stock("nope", 1).await;

    inventory.expect_problem(404, "not-found");
    stock.expect_problem(404, "not-found");
    app.cleanup().await;
}
