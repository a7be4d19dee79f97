//! Invitation-only lines (`waiting_room.invitation`): a buyer joins with the token claim
//! the deal names or with an access code an operator issued; anyone else is refused before
//! taking a place. Codes are kept only as digests, and one code is redeemed by one buyer
//! however many try it at once on however many gateways.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::helpers::{Api, Reply, TestApp, send, spawn_app_with, spawn_sibling};
use crate::waiting_room::{line, room_deal};

async fn app() -> TestApp {
    spawn_app_with(|s| {
        s.waiting_room.stock_refresh_ms = 100;
        s.waiting_room.access_codes_per_request_max = 50;
    })
    .await
}

fn invite_room(invitation: Value) -> Value {
    json!({"enabled": true, "admit_per_second": 100, "max_active": 1000,
           "pass_ttl_seconds": 60, "invitation": invitation})
}

/// Joins as `user`, whose token carries `claims`, showing `body` (none when `Null`).
pub(crate) async fn join_as(
    api: &Api,
    user: &str,
    claims: Value,
    deal: &str,
    body: Value,
) -> Reply {
    let claims = claims.as_object().cloned().unwrap_or_default();
    let token = flashgate::auth::mint_token_with_claims(&api.jwt_secret, user, claims);
    let request = api
        .client
        .post(api.url(&format!("/v1/deals/{deal}/queue")))
        .bearer_auth(token);
    let request = match body {
        Value::Null => request,
        body => request.json(&body),
    };
    send(request).await
}

pub(crate) async fn issue_codes(api: &Api, deal: &str, count: i64) -> Reply {
    let request = api
        .client
        .post(api.url(&format!("/admin/deals/{deal}/access-codes")))
        .bearer_auth(&api.admin_token)
        .json(&json!({ "count": count }));
    send(request).await
}

async fn admin_room(api: &Api, deal: &str) -> Value {
    let url = api.url(&format!("/admin/deals/{deal}"));
    let request = api.client.get(url).bearer_auth(&api.admin_token);
    send(request).await.expect(200)["waiting_room"].clone()
}

