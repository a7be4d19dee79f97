//! Batches racing on one buyer's key. Inventory locks a batch's buyers before it decides and
//! orders are inserted after it, under those locks: two batches sending the same key at
//! once (from two lanes, one of them careful, or through two deals) must both be answered,
//! with exactly one order placed, no deadlock and no unit lost.

use flashgate::deals::{self, Deal};
use flashgate::orders::batch::{BatchOptions, Request, place_batch};
use flashgate::orders::{OrderError, Placed, fingerprint};
use serde_json::json;

use crate::helpers::{TestApp, new_deal, spawn_app, unique_suffix};

const ROUNDS: usize = 24;

async fn deal(app: &TestApp) -> Deal {
    let mut body = new_deal(&format!("race-{}", unique_suffix()), 1_000, 2);
    body["per_user_limit"] = json!(2);
    let id = app.given_deal(&body).await;
    deals::load(&app.db, &id).await.unwrap().unwrap()
}

/// The contested request, after a few new buyers so that the batch has others to decide.
fn batch(deal: &Deal, user: &str, key: &str, others: &str) -> Vec<Request> {
    let request = |user: String, key: String| Request {
        user_id: user,
        key,
        quantity: 1,
        fingerprint: fingerprint(&deal.id, 1),
    };
    let mut requests: Vec<Request> = (0..3)
        .map(|n| request(format!("{others}-{n}"), "k".into()))
        .collect();
    requests.push(request(user.into(), key.into()));
    requests
}

fn options(lane: i32, careful: bool) -> BatchOptions {
    BatchOptions {
        share: vec![lane],
        hook: None,
        commit_before_answer: false,
        careful,
    }
}

fn contested(results: &[Result<Placed, OrderError>]) -> &Result<Placed, OrderError> {
    results.last().expect("the contested request is last")
}

#[tokio::test(flavor = "multi_thread")]
async fn two_lanes_sending_one_key_at_once_place_one_order() {
    let app = spawn_app().await;
    let deal = deal(&app).await;
    for round in 0..ROUNDS {
        // Arrange
        let (user, key) = (format!("buyer-{round}"), format!("key-{round}"));
        let first = batch(&deal, &user, &key, &format!("a{round}"));
        let second = batch(&deal, &user, &key, &format!("b{round}"));

        let (plain, either) = (options(0, false), options(1, round % 2 == 0));

        // Act
        let (a, b) = tokio::join!(
            place_batch(&app.db, &deal, &first, &plain),
            place_batch(&app.db, &deal, &second, &either),
        );

        // Assert: one placed it, the other replays that very order.
        let (a, b) = (
            a.expect("first batch answered"),
            b.expect("second answered"),
        );
        let placed: Vec<&Placed> = [contested(&a.results), contested(&b.results)]
            .into_iter()
            .map(|result| result.as_ref().expect("the contested request is placed"))
            .collect();
        assert_eq!(placed[0].order.id, placed[1].order.id, "round {round}");
        assert_eq!(
            placed.iter().filter(|p| p.replayed).count(),
            1,
            "round {round}: exactly one answer is a replay"
        );
        for result in a.results.iter().chain(&b.results) {
            assert!(result.is_ok(), "round {round}: {result:?}");
        }
    }
    app.assert_invariants(&deal.id).await;
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_key_sent_to_two_deals_at_once_places_one_order_and_a_conflict() {
    let app = spawn_app().await;
    let (north, south) = (deal(&app).await, deal(&app).await);
    for round in 0..ROUNDS {
        // Arrange
        let (user, key) = (format!("traveller-{round}"), format!("key-{round}"));
        let first = batch(&north, &user, &key, &format!("n{round}"));
        let second = batch(&south, &user, &key, &format!("s{round}"));

        let (either, plain) = (options(0, round % 2 == 1), options(0, false));

        // Act
        let (a, b) = tokio::join!(
            place_batch(&app.db, &north, &first, &either),
            place_batch(&app.db, &south, &second, &plain),
        );

        // Assert: the key names one order; the other deal's request is a conflict.
        let (a, b) = (a.expect("north answered"), b.expect("south answered"));
        let outcomes = [contested(&a.results), contested(&b.results)];
        let placed = outcomes
            .iter()
            .filter(|r| matches!(r, Ok(p) if !p.replayed))
            .count();
        let conflicts = outcomes
            .iter()
            .filter(|r| matches!(r, Err(OrderError::IdempotencyConflict)))
            .count();
        assert_eq!((placed, conflicts), (1, 1), "round {round}: {outcomes:?}");
    }
    app.assert_invariants(&north.id).await;
    app.assert_invariants(&south.id).await;
    app.cleanup().await;
}
