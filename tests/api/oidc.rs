//! Provider tokens against a real OpenID Connect provider (oidc-provider from npm, see
//! `helpers::OidcProvider`): buying with its JWT access tokens through a key rotation and
//! an outage, the forged-token suite against its keys, operators holding its role, and
//! starting before the provider answers.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use flashgate::app::Application;
use flashgate::config::Settings;
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{
    OidcProvider, Reply, TestApp, TestDb, available_by_bucket, free_port, new_deal, send,
    signed_token, spawn_app_with, test_settings, unique_suffix, wait_until,
};

/// The provider's role for operators, as `helpers::OidcProvider` grants it.
const ADMIN_ROLE: &str = "flashgate-admin";

fn trust(settings: &mut Settings, provider: &OidcProvider) {
    settings.auth.oidc.issuer = provider.issuer();
    settings.auth.oidc.audience = "flashgate".into();
    settings.auth.oidc.admin_claim = "roles".into();
    settings.auth.oidc.admin_value = ADMIN_ROLE.into();
}

async fn buy(app: &TestApp, token: &str, deal: &str) -> Reply {
    app.place_order(token, deal, &unique_suffix(), 1).await
}

async fn orders(db: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn buyers_keep_buying_through_a_key_rotation_and_a_provider_outage() {
    let mut provider = OidcProvider::start("first").await;
    let app = spawn_app_with(|s| {
        trust(s, &provider);
        // Every unknown kid may ask the provider, so the outage below meets a fetch.
        s.auth.oidc.refetch_min_interval_ms = 1;
    })
    .await;
    let deal = app.given_deal(&new_deal("rotation", 50, 4)).await;

    buy(&app, &provider.token("buyer-0").await, &deal)
        .await
        .expect(201);
    let unused_old = provider.token("buyer-1").await;
    let used_old = provider.token("buyer-2").await;
    buy(&app, &used_old, &deal).await.expect(201);

    // The provider publishes a new key and drops the old one; the first token signed with
    // it makes the gateway fetch the new set.
    provider.rotate_to("second").await;
    buy(&app, &provider.token("buyer-3").await, &deal)
        .await
        .expect(201);
    assert!(provider.jwks_fetches().await >= 1);
    for old in [&unused_old, &used_old] {
        buy(&app, old, &deal)
            .await
            .expect_problem(401, "unauthorized");
    }

    // The provider goes away for the rest of the sale: tokens signed with the key held keep
    // buying, and a token naming an unknown key is refused (its fetch fails) without
    // disturbing them.
    let held = [
        provider.token("buyer-4").await,
        provider.token("buyer-5").await,
    ];
    provider.stop();
    buy(&app, &held[0], &deal).await.expect(201);
    let stranger = forge_unknown_kid(&held[0]);
    buy(&app, &stranger, &deal)
        .await
        .expect_problem(401, "unauthorized");
    buy(&app, &held[1], &deal).await.expect(201);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("flashgate_oidc_jwks_fetches_total{outcome=\"error\"}"),
        "the failed fetch is counted"
    );

    assert_eq!(orders(&app.db).await, 5);
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

/// `token` with its header's `kid` replaced by one no provider published.
fn forge_unknown_kid(token: &str) -> String {
    let mut parts = token.splitn(2, '.');
    let (_, rest) = (parts.next().unwrap(), parts.next().unwrap());
    let header = json!({"alg": "RS256", "typ": "at+jwt", "kid": unique_suffix()});
    format!("{}.{rest}", URL_SAFE_NO_PAD.encode(header.to_string()))
}

fn claims(issuer: &str, patch: Value) -> Value {
    let now = chrono::Utc::now().timestamp();
    let mut claims = json!({
        "sub": "mallory", "iss": issuer, "aud": "flashgate",
        "iat": now, "exp": now + 600, "scope": "orders",
    });
    for (name, value) in patch.as_object().unwrap() {
        if value.is_null() {
            claims.as_object_mut().unwrap().remove(name);
        } else {
            claims[name] = value.clone();
        }
    }
    claims
}

/// Every forgery a gateway in front of an API must refuse, each signed (or not) as an
/// attacker who knows the provider's public key, its kid and its claims can.
fn forgeries(provider: &OidcProvider) -> Vec<(&'static str, String)> {
    let issuer = provider.issuer();
    let (pem, kid) = provider.private_key("real");
    let real = EncodingKey::from_rsa_pem(&pem).unwrap();
    let (attacker_pem, _) = provider.private_key("attacker");
    let attacker = EncodingKey::from_rsa_pem(&attacker_pem).unwrap();
    let ec_pem = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let ec = EncodingKey::from_ec_pem(ec_pem.as_bytes()).unwrap();
    let public_as_secret = EncodingKey::from_secret(&provider.public_pem("real")).unwrap();
    let valid = claims(&issuer, json!({}));
    let now = chrono::Utc::now().timestamp();
    let none_header = json!({"alg": "none", "typ": "at+jwt", "kid": kid});
    let big_header = json!({"alg": "RS256", "kid": kid, "x5u": "x".repeat(9_000)});
    let unsigned = |header: &Value| {
        format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(valid.to_string())
        )
    };
    let rs = |patch: Value| signed_token(Algorithm::RS256, &kid, &real, &claims(&issuer, patch));
    vec![
        ("alg none", unsigned(&none_header)),
        (
            "HS256 with the public key",
            signed_token(Algorithm::HS256, &kid, &public_as_secret, &valid),
        ),
        (
            "another RSA key, same kid",
            signed_token(Algorithm::RS256, &kid, &attacker, &valid),
        ),
        (
            "an ES256 key, same kid",
            signed_token(Algorithm::ES256, &kid, &ec, &valid),
        ),
        (
            "unknown kid",
            signed_token(Algorithm::RS256, "no-such-kid", &real, &valid),
        ),
        ("expired", rs(json!({"exp": now - 3600, "iat": now - 4200}))),
        ("not yet valid", rs(json!({"nbf": now + 3600}))),
        ("wrong iss", rs(json!({"iss": "https://id.example.com"}))),
        ("wrong aud", rs(json!({"aud": "billing"}))),
        ("missing user claim", rs(json!({"sub": null}))),
        (
            "oversize header",
            format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(big_header.to_string()),
                rs(json!({})).split_once('.').unwrap().1
            ),
        ),
        ("100 KB token", rs(json!({"pad": "p".repeat(100 * 1024)}))),
    ]
}

