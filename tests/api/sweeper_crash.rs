//! A gateway SIGKILLed in the middle of an expiry batch: the batch's orders are already
//! marked EXPIRED inside its transaction, their units not yet returned. Nothing of the
//! half-done batch may become visible, webhooks keep landing on another gateway meanwhile,
//! and the surviving sweeper later expires every order exactly once.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};

use crate::helpers::{
    Api, ChildGuard, SETTLE, Sim, TestDb, assert_invariants, delete_redis_keys, eventually,
    intent_id, new_deal, payment_settings, stock, test_settings,
};
use crate::multi_process::{spawn_gateway_with, wait_until_healthy};

/// Orders in the batch the gateway dies in.
const BATCH: usize = 40;
/// A sweeper that looks often, so the batch starts soon after the orders are overdue.
const FAST_SWEEPER: [(&str, &str); 1] = [("FLASHGATE__SWEEPER__INTERVAL_MS", "100")];

/// Holds every bucket of `deal`, so a sweeper releasing units of that deal waits on it.
async fn hold_buckets(db: &PgPool, deal: &str) -> Transaction<'static, Postgres> {
    let mut tx = db.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM inventory_buckets WHERE deal_id = $1 FOR UPDATE")
        .bind(deal)
        .execute(&mut *tx)
        .await
        .expect("lock the buckets");
    tx
}

/// The backend of a sweeper that has marked its batch and waits to return the units.
async fn sweeper_waiting_on_buckets(db: &PgPool) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()
            AND wait_event_type = 'Lock'
            AND query LIKE '%FROM inventory_buckets%reservation_lines%'",
    )
    .fetch_optional(db)
    .await
    .expect("read pg_stat_activity")
}

async fn orders_in(db: &PgPool, deal: &str, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders WHERE deal_id = $1 AND status = $2")
        .bind(deal)
        .bind(status)
        .fetch_one(db)
        .await
        .expect("count orders")
}

async fn started(settings: &flashgate::config::Settings) -> (Api, ChildGuard) {
    let api = Api::on_free_ports(settings);
    let mut gateway = spawn_gateway_with(settings, &api, &FAST_SWEEPER);
    wait_until_healthy(&mut gateway, &api).await;
    (api, gateway)
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_in_the_middle_of_a_sweeper_batch_loses_and_doubles_nothing() {
    // Arrange: gateway A with 40 unpaid orders on one deal, long overdue (past the payment
    // grace too), and an order with a payment on another deal.
    let database = TestDb::create().await;
    let sim = Sim::start().await;
    let mut settings = test_settings(&database.url);
    payment_settings(&mut settings, &sim.base);
    let db = database.connect(4).await;
    let (a, mut gateway_a) = started(&settings).await;
    let swept = a.given_deal(&new_deal("swept", 100, 4)).await;
    let paid = a.given_deal(&new_deal("paid", 10, 2)).await;
    for n in 0..BATCH {
        a.order(&format!("x-{n}"), &swept, 1).await.expect(201);
    }
    let payer = a.token("payer");
    let order = a.place_order(&payer, &paid, "pay-1", 1).await.expect(201);
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let held = hold_buckets(&db, &swept).await;
    sqlx::query("UPDATE orders SET expires_at = now() - interval '1 hour' WHERE deal_id = $1")
        .bind(&swept)
        .execute(&db)
        .await
        .expect("make the orders overdue");

    // Act 1: A's sweeper marks the batch and waits for the buckets; A is SIGKILLed there.
    let waiting = eventually(Duration::from_secs(30), || sweeper_waiting_on_buckets(&db)).await;
    assert!(waiting.is_some(), "A's sweeper never reached the buckets");
    gateway_a.kill();

    // Act 2: while the dead gateway's transaction still holds the batch, gateway B comes
    // up and the provider's webhook for the other order lands on it.
    let (b, mut gateway_b) = started(&settings).await;
    sim.set_webhook_url(&b.public_url("/v1/webhooks/sim")).await;
    let (status, body) = sim.pay(&intent_id(&order)).await;
    assert_eq!(status, 200, "pay: {body}");
    let paid_in_time = eventually(SETTLE, || async {
        let reply = b.get_order(&payer, &order_id).await;
        (reply.status == 200 && reply.json()["status"] == "PAID").then_some(())
    })
    .await;
    assert!(
        paid_in_time.is_some(),
        "the webhook never settled the order"
    );
    // The simulator counts a delivery once it has read the answer, which the gateway
    // sends after its commit: the order can read PAID a moment before the count moves.
    let delivered = eventually(SETTLE, || async {
        let (_, delivered) = sim.succeeded_deliveries(&intent_id(&order)).await;
        (delivered > 0).then_some(())
    })
    .await;
    assert!(
        delivered.is_some(),
        "the payment was settled by its webhook"
    );

    // Assert 1: nothing of the half-done batch is visible; no unit came back yet.
    assert_eq!(
        orders_in(&db, &swept, "PENDING_PAYMENT").await,
        BATCH as i64
    );
    assert_eq!(stock(&db, &swept).await, (60, 40, 0));

    // Act 3: the buckets are free again; the dead gateway's transaction cannot commit.
    held.rollback().await.expect("release the buckets");

    // Assert 2: B's sweeper expires every order once and every unit is back.
    let all_expired = eventually(Duration::from_secs(30), || async {
        (orders_in(&db, &swept, "EXPIRED").await == BATCH as i64).then_some(())
    })
    .await;
    assert!(all_expired.is_some(), "the batch was never expired again");
    assert_eq!(stock(&db, &swept).await, (100, 0, 0));
    let open_lines: i64 = sqlx::query_scalar("SELECT count(*) FROM held_units WHERE deal_id = $1")
        .bind(&swept)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(open_lines, 0, "every reservation released");
    let held_units: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(units), 0)::bigint FROM user_deal_units WHERE deal_id = $1",
    )
    .bind(&swept)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(held_units, 0, "no buyer still counted as holding units");
    assert_eq!(stock(&db, &paid).await, (9, 0, 1));
    assert_invariants(&b, &db, &swept).await;
    assert_invariants(&b, &db, &paid).await;
    let exit = gateway_b.terminate(Duration::from_secs(30)).await;
    assert!(exit.is_some_and(|s| s.success()), "B exits 0: {exit:?}");
    db.close().await;
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}
