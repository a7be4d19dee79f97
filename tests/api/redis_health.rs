//! Redis health is what commands meet, not whether a connection object exists: a cluster
//! whose surviving nodes report `cluster_state:fail`, and a frozen server, both read down on
//! `/readyz` and `flashgate_redis_up` within a second, and up again once they serve. Losing
//! a node is a few log lines, not one per reconnect attempt of the Redis client.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{
    Api, ChildGuard, EVENTUALLY, LogFile, TestApp, TestDb, eventually, free_port, new_deal,
    redis_connection, redis_reported_down, redis_reported_up, spawn_app_with, test_log,
    test_settings, unique_suffix, wait_for_port,
};
use crate::multi_process::{spawn_gateway_logging_to, wait_until_healthy};
use crate::redis_outage::start_redis;

/// How long after Redis failed the gateway may still call it up.
const WITHIN: Duration = Duration::from_secs(1);

/// A private Redis Cluster of primaries without replicas, so that losing one fails it.
pub struct RedisCluster {
    dir: PathBuf,
    pub ports: Vec<u16>,
    nodes: Vec<ChildGuard>,
}

impl RedisCluster {
    /// Starts `primaries` nodes (a node unheard of for 1 s is failed) and joins them.
    pub async fn start(primaries: usize) -> RedisCluster {
        let dir = std::env::temp_dir().join(format!("fgtest-cluster-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = (0..primaries).map(|_| free_port()).collect();
        let nodes = ports.iter().map(|&port| start_node(&dir, port)).collect();
        let cluster = RedisCluster { dir, ports, nodes };
        for &port in &cluster.ports {
            assert!(wait_for_port(port, Duration::from_secs(10)).await);
        }
        cluster.create();
        for &port in &cluster.ports {
            let ok = eventually(Duration::from_secs(20), || async move {
                (cluster_state(port).await.as_deref() == Some("ok")).then_some(())
            });
            assert!(ok.await.is_some(), "the cluster never reached state ok");
        }
        cluster
    }

    fn create(&self) {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli (is it on PATH?)");
        assert!(
            output.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    }

    /// The seed list as `redis.url` takes it.
    pub fn url(&self) -> String {
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect();
        urls.join(",")
    }

    /// Kills node `index` at once.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].kill();
    }

    /// Waits until node `index` reports `cluster_state:fail`.
    pub async fn wait_failed(&self, index: usize) {
        let port = self.ports[index];
        let failed = eventually(Duration::from_secs(20), || async move {
            (cluster_state(port).await.as_deref() == Some("fail")).then_some(())
        });
        assert!(
            failed.await.is_some(),
            "node {port} never reported the cluster failed"
        );
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_node(dir: &std::path::Path, port: u16) -> ChildGuard {
    let output = || {
        if test_log() {
            Stdio::inherit()
        } else {
            Stdio::null()
        }
    };
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
        .arg("--cluster-config-file")
        .arg(dir.join(format!("nodes-{port}.conf")))
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(output())
        .stderr(output())
        .spawn()
        .expect("start redis-server (is it on PATH?)");
    ChildGuard { child }
}

/// `cluster_state` as the node on `port` reports it.
async fn cluster_state(port: u16) -> Option<String> {
    let url = format!("redis://127.0.0.1:{port}");
    let connect = redis_connection(&url);
    let mut node = tokio::time::timeout(Duration::from_secs(1), connect)
        .await
        .ok()?
        .ok()?;
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut node)
        .await
        .ok()?;
    let state = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("cluster_state:"));
    state.map(str::to_owned)
}

/// `flashgate_redis_up` on the gateway's `/metrics`.
async fn redis_up_metric(app: &TestApp) -> Option<f64> {
    let metrics = app.metrics().await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("flashgate_redis_up "))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `/readyz` (still 200: Redis is optional) and the gauge both say `up`.
async fn reported(app: &TestApp, up: bool) -> bool {
    let reply = app.get("/readyz").await;
    assert_eq!(reply.status, 200, "readyz: {}", reply.text);
    let body = reply.json();
    let readyz = if up {
        redis_reported_up(&body)
    } else {
        redis_reported_down(&body)
    };
    readyz && redis_up_metric(app).await == Some(if up { 1.0 } else { 0.0 })
}

/// Waits up to `timeout` for both reports to say `up`; false if they never did.
async fn reported_within(app: &TestApp, up: bool, timeout: Duration) -> bool {
    eventually(
        timeout,
        || async move { reported(app, up).await.then_some(()) },
    )
    .await
    .is_some()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_redis_cluster_reads_down_within_a_second() {
    // Arrange: a gateway on a private cluster of three primaries, reported up.
    let mut cluster = RedisCluster::start(3).await;
    let app = spawn_app_with(|s| s.redis.url = cluster.url()).await;
    assert!(
        reported_within(&app, true, EVENTUALLY * 3).await,
        "never up"
    );

    // Act: one primary dies; the others declare the cluster failed.
    cluster.kill(2);
    cluster.wait_failed(0).await;

    // Assert
    let down = reported_within(&app, false, WITHIN).await;
    let readyz = app.get("/readyz").await.text;
    assert!(
        down,
        "a failed cluster still reported up: {readyz}, {:?}",
        redis_up_metric(&app).await
    );
    app.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_redis_reads_down_within_a_second_and_up_once_thawed() {
    // Arrange: a gateway on a private Redis, reported up.
    let (redis, port) = start_redis().await;
    let app = spawn_app_with(|s| s.redis.url = format!("redis://127.0.0.1:{port}")).await;
    assert!(reported_within(&app, true, EVENTUALLY).await, "never up");

    // Act: the server stops answering without closing its socket.
    let signal = |name: &str| {
        let sent = Command::new("kill")
            .args([name, &redis.pid().to_string()])
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "kill {name}");
    };
    signal("-STOP");

    // Assert: down within a second, up again once it answers.
    let down = reported_within(&app, false, WITHIN).await;
    signal("-CONT");
    assert!(
        down,
        "a frozen Redis still reported up: {}",
        app.get("/readyz").await.text
    );
    assert!(
        reported_within(&app, true, EVENTUALLY * 3).await,
        "never up again"
    );
    app.cleanup().await;
}

/// How long orders keep coming while a cluster node is dead.
const NODE_LOSS: Duration = Duration::from_secs(10);
/// Most log lines a gateway may write meanwhile: the outage said once, not per attempt.
const NODE_LOSS_LINES_MAX: usize = 5;

#[tokio::test(flavor = "multi_thread")]
async fn losing_a_cluster_node_is_a_few_log_lines_not_a_flood() {
    // Arrange: a gateway process on a private cluster, logging warnings to a file.
    let mut cluster = RedisCluster::start(3).await;
    let database = TestDb::create().await;
    let mut settings = test_settings(&database.url);
    settings.redis.url = cluster.url();
    let api = Api::on_free_ports(&settings);
    let log = LogFile::new("cluster-node-loss");
    let env = [("RUST_LOG", "warn")];
    let mut gateway = spawn_gateway_logging_to(&settings, &api, &env, log.stdio());
    wait_until_healthy(&mut gateway, &api).await;
    let mut deal = new_deal("node-loss", 100_000, 4);
    deal["per_user_limit"] = serde_json::json!(100_000);
    let deal = api.given_deal(&deal).await;
    let mark = log.mark();

    // Act: a primary dies while orders keep coming, each touching Redis.
    cluster.kill(2);
    let until = Instant::now() + NODE_LOSS;
    let mut sent = 0;
    while Instant::now() < until {
        let reply = api.order(&format!("buyer-{}", sent % 50), &deal, 1).await;
        assert!(reply.status < 500 || reply.status == 503, "{}", reply.text);
        sent += 1;
        // A steady stream of orders through the node's loss: load, not a wait.
        crate::helpers::pace(Duration::from_millis(20)).await;
    }

    // Assert
    let lines = log.lines_since(mark);
    eprintln!("logged while a node was lost:\n{}", lines.join("\n"));
    assert!(
        lines.len() <= NODE_LOSS_LINES_MAX,
        "{} log lines in {NODE_LOSS:?} ({sent} orders):\n{}",
        lines.len(),
        lines.join("\n")
    );
    gateway.kill();
    database.drop_database().await;
}
