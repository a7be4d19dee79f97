//! Whether Redis answers commands, as opposed to whether a connection object exists.
//!
//! A cluster connection stays "connected" while one of its primaries is dead or the
//! surviving nodes refuse every command with `CLUSTERDOWN`; a frozen server keeps its socket
//! open. So health is decided by a probe, every `redis.health_check_interval_ms`, together
//! with the outcomes of the commands run since the previous probe: `PING` on one server,
//! `CLUSTER INFO` on every primary of a cluster (each must say `cluster_state:ok`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{ErrorKind, RedisResult, ServerErrorKind, Value};

use super::RedisError;

/// The last verdict, and what commands met since the previous probe.
#[derive(Default)]
pub(super) struct Health {
    up: AtomicBool,
    answered: AtomicU64,
    failed: AtomicU64,
}

impl Health {
    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub(super) fn set(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }

    pub(super) fn answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `error` when it says something about Redis itself; an error Redis replied
    /// with because of the command (a script failing) does not.
    pub(super) fn failed(&self, error: &RedisError) {
        if shows_redis_unwell(error) {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// True when commands failed since the last call and none was answered: Redis is not
    /// serving, whatever a probe said a moment ago.
    pub(super) fn commands_failing(&self) -> bool {
        let answered = self.answered.swap(0, Ordering::Relaxed);
        let failed = self.failed.swap(0, Ordering::Relaxed);
        failed > 0 && answered == 0
    }
}

fn shows_redis_unwell(error: &RedisError) -> bool {
    match error {
        RedisError::Disconnected | RedisError::Timeout => true,
        RedisError::Command(error) => {
            error.is_io_error()
                || error.is_timeout()
                || error.is_connection_dropped()
                || matches!(
                    error.kind(),
                    ErrorKind::ClusterConnectionNotFound
                        | ErrorKind::Server(
                            ServerErrorKind::ClusterDown
                                | ServerErrorKind::MasterDown
                                | ServerErrorKind::BusyLoading
                                | ServerErrorKind::TryAgain
                        )
                )
        }
    }
}

/// `PING` on the server.
pub(super) async fn probe_server(connection: &mut MultiplexedConnection) -> RedisResult<()> {
    match connection.req_packed_command(&redis::cmd("PING")).await? {
        Value::ServerError(error) => Err(error.into()),
        _ => Ok(()),
    }
}

/// `CLUSTER INFO` on every primary; each must answer and report `cluster_state:ok`.
pub(super) async fn probe_cluster(connection: &mut ClusterConnection) -> RedisResult<()> {
    let every_primary = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let mut info = redis::cmd("CLUSTER");
    info.arg("INFO");
    let answers = connection.route_command(info, every_primary).await?;
    cluster_ok(answers)
}

/// Whether every node's `CLUSTER INFO` (a map from node address to answer) says ok.
fn cluster_ok(answers: Value) -> RedisResult<()> {
    let Value::Map(answers) = answers else {
        return Err((
            ErrorKind::UnexpectedReturnType,
            "CLUSTER INFO answered no map",
        )
            .into());
    };
    for (_, answer) in answers {
        let text = match answer {
            Value::ServerError(error) => return Err(error.into()),
            Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Value::VerbatimString { text, .. } => text,
            _ => String::new(),
        };
        if !text.lines().any(|line| line.trim() == "cluster_state:ok") {
            let down = ErrorKind::Server(ServerErrorKind::ClusterDown);
            return Err((down, "a primary reports cluster_state other than ok").into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: &str) -> Value {
        Value::BulkString(format!("cluster_enabled:1\r\ncluster_state:{state}\r\n").into_bytes())
    }

    fn node(n: u8) -> Value {
        Value::BulkString(format!("127.0.0.1:700{n}").into_bytes())
    }

    #[test]
    fn a_cluster_is_ok_only_when_every_primary_says_so() {
        assert!(
            cluster_ok(Value::Map(vec![
                (node(1), info("ok")),
                (node(2), info("ok"))
            ]))
            .is_ok()
        );
        let one_failed = Value::Map(vec![(node(1), info("ok")), (node(2), info("fail"))]);
        assert!(cluster_ok(one_failed).is_err());
        assert!(cluster_ok(Value::Nil).is_err());
    }

    #[test]
    fn only_failures_of_redis_itself_count() {
        let health = Health::default();
        let script_failed = (ErrorKind::Server(ServerErrorKind::ResponseError), "boom");
        health.failed(&RedisError::Command(script_failed.into()));
        assert!(!health.commands_failing(), "a script error is the script's");
        health.failed(&RedisError::Timeout);
        assert!(health.commands_failing());
        health.failed(&RedisError::Timeout);
        health.answered();
        assert!(!health.commands_failing(), "some commands were answered");
    }
}
