//! Adaptive admission against the real gateway, Redis and payment simulator: the outflow is
//! cut when the admitted buyers' orders slow down (the provider made slow) and climbs back
//! when they recover; unreadable health gives the floor; a new lease holder resumes from
//! the outflow published last; an operator takes manual control in one call.
//!
//! The loop's tuning is quickened (reports every 100 ms, a full climb within a second or
//! two) so each test takes seconds; the rules themselves are tested exhaustively in
//! `waiting_room::controller`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use flashgate::config::Settings;
use serde_json::{Value, json};

use crate::helpers::{
    Api, PayApp, TestApp, new_deal, redis_connection, spawn_app_with, spawn_pay_app_with,
    spawn_sibling, wait_until,
};
use crate::waiting_room::{join, order_with_pass, poll, room_deal};

/// Longest any outcome below is waited for.
const OUTCOME_MAX: Duration = Duration::from_secs(20);

fn quick_loop(s: &mut Settings) {
    s.waiting_room.stock_refresh_ms = 100;
    s.waiting_room.lease_ttl_ms = 1000;
    s.waiting_room.health_report_ms = 100;
    s.waiting_room.health_stale_ms = 500;
    s.waiting_room.adaptive_climb_percent_per_second = 60;
    s.waiting_room.adaptive_cut_cooldown_ms = 500;
}

fn adaptive_room(min: i64, max: i64, target_ms: i64) -> Value {
    json!({"enabled": true, "admit_per_second": max, "max_active": 1000,
           "pass_ttl_seconds": 60,
           "admission": {"mode": "adaptive", "min_per_second": min,
                         "max_per_second": max, "target_p99_ms": target_ms}})
}

/// The deal's `waiting_room` as `GET /admin/deals/{id}` shows it.
async fn admin_room(api: &Api, deal: &str) -> Value {
    let url = api.url(&format!("/admin/deals/{deal}"));
    let request = api.client.get(url).bearer_auth(&api.admin_token);
    crate::helpers::send(request).await.expect(200)["waiting_room"].clone()
}

async fn outflow(api: &Api, deal: &str) -> f64 {
    admin_room(api, deal).await["outflow_per_second"]
        .as_f64()
        .expect("outflow_per_second is a number")
}

/// Waits until the line's outflow satisfies `holds`; returns it.
async fn outflow_until(api: &Api, deal: &str, what: &str, holds: impl Fn(f64) -> bool) -> f64 {
    wait_until(what, OUTCOME_MAX, || async {
        let rate = outflow(api, deal).await;
        if holds(rate) { Ok(rate) } else { Err(rate) }
    })
    .await
}

