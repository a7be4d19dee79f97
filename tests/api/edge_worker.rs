//! The edge Worker (edge/cloudflare/worker.js) in workerd in front of a live gateway: the
//! public state served from the edge cache, a corpus of passes judged by the Worker exactly
//! as by the gateway, a key rotation through the documented steps, a revocation reaching
//! the edge within its bound, and a pass presented with another user's provider token
//! (RS256, PS256, ES256 or EdDSA, from a real OpenID provider) refused at the edge as at
//! the gateway, while forged tokens are left to the gateway.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use flashgate::config::Settings;
use flashgate::waiting_room::Passes;
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::{Value, json};

use crate::helpers::{
    Api, CountingProxy, OidcProvider, Reply, TestApp, Workerd, send, signed_token, spawn_app_with,
    spawn_sibling, wait_until,
};
use crate::waiting_room::{join, poll_until, room_deal};
use crate::waiting_room_edge::{EVENTUALLY, fast_room, ticket_of};

/// The address a CDN reports as the buyer's (`CF-Connecting-IP`).
const BUYER_IP: &str = "203.0.113.7";

/// What a wait for the edge may take past a documented bound: a poll's interval and one
/// request through workerd on a busy runner.
const SLACK: Duration = Duration::from_millis(500);

fn seed(byte: u8) -> String {
    URL_SAFE_NO_PAD.encode([byte; 32])
}

/// Gateway settings for the edge tests: passes signed by `keys`, the proxy trusted to name
/// the client, and key sets cacheable for a second so the rotation's waits are short.
fn edge_settings(s: &mut Settings, keys: &[u8]) {
    fast_room(s);
    s.waiting_room.pass_signing_keys = keys.iter().map(|k| seed(*k)).collect();
    s.waiting_room.keys_max_age_seconds = 1;
    s.server.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
}

/// Passes as the gateway with these signing keys (first signs) would mint them.
fn passes_with(settings: &Settings, keys: &[u8]) -> Passes {
    let mut room = settings.waiting_room.clone();
    room.pass_signing_keys = keys.iter().map(|k| seed(*k)).collect();
    room.pass_format = "ed25519".into();
    Passes::from_settings(&room)
}

/// A gateway behind a counting proxy, the Worker in workerd in front of the proxy, and a
/// deal whose line is open.
struct Rig {
    app: TestApp,
    deal: String,
    proxy: CountingProxy,
    /// A client of the gateway through the edge, as a CDN's visitor.
    visitor: Api,
    _edge: Workerd,
}

/// A pass sent for an order with a bearer token, and what the edge is to do with it:
/// refuse it itself for the reason named, or leave it to the origin.
struct Case {
    name: String,
    token: String,
    pass: String,
    edge_refusal: Option<&'static str>,
}

fn case(
    name: impl Into<String>,
    token: &str,
    pass: &str,
    edge_refusal: Option<&'static str>,
) -> Case {
    Case {
        name: name.into(),
        token: token.to_owned(),
        pass: pass.to_owned(),
        edge_refusal,
    }
}

impl Rig {
    async fn start(deal_id: &str, configure: impl FnOnce(&mut Settings)) -> Rig {
        let app = spawn_app_with(configure).await;
        let deal = app.given_deal(&open_room_deal(deal_id)).await;
        let proxy = CountingProxy::start(&app.base).await;
        let edge = Workerd::start(&proxy.url()).await;
        let visitor = Api::new(&edge.url, &app.ops_base, &app.settings);
        Rig {
            app,
            deal,
            proxy,
            visitor,
            _edge: edge,
        }
    }

    /// Sends each case through the edge and straight to `origin`, and checks both gave the
    /// same verdict, that the edge refused exactly the cases naming a refusal (those never
    /// reached the origin) and forwarded the others; the verdicts, in order.
    async fn judged_alike(&self, origin: &Api, cases: &[Case]) -> Vec<Value> {
        let orders_path = format!("/v1/deals/{}/orders", self.deal);
        let mut verdicts = Vec::new();
        for case in cases {
            let (name, pass) = (&case.name, Some(case.pass.as_str()));
            let before = self.proxy.count(&orders_path);
            let at_edge = order_through(&self.visitor, &case.token, &self.deal, pass).await;
            let forwarded = self.proxy.count(&orders_path) - before;
            let at_origin = order_through(origin, &case.token, &self.deal, pass).await;
            assert_eq!(
                verdict(&at_edge),
                verdict(&at_origin),
                "{name}: {} / {}",
                at_edge.text,
                at_origin.text
            );
            let decided_by = at_edge.header("flashgate-edge").map(str::to_owned);
            let refusal = case.edge_refusal.map(|reason| format!("refused {reason}"));
            assert_eq!(decided_by, refusal, "{name}: {}", at_edge.text);
            let expected = usize::from(case.edge_refusal.is_none());
            assert_eq!(
                forwarded, expected,
                "{name}: requests that reached the origin"
            );
            if case.edge_refusal.is_some() {
                at_edge.expect_problem(403, "waiting-room-required");
            }
            verdicts.push(verdict(&at_origin));
        }
        verdicts
    }
}

