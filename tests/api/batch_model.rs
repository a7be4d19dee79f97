//! Property test of the batch engine: over random mixes of new orders, repeated keys (same
//! and different bodies), replays of earlier orders, per-user limits, quantities above what
//! is left and sell-outs inside the batch, one batch gives every request exactly the answer
//! it gets when the same requests run one at a time, in the same order, against an
//! identical deal; both leave the same stock and the invariants intact. The batch either
//! inserts new keys and buyers plainly first (deciding again if one exists) or checks them
//! from the start; both must give the same answers.

use flashgate::deals::{self, Deal};
use flashgate::orders::batch::{BatchOptions, Request, place_batch};
use flashgate::orders::{OrderError, Placed, fingerprint};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;

use crate::helpers::{TestApp, buckets, new_deal, spawn_app, unique_suffix};

const USERS: usize = 4;
const KEYS: usize = 3;
const LIMIT: i32 = 3;

/// One generated request: who, which of their keys, how many units.
#[derive(Clone, Debug)]
struct Ask {
    user: usize,
    key: usize,
    quantity: i32,
}

fn ask() -> impl Strategy<Value = Ask> {
    (0..USERS, 0..KEYS, 1..=LIMIT + 1).prop_map(|(user, key, quantity)| Ask {
        user,
        key,
        quantity,
    })
}

#[derive(Clone, Debug)]
struct Case {
    stock: i64,
    buckets: i64,
    /// Placed one at a time before the batch, so later requests can replay them.
    earlier: Vec<Ask>,
    batch: Vec<Ask>,
    /// The batch's lane share: a single bucket, so the batch also spills to the others.
    share: i32,
    /// Checks every key and buyer from the start instead of inserting them plainly first.
    careful: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1i64..10,
        1i64..5,
        proptest::collection::vec(ask(), 0..4),
        proptest::collection::vec(ask(), 1..16),
        0i32..5,
        any::<bool>(),
    )
        .prop_map(|(stock, buckets, earlier, batch, share, careful)| Case {
            stock,
            buckets,
            earlier,
            batch,
            share: share % buckets as i32,
            careful,
        })
}

fn request(side: &str, deal: &str, ask: &Ask) -> Request {
    Request {
        user_id: format!("{side}-user-{}", ask.user),
        key: format!("key-{}", ask.key),
        quantity: ask.quantity,
        fingerprint: fingerprint(deal, ask.quantity as u32),
    }
}

fn outcome(result: &Result<Placed, OrderError>) -> String {
    match result {
        Ok(placed) if placed.replayed => format!("replayed:{}", placed.order.quantity),
        Ok(placed) => format!("reserved:{}", placed.order.quantity),
        Err(OrderError::SoldOut { available }) => format!("sold-out:{available}"),
        Err(OrderError::PerUserLimit { .. }) => "per-user-limit".into(),
        Err(OrderError::IdempotencyConflict) => "conflict".into(),
        Err(other) => format!("error:{other}"),
    }
}

async fn deal(app: &TestApp, case: &Case) -> Deal {
    let mut body = new_deal(&format!("bm-{}", unique_suffix()), case.stock, case.buckets);
    body["per_user_limit"] = json!(LIMIT);
    let id = app.given_deal(&body).await;
    deals::load(&app.db, &id).await.unwrap().unwrap()
}

async fn one_at_a_time(app: &TestApp, deal: &Deal, requests: &[Request]) -> Vec<String> {
    let mut outcomes = Vec::new();
    for request in requests {
        let batch = place_batch(
            &app.db,
            deal,
            std::slice::from_ref(request),
            &BatchOptions::default(),
        )
        .await
        .expect("a batch of one commits");
        outcomes.push(outcome(&batch.results[0]));
    }
    outcomes
}

async fn run_case(app: &TestApp, case: &Case) {
    let (alone, batched) = (deal(app, case).await, deal(app, case).await);
    let side = |deal: &Deal, name: &str, asks: &[Ask]| -> Vec<Request> {
        asks.iter().map(|a| request(name, &deal.id, a)).collect()
    };
    one_at_a_time(app, &alone, &side(&alone, "a", &case.earlier)).await;
    one_at_a_time(app, &batched, &side(&batched, "b", &case.earlier)).await;

    let expected = one_at_a_time(app, &alone, &side(&alone, "a", &case.batch)).await;
    let options = BatchOptions {
        share: vec![case.share],
        hook: None,
        commit_before_answer: false,
        careful: case.careful,
    };
    let batch = place_batch(
        &app.db,
        &batched,
        &side(&batched, "b", &case.batch),
        &options,
    )
    .await
    .expect("the batch commits");
    let got: Vec<String> = batch.results.iter().map(outcome).collect();

    assert_eq!(got, expected, "{case:?}");
    let stock = |rows: Vec<crate::helpers::BucketRow>| -> (i64, i64) {
        (
            rows.iter().map(|b| b.available).sum(),
            rows.iter().map(|b| b.reserved).sum(),
        )
    };
    assert_eq!(
        stock(buckets(&app.db, &batched.id).await),
        stock(buckets(&app.db, &alone.id).await),
        "{case:?}"
    );
    app.assert_invariants(&alone.id).await;
    app.assert_invariants(&batched.id).await;
}

#[test]
fn a_batch_answers_every_request_as_if_it_ran_alone_in_order() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let app = runtime.block_on(spawn_app());
    let config = Config {
        cases: 48,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);

    let outcome = runner.run(&case(), |case| {
        runtime.block_on(run_case(&app, &case));
        Ok(())
    });

    runtime.block_on(app.cleanup());
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
