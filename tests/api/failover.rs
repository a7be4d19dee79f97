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
    Api, ChildGuard, assert_invariants, delete_redis_keys, free_port, new_deal, poll_every,
    test_settings, unique_suffix, wait_until,
};
use crate::multi_process::{spawn_gateway_with, wait_until_healthy};

/// How long a buyer waits before asking again after an error (on the next gateway).
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// Units per sale phase.
const STOCK: usize = 120;
/// Buyers ordering at once, spread over the gateways.
const IN_FLIGHT: usize = 12;
/// Each worker waits this long between buyers, so a phase lasts long enough (about 25 s)
/// to take the disruption in its middle.
const PACE: Duration = Duration::from_millis(2500);
/// A phase that has not sold out by then has failed.
const PHASE_MAX: Duration = Duration::from_secs(60);

const SCALE_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/scale.sh");

/// The name of the node accepting writes now, if any.
fn primary_name(dir: &str) -> Option<String> {
    let output = Command::new("bash")
        .arg(SCALE_SCRIPT)
        .args(["pg-failover", "primary", dir])
        .output()
        .expect("run scripts/scale.sh");
    let out = String::from_utf8_lossy(&output.stdout);
    let name = out.split_whitespace().next()?;
    output.status.success().then(|| name.to_owned())
}

fn scale_script(args: &[&str]) -> String {
    let output = Command::new("bash")
        .arg(SCALE_SCRIPT)
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

    /// Waits until the primary has a synchronous standby again.
    fn wait_sync(&self) {
        scale_script(&["pg-failover", "wait-sync", &self.dir()]);
    }

    /// Kills the primary's machine; returns when it is dead.
    fn kill_primary(&self) -> impl FnOnce() -> Instant + Send + 'static {
        let dir = self.dir();
        move || {
            scale_script(&["pg-failover", "kill-primary", &dir]);
            Instant::now()
        }
    }

    /// Starts a planned switchover; returns once the other node accepts writes, then waits
    /// for the switchover command to finish.
    fn switchover(&self) -> impl FnOnce() -> Instant + Send + 'static {
        let dir = self.dir();
        move || {
            let old = primary_name(&dir).expect("a primary before the switchover");
            let mut command = Command::new("bash")
                .arg(SCALE_SCRIPT)
                .args(["pg-failover", "switchover", &dir])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("start the switchover");
            let promoted = wait_until(
                "the switchover to promote the other node",
                PHASE_MAX,
                || {
                    if let Ok(Some(status)) = command.try_wait() {
                        assert!(status.success(), "the switchover failed");
                    }
                    std::future::ready(primary_name(&dir).is_some_and(|name| name != old))
                },
            );
            tokio::runtime::Handle::current().block_on(promoted);
            let done = Instant::now();
            let finished = command.wait().expect("wait for the switchover");
            assert!(finished.success(), "the switchover failed");
            done
        }
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
            .arg(SCALE_SCRIPT)
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
    // Users (and so idempotency keys) of one phase are not reused by the next.
    let user = format!("{deal}-buyer-{n}");
    let token = apis[0].token(&user);
    let (user, token) = (&user, &token);
    let first_sent = Instant::now();
    let mut attempt = 0;
    let limit = deadline.saturating_duration_since(first_sent);
    let answered = poll_every(RETRY_EVERY, limit, || {
        let api = &apis[(n + attempt) % apis.len()];
        attempt += 1;
        async move {
            let reply = api.place_order(token, deal, user, 1).await;
            match reply.status {
                200 | 201 => {
                    let order_id = reply.json()["order_id"].as_str().unwrap().to_owned();
                    let acked = Instant::now();
                    Ok(Some(Ack {
                        order_id,
                        first_sent,
                        acked,
                    }))
                }
                409 => {
                    assert_eq!(
                        reply.problem_slug().as_deref(),
                        Some("sold-out"),
                        "{}",
                        reply.text
                    );
                    Ok(None)
                }
                400..=499 => panic!("{user}: unexpected {} {}", reply.status, reply.text),
                status => Err(format!("{status} {}", reply.text)),
            }
        }
    })
    .await;
    answered.unwrap_or_else(|seen| panic!("{user} got no answer before the deadline: {seen}"))
}

