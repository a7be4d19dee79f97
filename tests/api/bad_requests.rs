//! A corpus of bad order requests: each gets its exact status and problem type, and none
//! changes the database.

use reqwest::RequestBuilder;

use serde_json::{Value, json};

use crate::helpers::{
    Reply, TestApp, db_snapshot, new_deal, raw_exchange, send, spawn_app, spawn_app_with,
    unique_suffix,
};

/// `{"alg":"none"}` with `{"sub":"alice","exp":4102444800}` and no signature.
const UNSIGNED_TOKEN: &str =
    "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6NDEwMjQ0NDgwMH0.";

struct Case {
    request: RequestBuilder,
    expected: Expected,
}

struct Expected {
    name: &'static str,
    status: u16,
    slug: &'static str,
}

fn case(name: &'static str, status: u16, slug: &'static str, request: RequestBuilder) -> Case {
    Case {
        request,
        expected: Expected { name, status, slug },
    }
}

/// An order request for `deal` carrying `token` and `key` when given, and `body` as JSON.
fn order(
    app: &TestApp,
    deal: &str,
    token: Option<&str>,
    key: Option<&str>,
    body: &str,
) -> RequestBuilder {
    let mut request = app
        .client
        .post(app.url(&format!("/v1/deals/{deal}/orders")));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request
        .header("Content-Type", "application/json")
        .body(body.to_owned())
}

