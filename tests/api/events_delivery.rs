//! Order and deal events pushed to a real receiver process that verifies every delivery
//! with the Standard Webhooks reference library (`scripts/events_receiver.py`, PyPI
//! `standardwebhooks`): a whole sale with payments arrives once per committed change, each
//! order's events in sequence, and faults of the receiver lose nothing and keep the order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use flashgate::config::Settings;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::events_api::pull_all;
use crate::helpers::{
    Api, PayApp, Receiver, TestApp, intent_id, new_deal, send, spawn_app_with, spawn_pay_app_with,
    wait_until,
};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

/// Long enough for late payments (a one-second reservation, its expiry and the provider's
/// answer) on a busy machine.
const SALE: Duration = Duration::from_secs(60);

/// Event machinery sped up for a test: quick polls, short retries, inward targets allowed.
pub fn fast_events(s: &mut Settings) {
    s.events.enabled = true;
    s.events.allow_private_targets = true;
    s.events.leader_retry_ms = 200;
    s.events.poll_interval_max_ms = 100;
    s.events.retry_initial_ms = 50;
    s.events.retry_max_ms = 500;
    s.events.request_timeout_ms = 1000;
    s.events.maintenance_interval_ms = 200;
}

/// Subscribes `receiver` to every event; returns the endpoint's id and secret.
pub async fn subscribe(app: &Api, receiver: &Receiver) -> (String, String) {
    let request = app.client.post(app.url("/admin/event-endpoints"));
    let body = json!({"url": receiver.url()});
    let created = send(request.bearer_auth(&app.admin_token).json(&body))
        .await
        .expect(201);
    let secret = created["secret"].as_str().unwrap().to_owned();
    receiver.control(json!({"secrets": [secret]})).await;
    (created["id"].as_str().unwrap().to_owned(), secret)
}

/// Places one unit for `user` and returns the order's answer.
async fn reserve(app: &PayApp, user: &str, deal: &str) -> Value {
    app.place_order(&app.token(user), deal, user, 1)
        .await
        .expect(201)
}

async fn wait_status(app: &PayApp, user: &str, order: &Value, wanted: &str) {
    let id = order["order_id"].as_str().unwrap();
    app.wait_for_order(&app.token(user), id, &[wanted], SALE)
        .await;
}

async fn admin_post(app: &PayApp, path: &str) -> Value {
    let request = app.client.post(app.url(path)).bearer_auth(&app.admin_token);
    send(request).await.expect(200)
}

/// A deal with one-second reservations and `policy` for money that comes later.
fn late_deal(id: &str, policy: &str) -> Value {
    let mut deal = new_deal(id, 5, 2);
    deal["reservation_ttl_seconds"] = json!(1);
    deal["late_payment_policy"] = json!(policy);
    deal
}

/// Pays `order` after it expired; waits for `outcome`.
async fn pay_late(app: &PayApp, user: &str, order: &Value, outcome: &str) {
    wait_status(app, user, order, "EXPIRED").await;
    app.sim.force_succeed(&intent_id(order)).await;
    wait_status(app, user, order, outcome).await;
}

/// The sale: reserve, sell out, refuse, cancel, reopen, pay, decline, pause and resume,
/// expire, and late money under each policy, with a manual review fulfilled and refunded.
async fn whole_sale(app: &PayApp) {
    let main = app.given_deal(&new_deal("ev-main", 2, 2)).await;
    let a = reserve(app, "a", &main).await;
    let b = reserve(app, "b", &main).await;
    app.order("c", &main, 1).await.expect(409);
    let b_id = b["order_id"].as_str().unwrap();
    app.cancel_order(&app.token("b"), b_id).await.expect(200);
    assert_eq!(app.sim.pay(&intent_id(&a)).await.0, 200);
    wait_status(app, "a", &a, "PAID").await;
    let c = reserve(app, "c", &main).await;
    assert_eq!(app.sim.decline(&intent_id(&c)).await.0, 200);
    wait_status(app, "c", &c, "CANCELLED").await;
    admin_post(app, &format!("/admin/deals/{main}/pause")).await;
    admin_post(app, &format!("/admin/deals/{main}/resume")).await;

    let again = app
        .given_deal(&late_deal("ev-late-again", "reserve_or_refund"))
        .await;
    let refund = app.given_deal(&late_deal("ev-late-refund", "refund")).await;
    let review = app
        .given_deal(&late_deal("ev-late-review", "manual_review"))
        .await;
    let d = reserve(app, "d", &again).await;
    let e = reserve(app, "e", &refund).await;
    let f = reserve(app, "f", &review).await;
    let g = reserve(app, "g", &review).await;
    pay_late(app, "d", &d, "PAID").await;
    pay_late(app, "e", &e, "REFUNDED").await;
    pay_late(app, "f", &f, "MANUAL_REVIEW").await;
    pay_late(app, "g", &g, "MANUAL_REVIEW").await;
    let f_id = f["order_id"].as_str().unwrap();
    admin_post(app, &format!("/admin/orders/{f_id}/review/fulfil")).await;
    let g_id = g["order_id"].as_str().unwrap();
    admin_post(app, &format!("/admin/orders/{g_id}/review/refund")).await;
    wait_status(app, "g", &g, "REFUNDED").await;
}