#[tokio::test]
async fn forged_tokens_are_refused_and_reserve_nothing() {
    let provider = OidcProvider::start("real").await;
    provider.generate_key("attacker");
    let app = spawn_app_with(|s| {
        trust(s, &provider);
        // A head large enough to carry the 100 KB token to the token check.
        s.server.header_bytes_max = 256 * 1024;
        s.auth.oidc.refetch_min_interval_ms = 60_000;
    })
    .await;
    let deal = app.given_deal(&new_deal("forged", 20, 2)).await;
    let genuine = provider.token("buyer-0").await;

    for (what, token) in forgeries(&provider) {
        let reply = buy(&app, &token, &deal).await;
        assert_eq!(reply.status, 401, "{what}: {}", reply.text);
        reply.expect_problem(401, "unauthorized");
    }

    // A flood of tokens naming unknown keys costs the provider at most one more fetch.
    let fetches_before = provider.jwks_fetches().await;
    let flood: Vec<_> = (0..50)
        .map(|_| {
            let api = app.api.clone();
            let (genuine, deal) = (genuine.clone(), deal.clone());
            tokio::spawn(async move {
                for _ in 0..200 {
                    let token = forge_unknown_kid(&genuine);
                    let reply = api.place_order(&token, &deal, &unique_suffix(), 1).await;
                    assert_eq!(reply.status, 401, "{}", reply.text);
                }
            })
        })
        .collect();
    for task in flood {
        task.await.unwrap();
    }
    let fetched = provider.jwks_fetches().await - fetches_before;
    assert!(
        fetched <= 1,
        "10,000 unknown kids caused {fetched} JWKS fetches"
    );

    assert_eq!(orders(&app.db).await, 0);
    let available: i64 = available_by_bucket(&app.db, &deal).await.values().sum();
    assert_eq!(available, 20, "nothing reserved");
    buy(&app, &genuine, &deal).await.expect(201);
    app.cleanup().await;
}

async fn as_operator(app: &TestApp, token: &str, body: &Value) -> Reply {
    let request = app.client.post(app.url("/admin/deals")).bearer_auth(token);
    send(request.json(body)).await
}

async fn operator_log(app: &TestApp, token: &str, query: &str) -> Reply {
    let url = app.url(&format!("/admin/operator-log{query}"));
    send(app.client.get(url).bearer_auth(token)).await
}

