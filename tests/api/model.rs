//! Model-based test: random sequences of orders, replays and cancels against one deal must
//! match a simple model of stock and per-user units, and keep the invariants.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

use crate::helpers::{
    EVENTUALLY, TestApp, buckets, new_deal, spawn_app, unique_suffix, wait_until,
};

const STOCK: i64 = 5;
const PER_USER_LIMIT: i64 = 3;
const USERS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Order { user: usize, quantity: i64 },
    Replay { pick: usize },
    Cancel { pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..USERS, 1..=3i64).prop_map(|(user, quantity)| Op::Order { user, quantity }),
        1 => any::<usize>().prop_map(|pick| Op::Replay { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
    ]
}

/// An order the model knows about.
struct Placed {
    user: usize,
    key: String,
    quantity: i64,
    body: Value,
    pending: bool,
}

/// What the gateway should hold: units left and units per user.
struct Model {
    available: i64,
    held: [i64; USERS],
    orders: Vec<Placed>,
}

fn user(n: usize) -> String {
    format!("user-{n}")
}

async fn place(app: &TestApp, deal: &str, model: &mut Model, who: usize, quantity: i64) {
    let over_limit = model.held[who] + quantity > PER_USER_LIMIT;
    let short = quantity > model.available;
    let token = app.token(&user(who));
    let what = format!("an order while {} units are available", model.available);
    // A sold-out flag may lag a release by up to about a second.
    let (key, reply) = wait_until(&what, EVENTUALLY, || async {
        let key = unique_suffix();
        let reply = app.place_order(&token, deal, &key, quantity).await;
        let lagging = !over_limit && !short && reply.problem_slug().as_deref() == Some("sold-out");
        if lagging && reply.status == 409 {
            Err(reply.text)
        } else {
            Ok((key, reply))
        }
    })
    .await;
    let slug = reply.problem_slug();
    match (over_limit, short) {
        (false, false) => {
            let body = reply.expect(201);
            model.available -= quantity;
            model.held[who] += quantity;
            model.orders.push(Placed {
                user: who,
                key,
                quantity,
                body,
                pending: true,
            });
        }
        (true, false) => {
            reply.expect_problem(409, "per-user-limit");
        }
        (false, true) => {
            reply.expect_problem(409, "sold-out");
        }
        (true, true) => assert!(
            reply.status == 409 && matches!(slug.as_deref(), Some("sold-out" | "per-user-limit")),
            "over the limit and short of stock: {} {}",
            reply.status,
            reply.text
        ),
    }
}

async fn apply(app: &TestApp, deal: &str, model: &mut Model, op: &Op) {
    match *op {
        Op::Order {
            user: who,
            quantity,
        } => place(app, deal, model, who, quantity).await,
        Op::Replay { pick } => {
            let pending: Vec<&Placed> = model.orders.iter().filter(|o| o.pending).collect();
            let Some(order) = pending.get(pick % pending.len().max(1)) else {
                return;
            };
            let reply = app
                .place_order(
                    &app.token(&user(order.user)),
                    deal,
                    &order.key,
                    order.quantity,
                )
                .await;
            assert_eq!(reply.expect(201), order.body, "replay body differs");
            assert_eq!(reply.header("idempotent-replayed"), Some("true"));
        }
        Op::Cancel { pick } => {
            let count = model.orders.len().max(1);
            let Some(order) = model.orders.get_mut(pick % count) else {
                return;
            };
            let order_id = order.body["order_id"].as_str().unwrap().to_owned();
            let reply = app
                .cancel_order(&app.token(&user(order.user)), &order_id)
                .await;
            if order.pending {
                assert_eq!(reply.expect(200)["status"], "CANCELLED");
                order.pending = false;
                model.available += order.quantity;
                model.held[order.user] -= order.quantity;
            } else {
                assert_eq!(reply.status, 409, "second cancel: {}", reply.text);
            }
        }
    }
}

async fn run_case(app: &TestApp, ops: &[Op]) {
    static DEALS: AtomicUsize = AtomicUsize::new(0);
    let mut deal = new_deal(
        &format!("model-{}", DEALS.fetch_add(1, Ordering::Relaxed)),
        STOCK,
        3,
    );
    deal["per_user_limit"] = json!(PER_USER_LIMIT);
    let deal = app.given_deal(&deal).await;
    let mut model = Model {
        available: STOCK,
        held: [0; USERS],
        orders: Vec::new(),
    };
    for op in ops {
        apply(app, &deal, &mut model, op).await;
        let rows = buckets(&app.db, &deal).await;
        let available: i64 = rows.iter().map(|b| b.available).sum();
        let reserved: i64 = rows.iter().map(|b| b.reserved).sum();
        assert_eq!(
            (available, reserved),
            (model.available, STOCK - model.available),
            "after {op:?}"
        );
    }
    let per_user: BTreeMap<String, i64> = sqlx::query_as(
        "SELECT user_id, units::BIGINT FROM user_deal_units WHERE deal_id = $1 AND units > 0",
    )
    .bind(&deal)
    .fetch_all(&app.db)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let expected: BTreeMap<String, i64> = (0..USERS)
        .filter(|&u| model.held[u] > 0)
        .map(|u| (user(u), model.held[u]))
        .collect();
    assert_eq!(per_user, expected, "user_deal_units");
    app.assert_invariants(&deal).await;
}

#[test]
fn random_order_sequences_match_the_model() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let app = runtime.block_on(spawn_app());
    let config = Config {
        cases: 32,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);

    let outcome = runner.run(&proptest::collection::vec(op(), 1..14), |ops| {
        runtime.block_on(run_case(&app, &ops));
        Ok(())
    });

    runtime.block_on(app.cleanup());
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
