//! Operations off the public path: `/metrics` and `/admin/*` answer only on the operations
//! listener; the public listener answers 404 as for any unknown path. User tokens must
//! name the configured issuer and audience.

use flashgate::auth::{Audience, mint_token_for};

use crate::helpers::{new_deal, send, spawn_app, spawn_app_with};

#[tokio::test(flavor = "multi_thread")]
async fn metrics_and_admin_are_served_only_on_the_operations_listener() {
    // Arrange
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("hidden", 5, 1)).await;
    let admin = |path: &str, public: bool| {
        let url = if public {
            app.public_url(path)
        } else {
            app.url(path)
        };
        app.client.get(url).bearer_auth(&app.admin_token)
    };

    // Act
    let public_metrics = send(app.client.get(app.public_url("/metrics"))).await;
    let public_inventory = send(admin(&format!("/admin/deals/{deal}/inventory"), true)).await;
    let public_audit = send(admin("/admin/audit", true)).await;
    let public_create = send(
        app.client
            .post(app.public_url("/admin/deals"))
            .bearer_auth(&app.admin_token)
            .json(&new_deal("sneaky", 5, 1)),
    )
    .await;
    let ops_metrics = app.get("/metrics").await;
    let ops_inventory = send(admin(&format!("/admin/deals/{deal}/inventory"), false)).await;
    let ops_public_api = send(
        app.client
            .get(format!("http://{}/v1/deals/{deal}", app.ops_addr)),
    )
    .await;
    let public_ready = app.get("/readyz").await;
    let ops_ready = send(app.client.get(format!("http://{}/readyz", app.ops_addr))).await;

    // Assert
    for reply in [
        &public_metrics,
        &public_inventory,
        &public_audit,
        &public_create,
    ] {
        reply.expect_problem(404, "not-found");
        assert!(!reply.text.contains("hidden"), "leaks: {}", reply.text);
    }
    assert_eq!(ops_metrics.status, 200);
    assert!(ops_metrics.text.contains("flashgate_"));
    ops_inventory.expect(200);
    ops_public_api.expect_problem(404, "not-found");
    public_ready.expect(200);
    ops_ready.expect(200);
    assert_ne!(app.addr.port(), app.ops_addr.port());
    app.get_deal("sneaky")
        .await
        .expect_problem(404, "not-found");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_must_name_the_configured_issuer_and_audience() {
    // Arrange: a deployment whose tokens come from "shop" for "flash-sale".
    let app = spawn_app_with(|s| {
        s.auth.jwt_issuer = "shop".into();
        s.auth.jwt_audience = "flash-sale".into();
    })
    .await;
    let deal = app.given_deal(&new_deal("audience", 10, 1)).await;
    let minted = |issuer, audience| {
        mint_token_for(&app.jwt_secret, Audience { issuer, audience }, "alice", 600)
    };

    // Act
    let default_claims = app.place_order(&app.token("alice"), &deal, "k1", 1).await;
    let other_issuer = app
        .place_order(&minted("billing", "flash-sale"), &deal, "k2", 1)
        .await;
    let other_audience = app
        .place_order(&minted("shop", "billing"), &deal, "k3", 1)
        .await;
    let matching = app
        .place_order(&minted("shop", "flash-sale"), &deal, "k4", 1)
        .await;

    // Assert
    for refused in [&default_claims, &other_issuer, &other_audience] {
        refused.expect_problem(401, "unauthorized");
    }
    matching.expect(201);
    app.cleanup().await;
}