/// An order for one unit with the bearer `token` and, when given, `pass`, as a CDN's
/// visitor (or a client of the gateway itself, which does not trust the CDN's header).
async fn order_through(api: &Api, token: &str, deal: &str, pass: Option<&str>) -> Reply {
    let request = api
        .client
        .post(api.url(&format!("/v1/deals/{deal}/orders")))
        .bearer_auth(token)
        .header("Idempotency-Key", crate::helpers::unique_suffix())
        .header("CF-Connecting-IP", BUYER_IP)
        .json(&json!({ "quantity": 1 }));
    let request = match pass {
        Some(pass) => request.header("Flashgate-Pass", pass),
        None => request,
    };
    send(request).await
}

/// What must be the same whoever judged: the status and the problem's fields but its
/// `instance` (each names its own request id).
fn verdict(reply: &Reply) -> Value {
    let body: Value = serde_json::from_str(&reply.text).unwrap_or(Value::Null);
    match reply.status {
        201 => json!({"status": 201}),
        _ => json!({"status": reply.status, "type": body["type"], "title": body["title"],
                    "detail": body["detail"], "content_type": reply.header("content-type")}),
    }
}

/// A JWS (a pass or a token) with its payload replaced by `payload`, the signature kept.
fn edited(jws: &str, payload: &Value) -> String {
    let parts: Vec<&str> = jws.split('.').collect();
    let payload = URL_SAFE_NO_PAD.encode(payload.to_string());
    format!("{}.{payload}.{}", parts[0], parts[2])
}

/// An admitted pass of `user`, earned on the line.
async fn earned_pass(api: &Api, user: &str, deal: &str) -> (String, String) {
    let ticket = ticket_of(&join(api, user, deal).await.expect(201));
    let admitted = poll_until(api, user, deal, &ticket, &["admitted"], EVENTUALLY).await;
    (ticket, admitted["pass"].as_str().unwrap().to_owned())
}

fn open_room_deal(id: &str) -> Value {
    let room = json!({"admit_per_second": 100, "max_active": 50, "pass_ttl_seconds": 60});
    let mut deal = room_deal(id, 100, room, json!({}));
    deal["per_user_limit"] = json!(20);
    deal
}

/// Polls `user`'s order with `pass` through the edge until the edge itself refuses it for
/// `reason`, for at most `bound` and the slack; how long that took.
async fn refused_at_edge_within(
    rig: &Rig,
    user: &str,
    pass: &str,
    reason: &str,
    bound: Duration,
) -> Duration {
    let started = Instant::now();
    let token = rig.visitor.token(user);
    let refusal = format!("refused {reason}");
    wait_until(
        &format!("the edge to refuse {user}'s pass: {reason}"),
        bound + SLACK,
        || async {
            let reply = order_through(&rig.visitor, &token, &rig.deal, Some(pass)).await;
            match reply.header("flashgate-edge") {
                Some(decided) if decided == refusal => Ok(()),
                decided => Err(format!("{decided:?}, {} {}", reply.status, reply.text)),
            }
        },
    )
    .await;
    let took = started.elapsed();
    assert!(
        took <= bound + SLACK,
        "refused after {took:?}, bound {bound:?}"
    );
    took
}