/// When a disruption started and when the old primary was certainly out (killed, or the
/// other node seen accepting writes): a buyer who first asks after `done` can only reach
/// the new primary.
#[derive(Clone, Copy)]
struct Disruption {
    started: Instant,
    done: Instant,
}

/// Sells `deal` out through `apis`, running `disrupt` (which returns when the old primary
/// was out) once `STOCK / 3` orders are in; returns the acknowledged orders and when
/// `disrupt` ran.
async fn sale(
    apis: &[Api],
    deal: &str,
    disrupt: impl FnOnce() -> Instant + Send + 'static,
) -> (Vec<Ack>, Disruption) {
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
                // The buyers' pace: load spread over the disruption, not a wait.
                crate::helpers::pace(PACE).await;
            }
            acks
        });
    }
    let limit = deadline.saturating_duration_since(Instant::now());
    wait_until("the sale to get going", limit, || async {
        acked.load(Ordering::Relaxed) >= STOCK / 3
    })
    .await;
    let started = Instant::now();
    let disruption = tokio::task::spawn_blocking(disrupt);
    let acks: Vec<Ack> = workers.join_all().await.into_iter().flatten().collect();
    let done = disruption.await.expect("the disruption ran");
    (acks, Disruption { started, done })
}

/// What a disruption cost: from its start to the first order on the new primary (of a buyer
/// who first asked once the disruption's command had returned), and the longest pause
/// between two acknowledgements.
struct Figures {
    first_new_order: Duration,
    longest_pause: Duration,
}

impl Figures {
    /// One line in the test output, the source of the figures in docs/SCALING.md.
    fn report(&self, disruption: &str, acknowledged: usize) {
        eprintln!(
            "failover figures: {disruption}: {acknowledged} orders acknowledged, first order \
             on the new primary {} ms after it began, longest pause between \
             acknowledgements {} ms",
            self.first_new_order.as_millis(),
            self.longest_pause.as_millis()
        );
    }
}

/// Every acknowledged order is on the primary, the stock sold exactly once, the books
/// balance.
async fn check_phase(
    api: &Api,
    primary: &PgPool,
    deal: &str,
    acks: &[Ack],
    disruption: Disruption,
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
        .filter(|ack| ack.first_sent >= disruption.done)
        .map(|ack| ack.acked - disruption.started)
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
        let api = Api::on_free_ports(&settings);
        gateways.push(spawn_gateway_with(&settings, &api, &extra));
        apis.push(api);
    }
    for (gateway, api) in gateways.iter_mut().zip(&apis) {
        wait_until_healthy(gateway, api).await;
    }

    // Act and assert: a planned switchover mid-sale.
    formation.wait_sync();
    let deal = apis[0]
        .given_deal(&new_deal("switchover", STOCK as i64, 4))
        .await;
    let (acks, switched) = sale(&apis, &deal, formation.switchover()).await;
    let primary = formation.primary().await;
    let figures = check_phase(&apis[0], &primary, &deal, &acks, switched).await;
    figures.report("switchover", acks.len());
    primary.close().await;

    // Act and assert: the primary's machine killed mid-sale, once the old primary is back
    // as a synchronous standby.
    formation.wait_sync();
    let deal = apis[0]
        .given_deal(&new_deal("killed", STOCK as i64, 4))
        .await;
    let (acks, killed) = sale(&apis, &deal, formation.kill_primary()).await;
    let primary = formation.primary().await;
    let figures = check_phase(&apis[0], &primary, &deal, &acks, killed).await;
    figures.report("killed primary", acks.len());

    primary.close().await;
    for gateway in &mut gateways {
        gateway.kill();
    }
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
}