fn corpus(app: &TestApp, deal: &str) -> Vec<Case> {
    let alice = app.token("alice");
    let fresh = unique_suffix;
    // Valid except for the body.
    let body = |text: &str| order(app, deal, Some(&alice), Some(&fresh()), text);
    let invalid = |name, text: &str| case(name, 400, "invalid-request", body(text));
    // Valid except for the token.
    let with_token =
        |token: Option<&str>| order(app, deal, token, Some(&fresh()), r#"{"quantity":1}"#);
    let unauthorized =
        |name, token: Option<&str>| case(name, 401, "unauthorized", with_token(token));
    let expired = flashgate::auth::mint_token(&app.jwt_secret, "alice", -60);
    let foreign = flashgate::auth::mint_token("some-other-secret", "alice", 3600);
    let long_user = "u".repeat(app.settings.auth.user_id_bytes_max + 1);
    let long_sub = flashgate::auth::mint_token(&app.jwt_secret, &long_user, 3600);
    let empty_sub = flashgate::auth::mint_token(&app.jwt_secret, "", 3600);
    let audience = |issuer, audience| flashgate::auth::Audience { issuer, audience };
    let other_issuer = flashgate::auth::mint_token_for(
        &app.jwt_secret,
        audience("billing", flashgate::auth::DEFAULT_AUDIENCE),
        "alice",
        3600,
    );
    let other_audience = flashgate::auth::mint_token_for(
        &app.jwt_secret,
        audience(flashgate::auth::DEFAULT_ISSUER, "billing"),
        "alice",
        3600,
    );
    let above_max = format!(r#"{{"quantity":{}}}"#, app.settings.orders.quantity_max + 1);
    let padding = "x".repeat(app.settings.server.body_bytes_max + 1024);
    let too_large = format!(r#"{{"quantity":1,"padding":"{padding}"}}"#);
    let long_key = "k".repeat(app.settings.orders.idempotency_key_bytes_max + 1);
    let one = r#"{"quantity":1}"#;
    vec![
        invalid("malformed JSON", r#"{"quantity":"#),
        invalid("empty body", ""),
        invalid("JSON array", "[1]"),
        invalid("missing quantity", "{}"),
        invalid("quantity as a string", r#"{"quantity":"1"}"#),
        invalid("fractional quantity", r#"{"quantity":1.5}"#),
        invalid("quantity null", r#"{"quantity":null}"#),
        invalid("quantity zero", r#"{"quantity":0}"#),
        invalid("negative quantity", r#"{"quantity":-1}"#),
        invalid("huge quantity", r#"{"quantity":1000000}"#),
        invalid("quantity 1e20", r#"{"quantity":1e20}"#),
        invalid(
            "quantity beyond i64",
            r#"{"quantity":99999999999999999999999}"#,
        ),
        invalid("quantity above orders.quantity_max", &above_max),
        case(
            "body above server.body_bytes_max",
            413,
            "payload-too-large",
            body(&too_large),
        ),
        case(
            "missing Idempotency-Key",
            400,
            "invalid-request",
            order(app, deal, Some(&alice), None, one),
        ),
        case(
            "empty Idempotency-Key",
            400,
            "invalid-request",
            order(app, deal, Some(&alice), Some(""), one),
        ),
        case(
            "Idempotency-Key longer than 255",
            400,
            "invalid-request",
            order(app, deal, Some(&alice), Some(&long_key), one),
        ),
        unauthorized("missing token", None),
        unauthorized("garbage token", Some("not-a-jwt")),
        unauthorized("expired token", Some(&expired)),
        unauthorized("token signed with another secret", Some(&foreign)),
        unauthorized("unsigned token (alg none)", Some(UNSIGNED_TOKEN)),
        unauthorized(
            "user id longer than auth.user_id_bytes_max",
            Some(&long_sub),
        ),
        unauthorized("empty user id", Some(&empty_sub)),
        unauthorized("token from another issuer", Some(&other_issuer)),
        unauthorized("token for another audience", Some(&other_audience)),
        case(
            "Basic instead of Bearer",
            401,
            "unauthorized",
            with_token(None).header("Authorization", "Basic YWxpY2U6c2VjcmV0"),
        ),
        case(
            "unknown deal",
            404,
            "not-found",
            order(app, "no-such-deal", Some(&alice), Some(&fresh()), one),
        ),
        case(
            "quantity above per_user_limit",
            409,
            "per-user-limit",
            order(
                app,
                deal,
                Some(&alice),
                Some("k-refused"),
                r#"{"quantity":3}"#,
            ),
        ),
    ]
}

/// What is wrong with `reply` as the answer to `case`, if anything.
fn mismatch(case: &Expected, reply: &Reply) -> Option<String> {
    let content_type = reply.header("content-type").unwrap_or_default();
    let body: Value = serde_json::from_str(&reply.text).unwrap_or(Value::Null);
    let shaped = content_type.starts_with("application/problem+json")
        && body["title"].is_string()
        && body["detail"].is_string()
        && body["status"] == json!(case.status);
    let ok =
        reply.status == case.status && reply.problem_slug().as_deref() == Some(case.slug) && shaped;
    (!ok).then(|| {
        format!(
            "{}: expected {} {}, got {} ({content_type}) {}",
            case.name, case.status, case.slug, reply.status, reply.text
        )
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_order_requests_are_refused_without_side_effects() {
    // Arrange: an open deal allowing two units per user.
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("corpus", 10, 2)).await;
    let mut failures = Vec::new();

    for Case {
        request,
        expected: case,
    } in corpus(&app, &deal)
    {
        let before = db_snapshot(&app.db, &deal).await;

        // Act
        let reply = send(request).await;

        // Assert (collected, so one run shows every refused case that went wrong)
        failures.extend(mismatch(&case, &reply));
        if db_snapshot(&app.db, &deal).await != before {
            failures.push(format!("{}: changed the database", case.name));
        }
    }

    assert!(
        failures.is_empty(),
        "bad requests answered wrongly:\n{}",
        failures.join("\n")
    );
    // A refused request stores nothing under its key: the key is still free.
    let reply = app
        .place_order(&app.token("alice"), &deal, "k-refused", 1)
        .await;
    assert_ne!(
        reply.header("idempotent-replayed"),
        Some("true"),
        "a refused request was stored"
    );
    reply.expect(201);
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_routes_and_methods_are_problems_too() {
    let app = spawn_app().await;

    let unknown = app.get("/v1/nothing-here").await;
    let wrong_method = send(app.client.delete(app.url("/v1/deals/x"))).await;

    assert_eq!(unknown.status, 404, "{}", unknown.text);
    assert!(
        matches!(wrong_method.status, 404 | 405),
        "DELETE /v1/deals/x: {}",
        wrong_method.status
    );
    app.cleanup().await;
}

/// A chunked order body: no Content-Length, so the limit must be enforced while reading.
fn chunked_order(app: &TestApp, deal: &str, key: &str, body: &str) -> Vec<u8> {
    let mut request = format!(
        "POST /v1/deals/{deal}/orders HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        app.addr,
        app.token("alice")
    );
    for chunk in body.as_bytes().chunks(1000) {
        request.push_str(&format!(
            "{:x}\r\n{}\r\n",
            chunk.len(),
            String::from_utf8_lossy(chunk)
        ));
    }
    request.push_str("0\r\n\r\n");
    request.into_bytes()
}

#[tokio::test(flavor = "multi_thread")]
async fn chunked_bodies_are_read_up_to_the_limit() {
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("chunked", 10, 2)).await;
    let padding = "x".repeat(app.settings.server.body_bytes_max + 1024);
    let too_large = format!(r#"{{"quantity":1,"padding":"{padding}"}}"#);
    let before = db_snapshot(&app.db, &deal).await;

    let refused = raw_exchange(app.addr, chunked_order(&app, &deal, "big", &too_large)).await;
    let after_refusal = db_snapshot(&app.db, &deal).await;
    let accepted = raw_exchange(
        app.addr,
        chunked_order(&app, &deal, "small", r#"{"quantity":1}"#),
    )
    .await;

    assert!(
        refused.starts_with("HTTP/1.1 413"),
        "oversized chunked body: {refused}"
    );
    assert!(
        refused.contains("https://flashgate.dev/problems/payload-too-large"),
        "{refused}"
    );
    assert_eq!(
        after_refusal, before,
        "an oversized body changed the database"
    );
    assert!(
        accepted.starts_with("HTTP/1.1 201"),
        "small chunked body: {accepted}"
    );
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

/// An order whose raw body is `body`, on its own connection.
fn raw_order(app: &TestApp, deal: &str, key: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST /v1/deals/{deal}/orders HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        app.addr,
        app.token("alice"),
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_that_are_not_utf8_are_refused_and_reserve_nothing() {
    // Arrange
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("utf8", 10, 2)).await;
    let before = db_snapshot(&app.db, &deal).await;
    let bodies: [&[u8]; 4] = [
        b"{\"quantity\": 1, \"note\": \"\xff\xfe\"}",
        b"\xff{\"quantity\": 1}",
        b"{\"quantity\": 1, \"\xc3\": 2}",
        b"{\"quantity\": 1, \"note\": \"\xed\xa0\x80\"}",
    ];

    for (i, body) in bodies.iter().enumerate() {
        // Act
        let reply = raw_exchange(app.addr, raw_order(&app, &deal, &format!("u{i}"), body)).await;

        // Assert
        assert!(reply.starts_with("HTTP/1.1 400"), "body {i}: {reply}");
        assert!(reply.contains("invalid-request"), "body {i}: {reply}");
    }
    assert_eq!(db_snapshot(&app.db, &deal).await, before);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
    // Arrange: a client that sends the head and 5 of 14 body bytes, then stalls.
    let app = spawn_app_with(|s| s.server.body_read_timeout_ms = 300).await;
    let deal = app.given_deal(&new_deal("slow", 10, 2)).await;
    let mut request = raw_order(&app, &deal, "slow", br#"{"quantity":1}"#);
    request.truncate(request.len() - 9);
    let before = db_snapshot(&app.db, &deal).await;

    // Act (the server answers and closes; the client never sends the rest)
    let reply = raw_exchange(app.addr, request).await;

    // Assert
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("application/problem+json"), "{reply}");
    assert_eq!(db_snapshot(&app.db, &deal).await, before);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_authorization_scheme_is_named_as_the_wrong_scheme() {
    // Arrange
    let app = spawn_app().await;
    let deal = app.given_deal(&new_deal("scheme", 10, 2)).await;
    let basic = "Basic YWxpY2U6c2VjcmV0";

    // Act
    let public = send(
        order(&app, &deal, None, Some("k-scheme"), r#"{"quantity":1}"#)
            .header("Authorization", basic),
    )
    .await;
    let admin = send(
        app.client
            .get(app.url(&format!("/admin/deals/{deal}/inventory")))
            .header("Authorization", basic),
    )
    .await;
    let missing = send(order(
        &app,
        &deal,
        None,
        Some("k-none"),
        r#"{"quantity":1}"#,
    ))
    .await;

    // Assert: the detail says what to send instead, and no header at all is still "missing".
    for reply in [&public, &admin] {
        assert_eq!(reply.status, 401, "{}", reply.text);
        let body: Value = serde_json::from_str(&reply.text).unwrap();
        let detail = body["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("Bearer scheme") && detail.contains("Authorization: Bearer <token>"),
            "{detail}"
        );
    }
    assert_eq!(missing.status, 401);
    assert!(
        missing.text.contains("missing bearer token"),
        "{}",
        missing.text
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn text_the_database_cannot_store_is_bad_input_not_an_outage() {
    // Arrange
    let app = spawn_app().await;
    let statements = [
        ("SELECT $1::text", "a\u{0}b"),
        ("SELECT $1::jsonb", r#"["a\u0000b"]"#),
    ];

    for (sql, value) in statements {
        // Act
        let error = sqlx::query(sql)
            .bind(value)
            .execute(&app.db)
            .await
            .expect_err("PostgreSQL stores no NUL");
        let error = flashgate::store::StoreError::from(error);

        // Assert: refused as the caller's input (400), not a 503 that invites a retry.
        assert!(
            matches!(error, flashgate::store::StoreError::Unstorable(_)),
            "{sql}: {error:?}"
        );
        let problem = flashgate::http::problem::Problem::from(error);
        assert_eq!(problem.status(), 400, "{sql}");
    }
    app.cleanup().await;
}