/// An event as PostgreSQL holds it.
#[derive(Debug)]
struct Row {
    id: i64,
    kind: String,
    order_id: Option<Uuid>,
    deal_id: String,
    sequence: i32,
    status: Option<String>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Row {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            kind: row.try_get("type")?,
            order_id: row.try_get("order_id")?,
            deal_id: row.try_get("deal_id")?,
            sequence: row.try_get("sequence")?,
            status: row.try_get("status")?,
        })
    }
}

/// Waits until the receiver holds every event PostgreSQL committed (and the sequencer
/// positioned); returns what the receiver got.
pub async fn wait_delivered(app: &TestApp, receiver: &Receiver, limit: Duration) -> Vec<Value> {
    wait_delivered_on(&app.db, receiver, limit).await
}

/// As [`wait_delivered`], for a gateway reading `db`.
pub async fn wait_delivered_on(db: &PgPool, receiver: &Receiver, limit: Duration) -> Vec<Value> {
    wait_until("every committed event at the receiver", limit, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM events e
              WHERE NOT EXISTS (SELECT 1 FROM event_positions p WHERE p.event_id = e.id)",
        )
        .fetch_one(db)
        .await
        .unwrap();
        let committed: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
            .fetch_one(db)
            .await
            .unwrap();
        let received = receiver.received().await;
        let distinct = crate::helpers::distinct_ids(&received);
        if waiting == 0 && distinct as i64 == committed {
            Ok(received)
        } else {
            Err(format!(
                "{distinct} of {committed} received, {waiting} not yet positioned"
            ))
        }
    })
    .await
}

/// After dedup by `webhook-id`: exactly PostgreSQL's events, each verified by the reference
/// library, each order's (and deal's) first arrivals in sequence, every order's last event
/// stating its status in `orders`, and no event for an order that does not exist.
pub async fn check_against_database(app: &TestApp, received: &[Value]) -> usize {
    check_on(app, &app.db, received).await
}