#[tokio::test(flavor = "multi_thread")]
async fn the_edge_serves_public_state_from_its_cache_and_judges_passes_as_the_gateway_does() {
    // Arrange: a gateway behind a counting proxy, the Worker in workerd in front of it.
    let rig = Rig::start("edgecorpus", |s| edge_settings(s, &[1, 2])).await;
    let (app, deal, proxy, visitor) = (&rig.app, &rig.deal, &rig.proxy, &rig.visitor);

    // Act 1: a crowd reads the line and the deal through the edge for a while.
    let line_path = format!("/v1/deals/{deal}/queue");
    let deal_path = format!("/v1/deals/{deal}");
    let started = Instant::now();
    let mut reads = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        for path in [&line_path, &deal_path] {
            let reply = visitor.get(path).await;
            assert_eq!(reply.status, 200, "{}", reply.text);
            reads += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();

    // Assert 1: each read the origin about once per max-age (1 s), whatever the crowd.
    let max_age = f64::from(app.settings.server.public_cache_max_age_seconds);
    let bound = (elapsed / max_age).ceil() as usize + 1;
    for path in [&line_path, &deal_path] {
        let fetched = proxy.count(path);
        eprintln!("edge: {reads} reads in {elapsed:.1} s, {fetched} origin fetches of {path}");
        assert!(
            fetched >= 1 && fetched <= bound,
            "{fetched} fetches of {path}, bound {bound}"
        );
    }
    assert!(
        reads > 4 * bound,
        "too few reads ({reads}) to show the cache"
    );

    // Act 2: rita's session on the line is revoked; the edge refuses her pass itself
    // within the documented bound.
    let (_, revoked) = earned_pass(app, "rita", deal).await;
    order_through(visitor, &visitor.token("rita"), deal, Some(&revoked))
        .await
        .expect(201);
    app.revoke_in_line(deal, "rita").await;
    let bound = revocation_bound(&app.settings);
    let took = refused_at_edge_within(&rig, "rita", &revoked, "revoked", bound).await;
    eprintln!("edge: a revocation refused at the edge after {took:?} (bound {bound:?})");

    // Act 3: the corpus, each pass sent through the edge and straight to the gateway.
    let now = Utc::now().timestamp();
    let signer = passes_with(&app.settings, &[1, 2]);
    let second_key = passes_with(&app.settings, &[2, 1]);
    let unknown_key = passes_with(&app.settings, &[3]);
    let valid = signer.mint(deal, "alice", now + 60, "t-valid");
    let forged_payload = json!({"d": deal, "u": "bob", "e": now + 60, "p": "t-valid"});
    let corpus = [
        ("valid", "alice", valid.clone(), None),
        (
            "signed by the second published key",
            "alice",
            second_key.mint(deal, "alice", now + 60, "t-2"),
            None,
        ),
        (
            "hmac",
            "alice",
            signer.mint_hmac(deal, "alice", now + 60, "t-h"),
            None,
        ),
        (
            "edited",
            "bob",
            edited(&valid, &forged_payload),
            Some("forged"),
        ),
        (
            "expired",
            "alice",
            signer.mint(deal, "alice", now - 60, "t-old"),
            Some("expired"),
        ),
        (
            "other deal",
            "alice",
            signer.mint("another-deal", "alice", now + 60, "t-o"),
            Some("other_deal"),
        ),
        (
            "unpublished key",
            "alice",
            unknown_key.mint(deal, "alice", now + 60, "t-u"),
            Some("forged"),
        ),
        ("garbage", "alice", "a.b.c".into(), Some("forged")),
        (
            "too long",
            "alice",
            format!("{valid}{}", "A".repeat(1100)),
            Some("forged"),
        ),
        ("other user", "bob", valid.clone(), None),
        ("revoked", "rita", revoked, Some("revoked")),
    ];
    let cases: Vec<Case> = corpus
        .iter()
        .map(|(name, user, pass, refusal)| case(*name, &app.token(user), pass, *refusal))
        .collect();

    // Assert 2: the same verdict from both; the edge itself refused what it can judge, and
    // those never reached the origin.
    rig.judged_alike(app, &cases).await;
    let alice = app.token("alice");
    let missing_edge = order_through(visitor, &alice, deal, None).await;
    let missing_origin = order_through(app, &alice, deal, None).await;
    assert_eq!(verdict(&missing_edge), verdict(&missing_origin));
    assert_eq!(verdict(&missing_origin)["status"], 403);

    // The buyer's address reached the origin in the header the gateway trusts.
    let forwarded = proxy.forwarded_for();
    assert!(
        !forwarded.is_empty() && forwarded.iter().all(|f| f == BUYER_IP),
        "{forwarded:?}"
    );
    rig.app.cleanup().await;
}

/// How long after a revocation the edge refuses the pass at the latest, as docs/EDGE.md
/// states it: the instance's revocation poll plus the feed's max-age, plus a fetch's time.
fn revocation_bound(settings: &Settings) -> Duration {
    Duration::from_millis(settings.waiting_room.revocation_poll_ms)
        + Duration::from_secs(u64::from(settings.server.public_cache_max_age_seconds))
        + Duration::from_millis(200)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_rotation_through_the_documented_steps_keeps_valid_passes_working_at_the_edge() {
    // Arrange: key 1 signs; a pass earned with it; the edge has cached the key set.
    let rig = Rig::start("edgerotate", |s| edge_settings(s, &[1])).await;
    let (app, deal, proxy, visitor) = (&rig.app, &rig.deal, &rig.proxy, &rig.visitor);
    let (_, old_pass) = earned_pass(app, "olga", deal).await;
    order_through(visitor, &visitor.token("olga"), deal, Some(&old_pass))
        .await
        .expect(201);
    let keys_max_age = Duration::from_secs(app.settings.waiting_room.keys_max_age_seconds);
    let restart = |keys: &'static [u8]| {
        let mut settings = app.settings.clone();
        edge_settings(&mut settings, keys);
        settings
    };

    // Act / Assert, step 1: key 2 is published second on every instance; the edge takes
    // the new set within the keys' max-age (at once for a pass naming the new key).
    let step1 = spawn_sibling(&restart(&[1, 2])).await;
    proxy.point_at(&step1.base);
    let probe =
        passes_with(&app.settings, &[2, 1]).mint(deal, "paul", Utc::now().timestamp() + 60, "t-p");
    let paul = visitor.token("paul");
    wait_until("the edge to take key 2", keys_max_age + SLACK, || async {
        let reply = order_through(visitor, &paul, deal, Some(&probe)).await;
        match (reply.status, reply.header("flashgate-edge")) {
            (201, None) => Ok(()),
            (status, decided) => Err(format!("{status} {decided:?} {}", reply.text)),
        }
    })
    .await;
    // Step 2: key 2 signs. Passes of both keys work at the edge.
    let step2 = spawn_sibling(&restart(&[2, 1])).await;
    proxy.point_at(&step2.base);
    step1.stop().await;
    let (_, new_pass) = earned_pass(&step2, "nina", deal).await;
    assert_ne!(
        new_pass.split('.').next(),
        old_pass.split('.').next(),
        "a new key id"
    );
    for (user, pass) in [("nina", &new_pass), ("olga", &old_pass)] {
        let reply = order_through(visitor, &visitor.token(user), deal, Some(pass)).await;
        assert_eq!(
            reply.header("flashgate-edge"),
            None,
            "{user}: {}",
            reply.text
        );
        reply.expect(201);
    }
    // Step 3: key 1 is dropped; once cached key sets expire (within their max-age) its
    // passes are forged at the edge too, and key 2's keep working.
    let step3 = spawn_sibling(&restart(&[2])).await;
    proxy.point_at(&step3.base);
    step2.stop().await;
    refused_at_edge_within(&rig, "olga", &old_pass, "forged", keys_max_age).await;
    let cases = [
        case(
            "a pass of the dropped key",
            &app.token("olga"),
            &old_pass,
            Some("forged"),
        ),
        case("a pass of key 2", &app.token("nina"), &new_pass, None),
    ];
    let verdicts = rig.judged_alike(&step3, &cases).await;
    assert_eq!(verdicts[1]["status"], 201);
    step3.stop().await;
    rig.app.cleanup().await;
}

/// The algorithms of the provider's keys, each signing buyers' tokens.
const ALGORITHMS: [&str; 4] = ["RS256", "PS256", "ES256", "EdDSA"];

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_with_another_users_provider_token_is_refused_at_the_edge_as_at_the_gateway() {
    // Arrange: buyers' tokens from an OpenID provider with a key of each algorithm; an
    // attacker's keys of the same kinds; the Worker in front.
    let provider = OidcProvider::start_signing("edge", &ALGORITHMS[1..]).await;
    provider.generate_key("attacker");
    let issuer = provider.issuer();
    let rig = Rig::start("edgeuser", move |s| {
        edge_settings(s, &[1]);
        s.auth.oidc.issuer = issuer;
        s.auth.oidc.audience = "flashgate".into();
    })
    .await;
    let (app, deal, visitor) = (&rig.app, &rig.deal, &rig.visitor);
    let published = visitor.get("/.well-known/flashgate-keys.json").await;
    let document: Value = serde_json::from_str(&published.text).unwrap();
    assert_eq!(document["provider"]["issuer"], provider.issuer());
    assert_eq!(document["provider"]["audience"], "flashgate");
    let now = Utc::now().timestamp();
    let signer = passes_with(&app.settings, &[1]);
    let own = signer.mint(deal, "buyer-1", now + 60, "t-own");
    let other = signer.mint(deal, "buyer-2", now + 60, "t-other");
    let mut cases = Vec::new();
    let mut forged = Vec::new();
    for alg in ALGORITHMS {
        let token = provider.token_signed("buyer-1", alg).await;
        let renamed = edited(&token, &claims_naming(&token, "buyer-2"));
        cases.extend([
            case(format!("{alg}: own pass"), &token, &own, None),
            case(
                format!("{alg}: another user's pass"),
                &token,
                &other,
                Some("other_user"),
            ),
            case(
                format!("{alg}: the token edited to name that user"),
                &renamed,
                &other,
                None,
            ),
        ]);
        for (what, token) in forgeries(&provider, alg, &token) {
            forged.push(case(format!("{alg}: {what}"), &token, &other, None));
        }
    }

    // Act / Assert: the same verdict through the edge and straight at the gateway; the
    // edge verified every algorithm's token and refused the other user's pass itself, and
    // left each token it could not verify (edited or forged) to the origin, which refused
    // it.
    let verdicts = rig.judged_alike(app, &cases).await;
    for (case, verdict) in cases.iter().zip(&verdicts) {
        let status = match case.edge_refusal {
            Some(_) => 403,
            None if case.name.ends_with("own pass") => 201,
            None => 401,
        };
        assert_eq!(verdict["status"], status, "{}", case.name);
    }
    for (case, verdict) in forged.iter().zip(rig.judged_alike(app, &forged).await) {
        assert_eq!(verdict["status"], 401, "{}", case.name);
    }
    rig.app.cleanup().await;
}

/// Tokens naming buyer-1 that neither the gateway nor the edge may accept, each made as an
/// attacker who knows the provider's public keys, their kids and a genuine `token` (signed
/// with `alg`) can: no signature, the public key as an HMAC secret, another key under the
/// kid, and a key of the provider's used under the kid of another or with another algorithm.
fn forgeries(provider: &OidcProvider, alg: &str, token: &str) -> Vec<(String, String)> {
    let name = |owner: &str, alg: &str| match alg {
        "RS256" => owner.to_owned(),
        _ => format!("{owner}-{alg}"),
    };
    let (real, kid, algorithm) = provider.signing_key(&name("edge", alg));
    let (attacker, _, _) = provider.signing_key(&name("attacker", alg));
    let next = ALGORITHMS[(ALGORITHMS.iter().position(|a| *a == alg).unwrap() + 1) % 4];
    let (neighbour, _, neighbour_algorithm) = provider.signing_key(&name("edge", next));
    let public_as_secret =
        EncodingKey::from_secret(&provider.public_pem(&name("edge", alg))).unwrap();
    let claims = claims_naming(token, "buyer-1");
    let none = json!({"alg": "none", "typ": "at+jwt", "kid": kid});
    let unsigned = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(none.to_string()),
        token.split('.').nth(1).unwrap()
    );
    let mut forged = vec![
        ("alg none".to_owned(), unsigned),
        (
            "HS256 with the public key".to_owned(),
            signed_token(Algorithm::HS256, &kid, &public_as_secret, &claims),
        ),
        (
            "another key, same kid".to_owned(),
            signed_token(algorithm, &kid, &attacker, &claims),
        ),
        (
            format!("the {next} key under this kid"),
            signed_token(neighbour_algorithm, &kid, &neighbour, &claims),
        ),
    ];
    let other_rsa = match algorithm {
        Algorithm::RS256 => Some(Algorithm::PS256),
        Algorithm::PS256 => Some(Algorithm::RS256),
        _ => None,
    };
    if let Some(other) = other_rsa {
        let what = format!("this key signing {other:?}");
        forged.push((what, signed_token(other, &kid, &real, &claims)));
    }
    forged
}

/// The claims of `token` with its subject replaced by `user`.
fn claims_naming(token: &str, user: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    let mut claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    claims["sub"] = json!(user);
    claims
}