pub(crate) fn codes_of(reply: &Value) -> Vec<String> {
    reply["codes"]
        .as_array()
        .expect("codes")
        .iter()
        .map(|c| c.as_str().expect("a code").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_claim_or_a_code_joins_and_a_refusal_takes_no_place() {
    // Arrange
    let app = app().await;
    let invitation = json!({"claim": "tier", "values": ["gold", "platinum"], "codes": true});
    let deal = app
        .given_deal(&room_deal("inv1", 10, invite_room(invitation), json!({})))
        .await;
    let claim_only = json!({"claim": "tier", "values": ["gold"]});
    let gold_only = app
        .given_deal(&room_deal("inv1g", 10, invite_room(claim_only), json!({})))
        .await;
    for invalid in [
        json!({"codes": false}),
        json!({"values": ["gold"]}),
        json!({"claim": "tier"}),
    ] {
        app.create_deal(&room_deal("invbad", 10, invite_room(invalid), json!({})))
            .await
            .expect_problem(422, "invalid-request");
    }
    issue_codes(&app, &gold_only, 1)
        .await
        .expect_problem(409, "invalid-request");
    issue_codes(&app, &deal, 51)
        .await
        .expect_problem(400, "invalid-request");
    let codes = codes_of(&issue_codes(&app, &deal, 3).await.expect(201));

    // Act
    let stranger = join_as(
        &app,
        "stranger",
        json!({"tier": "silver"}),
        &deal,
        Value::Null,
    )
    .await;
    let made_up = json!({"access_code": "0123456789abcdef0123456789abcdef"});
    let forged = join_as(&app, "forger", json!({}), &deal, made_up).await;
    let junk = join_as(&app, "junk", json!({}), &deal, json!({"code": "x"})).await;
    let coded_away = join_as(
        &app,
        "coded",
        json!({}),
        &gold_only,
        json!({"access_code": codes[1]}),
    )
    .await;
    let gold = join_as(
        &app,
        "goldie",
        json!({"tier": ["x", "gold"]}),
        &deal,
        Value::Null,
    )
    .await;
    let first = json!({"access_code": codes[0]});
    let redeemer = join_as(&app, "redeemer", json!({}), &deal, first.clone()).await;
    let again = join_as(&app, "redeemer", json!({}), &deal, first.clone()).await;
    let without = join_as(&app, "redeemer", json!({}), &deal, Value::Null).await;
    let thief = join_as(&app, "thief", json!({}), &deal, first).await;

    // Assert: refusals are their own problems and take no place; the claim and a code join,
    // and the code stays its redeemer's alone.
    stranger.expect_problem(403, "invitation-required");
    forged.expect_problem(403, "access-code-invalid");
    junk.expect_problem(400, "invalid-request");
    coded_away.expect_problem(403, "invitation-required");
    assert_eq!(gold.expect(201)["position"], 1);
    let ticket = redeemer.expect(201)["ticket"].clone();
    assert_eq!(again.expect(201)["ticket"], ticket);
    assert_eq!(without.expect(201)["ticket"], ticket);
    thief.expect_problem(409, "access-code-used");
    let public = line(&app, &deal).await;
    assert_eq!(
        public["waiting"].as_u64().unwrap() + public["admitted_through"].as_u64().unwrap(),
        2
    );
    assert_eq!(line(&app, &gold_only).await["waiting"], 0);
    let room = admin_room(&app, &deal).await;
    assert_eq!(room["access_codes"], json!({"issued": 3, "redeemed": 1}));
    assert_eq!(room["invitation"]["claim"], "tier");
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invitation_value_with_a_nul_is_refused_and_nothing_is_stored() {
    // Arrange
    let app = app().await;
    let invitation = json!({"claim": "tier", "values": ["go\u{0}ld"]});

    // Act
    let refused = app
        .create_deal(&room_deal("invnul", 10, invite_room(invitation), json!({})))
        .await;

    // Assert: a bound broken is 400 (the terms are stored as JSON, which holds no NUL).
    refused.expect_problem(400, "invalid-request");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM deals WHERE id = 'invnul'")
        .fetch_one(&app.db)
        .await
        .expect("deals read");
    assert_eq!(stored, 0);
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codes_are_stored_as_digests_only() {
    // Arrange
    let app = app().await;
    let deal = app
        .given_deal(&room_deal(
            "inv2",
            10,
            invite_room(json!({"codes": true})),
            json!({}),
        ))
        .await;

    // Act
    let codes = codes_of(&issue_codes(&app, &deal, 5).await.expect(201));

    // Assert: every stored row is the SHA-256 of a code, and no column holds a code.
    assert_eq!(codes.iter().collect::<BTreeSet<_>>().len(), 5);
    assert!(codes.iter().all(|c| c.len() == 32), "{codes:?}");
    let rows: Vec<(Vec<u8>, String)> = sqlx::query_as(
        "SELECT code_sha256, row_to_json(a)::text FROM access_codes a WHERE deal_id = $1",
    )
    .bind(&deal)
    .fetch_all(&app.db)
    .await
    .expect("the codes table reads");
    let stored: BTreeSet<Vec<u8>> = rows.iter().map(|(d, _)| d.clone()).collect();
    let expected: BTreeSet<Vec<u8>> = codes
        .iter()
        .map(|c| Sha256::digest(c.as_bytes()).to_vec())
        .collect();
    assert_eq!(stored, expected);
    for (_, row) in &rows {
        assert!(codes.iter().all(|c| !row.contains(c.as_str())), "{row}");
    }
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_code_tried_eight_times_at_once_on_two_gateways_is_redeemed_once() {
    // Arrange
    let app = app().await;
    let sibling = spawn_sibling(&app.settings).await;
    let deal = app
        .given_deal(&room_deal(
            "inv3",
            10,
            invite_room(json!({"codes": true})),
            json!({}),
        ))
        .await;
    let code = codes_of(&issue_codes(&app, &deal, 1).await.expect(201)).remove(0);

    // Act: eight buyers, four on each gateway, at once.
    let mut tries = tokio::task::JoinSet::new();
    for k in 0..8 {
        let api: Api = if k % 2 == 0 {
            app.api.clone()
        } else {
            sibling.api.clone()
        };
        let (deal, body) = (deal.clone(), json!({ "access_code": code }));
        tries.spawn(async move { join_as(&api, &format!("try{k}"), json!({}), &deal, body).await });
    }
    let replies = tries.join_all().await;

    // Assert: exactly one ticket; everyone else was told the code is used.
    let won = replies.iter().filter(|r| r.status == 201).count();
    assert_eq!(won, 1, "{replies:?}");
    for reply in replies.iter().filter(|r| r.status != 201) {
        reply.expect_problem(409, "access-code-used");
    }
    let redeemed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM access_codes WHERE deal_id = $1 AND redeemed_by IS NOT NULL",
    )
    .bind(&deal)
    .fetch_one(&app.db)
    .await
    .expect("the codes table reads");
    assert_eq!(redeemed, 1);
    sibling.stop().await;
    app.cleanup().await;
}