/// As [`check_against_database`], for the gateway of `api` on `db`.
pub async fn check_on(app: &Api, db: &PgPool, received: &[Value]) -> usize {
    let mut first: Vec<&Value> = Vec::new();
    let mut seen: HashMap<&str, &Value> = HashMap::new();
    for delivery in received {
        let verified = delivery["verified_by"].as_array().unwrap();
        assert!(
            !verified.is_empty(),
            "not verified by the reference library: {delivery}"
        );
        let id = delivery["webhook_id"].as_str().unwrap();
        match seen.get(id) {
            Some(earlier) => assert_eq!(
                earlier["event"], delivery["event"],
                "{id} sent twice differently"
            ),
            None => {
                seen.insert(id, delivery);
                first.push(delivery);
            }
        }
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT e.id, e.type, e.order_id, e.deal_id, e.sequence, e.status
           FROM events e JOIN event_positions p ON p.event_id = e.id ORDER BY p.position",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let by_id: BTreeMap<String, &Row> = rows.iter().map(|r| (format!("evt_{}", r.id), r)).collect();
    let got: BTreeSet<&str> = seen.keys().copied().collect();
    let want: BTreeSet<&str> = by_id.keys().map(String::as_str).collect();
    assert_eq!(got, want, "the receiver holds exactly PostgreSQL's events");
    let mut last_sequence: HashMap<String, i64> = HashMap::new();
    for delivery in &first {
        let event = &delivery["event"];
        let row = by_id[delivery["webhook_id"].as_str().unwrap()];
        assert_eq!(event["type"], row.kind);
        assert_eq!(event["data"]["sequence"], row.sequence);
        assert_eq!(event["data"]["deal_id"], row.deal_id);
        assert_eq!(event["data"]["status"].as_str(), row.status.as_deref());
        let object = match row.order_id {
            Some(order) => order.to_string(),
            None => format!("deal:{}", row.deal_id),
        };
        let previous = last_sequence
            .insert(object.clone(), i64::from(row.sequence))
            .unwrap_or(0);
        assert_eq!(
            i64::from(row.sequence),
            previous + 1,
            "{object} arrived out of sequence"
        );
    }
    let orders: Vec<(Uuid, String)> = sqlx::query_as("SELECT id, status FROM orders")
        .fetch_all(db)
        .await
        .unwrap();
    let statuses: HashMap<Uuid, &str> = orders.iter().map(|(id, s)| (*id, s.as_str())).collect();
    for (order, status) in &orders {
        let of_order: Vec<&&Row> = by_id
            .values()
            .filter(|r| r.order_id == Some(*order))
            .collect();
        let last = of_order
            .iter()
            .max_by_key(|r| r.sequence)
            .expect("every order has events");
        assert_eq!(
            last.status.as_deref(),
            Some(status.as_str()),
            "order {order}'s last event"
        );
        let first = of_order.iter().min_by_key(|r| r.sequence).unwrap();
        assert_eq!((first.sequence, first.kind.as_str()), (1, "order.reserved"));
    }
    for row in &rows {
        if let Some(order) = row.order_id {
            assert!(
                statuses.contains_key(&order),
                "event for an order that never committed: {row:?}"
            );
        }
    }
    assert_eq!(
        pull_all(app).await.len(),
        rows.len(),
        "the pull feed holds the same events"
    );
    seen.len()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_whole_sale_reaches_the_receiver_once_per_committed_change_in_sequence() {
    let app = spawn_pay_app_with(fast_events).await;
    let receiver = Receiver::start(&[]).await;
    subscribe(&app, &receiver).await;

    whole_sale(&app).await;

    let received = wait_delivered(&app, &receiver, SALE).await;
    let events = check_against_database(&app, &received).await;
    let kinds: BTreeSet<String> = received
        .iter()
        .map(|r| r["event"]["type"].as_str().unwrap().to_owned())
        .collect();
    for kind in flashgate::events::TYPES {
        assert!(
            kinds.contains(kind),
            "the sale produced every event type; missing {kind}: {kinds:?}"
        );
    }
    assert_eq!(
        events, 28,
        "twelve changes of the first deal, sixteen of the late payments"
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deliveries_give_way_while_the_feed_is_hot_and_follow_once_it_cools() {
    const ORDERS: usize = 30;
    let app = spawn_app_with(|s| {
        fast_events(s);
        // Any steady run of orders is a hot feed here, and nothing gets old enough to be
        // sent by age during the test.
        s.events.yield_above_per_second = 1;
        s.events.yield_max_ms = 600_000;
    })
    .await;
    let receiver = Receiver::start(&[]).await;
    subscribe(&app, &receiver).await;
    let deal = app.given_deal(&new_deal("ev-hot", ORDERS as i64, 1)).await;

    for user in 0..ORDERS {
        app.order(&format!("hot-{user}"), &deal, 1)
            .await
            .expect(201);
    }
    let during = receiver.received().await.len();
    assert!(
        during < ORDERS / 3,
        "only what came before the feed counted as hot was sent during the run: {during}"
    );

    let received = wait_delivered(&app, &receiver, SALE).await;
    assert_eq!(
        check_against_database(&app, &received).await,
        ORDERS + 1,
        "once the orders stopped, every event (each order's, then the sell-out) followed, in sequence"
    );
    app.cleanup().await;
}