/// Buyers, one after another on each of `lanes` tasks: join, poll until admitted, order
/// with the pass. Runs until `stop`; answers the 201s once every lane has finished.
fn buyers(
    api: &Api,
    deal: &str,
    lanes: usize,
    stop: Arc<AtomicBool>,
) -> impl Future<Output = usize> + use<> {
    let placed = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..lanes {
        let (api, deal) = (api.clone(), deal.to_owned());
        let (stop, placed, next) = (stop.clone(), placed.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let user = format!("buyer-{}", next.fetch_add(1, Ordering::Relaxed));
                if buy(&api, &deal, &user, &stop).await {
                    placed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    async move {
        for task in tasks {
            task.await.expect("a buyer lane");
        }
        placed.load(Ordering::Relaxed)
    }
}

async fn buy(api: &Api, deal: &str, user: &str, stop: &AtomicBool) -> bool {
    let joined = join(api, user, deal).await;
    let Some(ticket) = joined.json()["ticket"].as_str().map(str::to_owned) else {
        return false;
    };
    while !stop.load(Ordering::Relaxed) {
        let polled = poll(api, user, deal, &ticket).await.json();
        if let Some(pass) = polled["pass"].as_str() {
            return order_with_pass(api, user, deal, Some(pass)).await.status == 201;
        }
        crate::helpers::pace(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_provider_cuts_the_outflow_and_its_recovery_lets_it_climb_back() {
    // Arrange: an adaptive line whose buyers order as soon as they are admitted; every
    // order opens a checkout at the simulator, so its latency is the buyers' latency.
    let app: PayApp = spawn_pay_app_with(quick_loop).await;
    let deal = app
        .given_deal(&room_deal(
            "adapt",
            100_000,
            // A target far above what a busy test machine adds to an order, so that only
            // the provider's delay below cuts the outflow.
            adaptive_room(2, 20, 1000),
            json!({}),
        ))
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let placed = buyers(&app, &deal, 12, stop.clone());
    outflow_until(&app, &deal, "the outflow near its maximum", |r| r >= 16.0).await;

    // Act 1: the provider answers 1.5 s late (within its 2 s request timeout).
    app.sim.faults(json!({"api_delay_ms": 1500})).await;

    // Assert 1: the loop sees the slow orders, and the outflow is cut to at most half its
    // maximum.
    wait_until(
        "the loop to see a p99 past the target",
        OUTCOME_MAX,
        || async { metric(&app, "flashgate_waiting_room_health_p99_seconds", &deal).await > 1.0 },
    )
    .await;
    outflow_until(&app, &deal, "the outflow cut", |r| r <= 10.0).await;

    // Act 2: the provider is quick again.
    app.sim.reset_faults().await;

    // Assert 2: back within a fifth of the maximum, and no unit sold twice.
    outflow_until(&app, &deal, "the outflow back up", |r| r >= 16.0).await;
    stop.store(true, Ordering::Relaxed);
    assert!(placed.await > 0, "buyers ordered");
    app.assert_invariants(&deal).await;
    app.cleanup().await;
}

async fn metric(api: &Api, name: &str, deal: &str) -> f64 {
    crate::helpers::metric_value(&api.metrics().await, name, &format!("deal=\"{deal}\""))
}

/// Writes a health report into the line's hash as an instance would, stamped with Redis's
/// clock, every 100 ms until `stop`.
fn report_slow(app: &TestApp, deal: &str, p99_ms: f64, stop: Arc<AtomicBool>) {
    let key = format!("{}wr:{{{deal}}}:health", app.settings.redis.key_prefix);
    let url = app.settings.redis.url.clone();
    tokio::spawn(async move {
        let mut redis = redis_connection(&url).await.expect("redis");
        while !stop.load(Ordering::Relaxed) {
            let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut redis).await.unwrap();
            let now_ms = s * 1000 + us / 1000;
            let report = format!("{now_ms},{p99_ms},10,0,0");
            let _: () = redis::cmd("HSET")
                .arg(&key)
                .arg("elsewhere")
                .arg(report)
                .query_async(&mut redis)
                .await
                .unwrap();
            crate::helpers::pace(Duration::from_millis(100)).await;
        }
    });
}

/// A line kept busy (one pass outstanding, the only one allowed, and someone waiting behind
/// it), so the advancer steps it every interval.
async fn busy_adaptive_line(app: &Api, id: &str, min: i64, max: i64) -> String {
    let mut room = adaptive_room(min, max, 200);
    room["max_active"] = json!(1);
    let deal = app.given_deal(&room_deal(id, 1000, room, json!({}))).await;
    join(app, "holder", &deal).await.expect(201);
    join(app, "waiter", &deal).await.expect(201);
    deal
}

#[tokio::test(flavor = "multi_thread")]
async fn unreadable_health_gives_the_floor_and_a_new_holder_resumes_from_the_published_outflow() {
    // Arrange: a busy adaptive line at its maximum; a cut holds for 30 s.
    let slow_cooldown = |s: &mut Settings| {
        quick_loop(s);
        s.waiting_room.adaptive_cut_cooldown_ms = 30_000;
    };
    let mut first = spawn_app_with(slow_cooldown).await;
    let deal = busy_adaptive_line(&first, "adaptf", 3, 40).await;
    outflow_until(&first, &deal, "the outflow at its maximum", |r| r == 40.0).await;

    // Act 1: the line's health key cannot be read (wrong type: every read fails).
    let key = format!("{}wr:{{{deal}}}:health", first.settings.redis.key_prefix);
    let mut redis = redis_connection(&first.settings.redis.url).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("x")
        .query_async(&mut redis)
        .await
        .unwrap();

    // Assert 1: the floor, never more; readable again, it climbs back.
    outflow_until(&first, &deal, "the outflow at its floor", |r| r == 3.0).await;
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    outflow_until(&first, &deal, "the outflow back at its maximum", |r| {
        r == 40.0
    })
    .await;

    // Act 2: another instance reports a p99 one and a half times the target (within a halving,
    // so the cut halves): one cut, to 20, held.
    let stop = Arc::new(AtomicBool::new(false));
    report_slow(&first, &deal, 300.0, stop.clone());
    outflow_until(&first, &deal, "the outflow cut once", |r| r == 20.0).await;
    // The holder goes; a second gateway on the same database and Redis takes the lease.
    first.stop().await.expect("the first gateway stops");
    let second = spawn_sibling(&first.settings).await;

    // Assert 2: the new holder resumed from 20 and cut it once more: a halving to 10, or
    // deeper (to 20 × target / p99) when the stopped holder's last report, still fresh, was
    // slower on a busy machine; not the floor, and not a climb.
    let resumed = outflow_until(&second, &deal, "the new holder's decision", |r| r != 20.0).await;
    assert!(
        (5.0..=10.0).contains(&resumed),
        "resumed from the published outflow: {resumed}"
    );
    stop.store(true, Ordering::Relaxed);
    second.stop().await;
    first.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_takes_manual_control_at_the_current_outflow_in_one_call() {
    // Arrange: a busy adaptive line cut to 20 by a slow report, then held.
    let app = spawn_app_with(|s| {
        quick_loop(s);
        s.waiting_room.adaptive_cut_cooldown_ms = 30_000;
    })
    .await;
    let deal = busy_adaptive_line(&app, "adaptm", 2, 40).await;
    let created = admin_room(&app, &deal).await;
    assert_eq!(created["mode"], "adaptive");
    assert_eq!(created["admission"]["target_p99_ms"], 200);
    outflow_until(&app, &deal, "the outflow at its maximum", |r| r == 40.0).await;
    let stop = Arc::new(AtomicBool::new(false));
    report_slow(&app, &deal, 300.0, stop.clone());
    outflow_until(&app, &deal, "the outflow cut", |r| r == 20.0).await;

    // Act: fixed at the current rate.
    let url = app.url(&format!("/admin/deals/{deal}/admission"));
    let switched = crate::helpers::send(
        app.client
            .post(&url)
            .bearer_auth(&app.admin_token)
            .json(&json!({"mode": "fixed"})),
    )
    .await
    .expect(200);

    // Assert: fixed at 20, whatever the health says now; the line's public view agrees.
    assert_eq!(switched["waiting_room"]["mode"], "fixed");
    assert_eq!(switched["waiting_room"]["admit_per_second"], 20);
    stop.store(true, Ordering::Relaxed);
    let line = crate::waiting_room::line(&app, &deal).await;
    assert_eq!(line["mode"], "fixed");
    assert_eq!(outflow(&app, &deal).await, 20.0);
    let bad = app
        .client
        .post(&url)
        .bearer_auth(&app.admin_token)
        .json(&json!({"mode": "sideways"}));
    crate::helpers::send(bad)
        .await
        .expect_problem(400, "invalid-request");
    // A deal without a waiting room has no outflow to control; an unknown deal is 404.
    let plain = app.given_deal(&new_deal("adaptplain", 10, 1)).await;
    for (deal, status) in [(plain.as_str(), 409), ("adaptnone", 404)] {
        let url = app.url(&format!("/admin/deals/{deal}/admission"));
        let reply = app
            .client
            .post(&url)
            .bearer_auth(&app.admin_token)
            .json(&json!({"mode": "fixed"}));
        crate::helpers::send(reply).await.expect_problem(
            status,
            if status == 409 {
                "invalid-request"
            } else {
                "not-found"
            },
        );
    }
    app.cleanup().await;
}
