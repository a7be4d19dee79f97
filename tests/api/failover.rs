//! A sale through three gateways on a pg_auto_failover formation (a monitor, a primary and
//! a synchronous standby on loopback ports, started by `scripts/scale.sh`): a planned
//! switchover and then the primary killed mid-sale. No acknowledged order is lost, nothing
//! is oversold, the books balance, and the sale goes on on the new primary.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::helpers::{
    Api, ChildGuard, assert_invariants, delete_redis_keys, free_port, new_deal, test_settings,
    unique_suffix,
};
use crate::multi_process::{spawn_gateway_with, wait_until_healthy};

/// Units per sale phase.
const STOCK: usize = 120;
/// Buyers ordering at once, spread over the gateways.
const IN_FLIGHT: usize = 12;
/// Each worker waits this long between buyers, so a phase lasts long enough (about 15 s)
/// to take the disruption in its middle.
const PACE: Duration = Duration::from_millis(1500);
/// A phase that has not sold out by then has failed.
const PHASE_MAX: Duration = Duration::from_secs(60);

fn scale_script(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/scale.sh");
    let output = Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .expect("run scripts/scale.sh");
    assert!(
        output.status.success(),
        "scripts/scale.sh {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The formation; stopped (every process killed) and removed on drop.
struct Formation {
    dir: PathBuf,
    ports: [u16; 2],
}

impl Formation {
    fn start() -> Formation {
        let dir = std::env::temp_dir().join(format!("flashgate-failover-{}", unique_suffix()));
        let ports = [free_port(), free_port(), free_port()];
        let formation = Formation {
            dir: dir.clone(),
            ports: [ports[1], ports[2]],
        };
        let port = |i: usize| ports[i].to_string();
        let dir = dir.to_string_lossy().into_owned();
        scale_script(&["pg-failover", "start", &dir, &port(0), &port(1), &port(2)]);
        formation
    }

    fn dir(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    /// `postgres://` URL listing both nodes, as the gateways get it.
    fn url(&self) -> String {
        let [a, b] = self.ports;
        format!("postgres://postgres@127.0.0.1:{a},127.0.0.1:{b}/test")
    }

    /// A pool on the node that is primary now.
    async fn primary(&self) -> PgPool {
        let out = scale_script(&["pg-failover", "primary", &self.dir()]);
        let port = out.split_whitespace().nth(1).expect("name and port");
        PgPoolOptions::new()
            .max_connections(2)
            .connect(&format!("postgres://postgres@127.0.0.1:{port}/test"))
            .await
            .expect("connect to the primary")
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        let dir = self.dir();
        let _ = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/scale.sh"))
            .args(["stop", &dir])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An order the gateway acknowledged (201, or the replay of one).
struct Ack {
    order_id: String,
    first_sent: Instant,
    acked: Instant,
}

/// One buyer: orders one unit with one idempotency key, retrying (on any gateway) through
/// errors until acknowledged or refused as sold out. None when refused.
async fn buy(apis: &[Api], n: usize, deal: &str, deadline: Instant) -> Option<Ack> {
    let user = format!("buyer-{n}");
    let token = apis[0].token(&user);
    let first_sent = Instant::now();
    for attempt in 0.. {
        assert!(
            Instant::now() < deadline,
            "{user} got no answer before the deadline"
        );
        let api = &apis[(n + attempt) % apis.len()];
        let reply = api.place_order(&token, deal, &user, 1).await;
        match reply.status {
            200 | 201 => {
                let order_id = reply.json()["order_id"].as_str().unwrap().to_owned();
                let acked = Instant::now();
                return Some(Ack {
                    order_id,
                    first_sent,
                    acked,
                });
            }
            409 => {
                assert_eq!(
                    reply.problem_slug().as_deref(),
                    Some("sold-out"),
                    "{}",
                    reply.text
                );
                return None;
            }
            400..=499 => panic!("{user}: unexpected {} {}", reply.status, reply.text),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    unreachable!()
}

/// Sells `deal` out through `apis`, running `disrupt` once `STOCK / 3` orders are in;
/// returns the acknowledged orders and when `disrupt` started.
async fn sale(
    apis: &[Api],
    deal: &str,
    disrupt: impl FnOnce() + Send + 'static,
) -> (Vec<Ack>, Instant) {
    let deadline = Instant::now() + PHASE_MAX;
    let next = Arc::new(AtomicUsize::new(0));
    let acked = Arc::new(AtomicUsize::new(0));
    let sold_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (apis, deal) = (apis.to_vec(), deal.to_owned());
        let (next, acked, sold_out) = (next.clone(), acked.clone(), sold_out.clone());
        workers.spawn(async move {
            let mut acks = Vec::new();
            while !sold_out.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                match buy(&apis, n, &deal, deadline).await {
                    Some(ack) => {
                        acked.fetch_add(1, Ordering::Relaxed);
                        acks.push(ack);
                    }
                    None => sold_out.store(true, Ordering::Relaxed),
                }
                tokio::time::sleep(PACE).await;
            }
            acks
        });
    }
    while acked.load(Ordering::Relaxed) < STOCK / 3 {
        assert!(Instant::now() < deadline, "the sale never got going");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let disrupted = Instant::now();
    let disruption = tokio::task::spawn_blocking(disrupt);
    let acks: Vec<Ack> = workers.join_all().await.into_iter().flatten().collect();
    disruption.await.expect("the disruption ran");
    (acks, disrupted)
}

/// What a disruption cost: from its start to the first order of a buyer who came after
/// it, and the longest pause between two acknowledgements.
#[derive(Debug)]
struct Figures {
    first_new_order: Duration,
    longest_pause: Duration,
}

/// Every acknowledged order is on the primary, the stock sold exactly once, the books
/// balance.
async fn check_phase(
    api: &Api,
    primary: &PgPool,
    deal: &str,
    acks: &[Ack],
    disrupted: Instant,
) -> Figures {
    let stored: Vec<String> = sqlx::query_scalar("SELECT id::text FROM orders WHERE deal_id = $1")
        .bind(deal)
        .fetch_all(primary)
        .await
        .unwrap();
    for ack in acks {
        assert!(
            stored.contains(&ack.order_id),
            "acknowledged order {} lost",
            ack.order_id
        );
    }
    assert_eq!(
        stored.len(),
        STOCK,
        "orders on the primary: oversold or undersold"
    );
    assert_eq!(acks.len(), STOCK, "acknowledged orders");
    assert_invariants(api, primary, deal).await;
    let first_new_order = acks
        .iter()
        .filter(|ack| ack.first_sent >= disrupted)
        .map(|ack| ack.acked - disrupted)
        .min()
        .expect("no order was placed after the disruption");
    let mut times: Vec<Instant> = acks.iter().map(|ack| ack.acked).collect();
    times.sort();
    let longest_pause = times
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .max()
        .unwrap_or_default();
    Figures {
        first_new_order,
        longest_pause,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sales_survive_a_switchover_and_a_killed_primary_losing_nothing() {
    // Arrange: the formation, and three gateways that know both nodes.
    let formation = Formation::start();
    let settings = test_settings(&formation.url());
    let extra = [
        ("FLASHGATE__DATABASE__PRIMARY_CHECK_INTERVAL_MS", "200"),
        ("FLASHGATE__DATABASE__ACQUIRE_TIMEOUT_MS", "1000"),
    ];
    let mut gateways: Vec<ChildGuard> = Vec::new();
    let mut apis = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        gateways.push(spawn_gateway_with(&settings, port, &extra));
        apis.push(Api::new(&format!("http://127.0.0.1:{port}"), &settings));
    }
    for (gateway, api) in gateways.iter_mut().zip(&apis) {
        wait_until_healthy(gateway, api).await;
    }

    // Act and assert: a planned switchover mid-sale.
    let deal = apis[0]
        .given_deal(&new_deal("switchover", STOCK as i64, 4))
        .await;
    let dir = formation.dir();
    let (acks, switched) = sale(&apis, &deal, move || {
        scale_script(&["pg-failover", "switchover", &dir]);
    })
    .await;
    let primary = formation.primary().await;
    let figures = check_phase(&apis[0], &primary, &deal, &acks, switched).await;
    eprintln!(
        "switchover: {} orders acknowledged, {figures:?}",
        acks.len()
    );
    primary.close().await;

    // Act and assert: the primary's machine killed mid-sale.
    let deal = apis[0]
        .given_deal(&new_deal("killed", STOCK as i64, 4))
        .await;
    let dir = formation.dir();
    let (acks, killed) = sale(&apis, &deal, move || {
        scale_script(&["pg-failover", "kill-primary", &dir]);
    })
    .await;
    let primary = formation.primary().await;
    let figures = check_phase(&apis[0], &primary, &deal, &acks, killed).await;
    eprintln!(
        "killed primary: {} orders acknowledged, {figures:?}",
        acks.len()
    );

    primary.close().await;
    for gateway in &mut gateways {
        gateway.kill();
    }
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
}