#[tokio::test]
async fn operators_with_the_role_create_deals_and_the_log_names_them() {
    let provider = OidcProvider::start("ops").await;
    let app = spawn_app_with(|s| trust(s, &provider)).await;
    let operator = provider.token("operator").await;

    as_operator(&app, &operator, &new_deal("by-operator", 5, 1))
        .await
        .expect(201);
    let clerk = provider.token("clerk").await;
    as_operator(&app, &clerk, &new_deal("by-clerk", 5, 1))
        .await
        .expect_problem(403, "forbidden");
    let buyer = provider.token("buyer-0").await;
    as_operator(&app, &buyer, &new_deal("by-buyer", 5, 1))
        .await
        .expect_problem(403, "forbidden");
    let forged = forge_unknown_kid(&operator);
    as_operator(&app, &forged, &new_deal("by-forger", 5, 1))
        .await
        .expect_problem(401, "unauthorized");
    app.adjust_stock("by-operator", 3).await.expect(200);

    let page = operator_log(&app, &operator, "").await.expect(200);
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{page}");
    assert_eq!(entries[0]["who"], "operator");
    assert_eq!(entries[0]["action"], "deal.created");
    assert_eq!(entries[0]["target"], "by-operator");
    assert!(entries[0]["at"].is_string() && entries[0]["detail"].is_object());
    assert_eq!(entries[1]["who"], "admin-token");
    assert_eq!(entries[1]["action"], "deal.stock_adjusted");

    // The static token reads it too; the cursor pages on.
    let first = operator_log(&app, &app.admin_token, "?limit=1")
        .await
        .expect(200);
    assert_eq!(first["entries"].as_array().unwrap().len(), 1);
    let next = first["next"].as_str().unwrap();
    let rest = operator_log(&app, &app.admin_token, &format!("?after={next}"))
        .await
        .expect(200);
    assert_eq!(rest["entries"][0]["action"], "deal.stock_adjusted");
    let end = rest["next"].as_str().unwrap();
    let empty = operator_log(&app, &operator, &format!("?after={end}"))
        .await
        .expect(200);
    assert_eq!(empty["entries"], json!([]));
    assert_eq!(empty["next"], end);
    operator_log(&app, &operator, "?after=x")
        .await
        .expect_problem(400, "invalid-request");
    operator_log(&app, &clerk, "")
        .await
        .expect_problem(403, "forbidden");

    let cli = crate::ops_cli::flashgate_cli(&app.settings, &["operator-log"]).await;
    assert!(cli.success, "{}", cli.stderr);
    assert_eq!(cli.json()["entries"][0]["who"], "operator");
    app.cleanup().await;
}

#[tokio::test]
async fn the_static_admin_token_can_be_switched_off() {
    let provider = OidcProvider::start("only").await;
    let app = spawn_app_with(|s| {
        trust(s, &provider);
        s.auth.admin_token_enabled = false;
    })
    .await;
    let reply = as_operator(&app, &app.admin_token.clone(), &new_deal("static", 5, 1)).await;
    reply.expect_problem(401, "unauthorized");
    let operator = provider.token("operator").await;
    as_operator(&app, &operator, &new_deal("provider", 5, 1))
        .await
        .expect(201);
    app.cleanup().await;
}

#[tokio::test]
async fn start_up_without_the_provider_fails_naming_the_setting_unless_allowed() {
    let database = TestDb::create().await;
    let mut settings = test_settings(&database.url);
    settings.auth.oidc.issuer = format!("http://127.0.0.1:{}", free_port());
    let error = Application::build(settings)
        .await
        .err()
        .expect("start-up fails");
    assert!(error.to_string().contains("auth.oidc.issuer"), "{error}");
    database.drop_database().await;

    let mut provider = OidcProvider::start("late").await;
    let token = provider.token("buyer-0").await;
    provider.stop();
    let app = spawn_app_with(|s| {
        trust(s, &provider);
        s.auth.oidc.start_without_keys = true;
        s.auth.oidc.refetch_min_interval_ms = 200;
    })
    .await;
    let deal = app.given_deal(&new_deal("late", 5, 1)).await;
    let reply = buy(&app, &token, &deal).await;
    reply.expect_problem(503, "overloaded");
    assert!(reply.header("retry-after").is_some());

    provider.rotate_to("late").await;
    wait_until(
        "the provider's keys to arrive",
        Duration::from_secs(10),
        || async {
            let reply = buy(&app, &token, &deal).await;
            (reply.status == 201).then_some(())
        },
    )
    .await;
    app.cleanup().await;
}
