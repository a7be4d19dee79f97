//! The processes of one chaos run, all on loopback and all private to it: a PostgreSQL
//! cluster of its own (`initdb` in a temporary directory, so restarting it disturbs nothing
//! else), a Redis, the payment simulator and three gateways.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Secrets the gateways and the simulator share; explicit and long, as `serve` requires.
pub const JWT_SECRET: &str = "chaos-jwt-secret-0123456789abcdef0123456789";
pub const ADMIN_TOKEN: &str = "chaos-admin-token-0123456789abcdef012345678";
const PASS_SECRET: &str = "chaos-pass-secret-0123456789abcdef012345678";
const PSP_API_KEY: &str = "chaos-psp-api-key-0123456789abcdef012345678";
const PSP_WEBHOOK_SECRET: &str = "chaos-psp-webhook-secret-0123456789abcdef01";

/// How long a process gets to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A port nothing listens on right now.
pub fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// Runs a command to completion, failing with its output.
fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// PostgreSQL refuses to run as root: as root, its tools run as the `postgres` user.
fn postgres_command(program: &str) -> Command {
    if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--", program]);
        command
    } else {
        Command::new(program)
    }
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Sends `signal` (`KILL`, `TERM`, `STOP`, `CONT`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status();
}

/// Waits until `port` accepts TCP connections.
async fn wait_for_port(port: u16) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            return Err(format!("nothing listens on port {port}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A private PostgreSQL cluster.
pub struct Postgres {
    dir: PathBuf,
    pub port: u16,
}

impl Postgres {
    pub async fn start(dir: &Path) -> Result<Self, String> {
        let dir = dir.join("pg");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        if running_as_root() {
            run(Command::new("chown").args(["-R", "postgres"]).arg(&dir))?;
        }
        run(postgres_command("initdb")
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-U", "postgres", "--auth=trust", "-N"]))?;
        let postgres = Self {
            dir,
            port: free_port()?,
        };
        postgres.up()?;
        wait_for_port(postgres.port).await?;
        Ok(postgres)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn up(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        run(postgres_command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "-o", &options, "start"]))
    }

    /// `immediate` is a crash: no checkpoint, clients cut off mid-transaction.
    pub fn down(&self, immediate: bool) -> Result<(), String> {
        let mode = if immediate { "immediate" } else { "fast" };
        run(postgres_command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-m", mode, "stop"]))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.down(true);
    }
}

/// A child process killed when dropped.
pub struct Process {
    child: Option<Child>,
}

impl Process {
    fn spawn(command: &mut Command) -> Result<Self, String> {
        Self::spawn_logging(command, Stdio::null())
    }

    fn spawn_logging(command: &mut Command, stderr: Stdio) -> Result<Self, String> {
        let child = command
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("{command:?}: {e}"))?;
        Ok(Self { child: Some(child) })
    }

    /// Whether the process has exited (or was never there).
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|child| !matches!(child.try_wait(), Ok(None)))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `timeout` for the exit; true when it exited successfully.
    pub async fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        signal(child.id(), "TERM");
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private Redis without persistence.
pub struct Redis {
    pub port: u16,
    pub process: Process,
}

impl Redis {
    pub async fn start() -> Result<Self, String> {
        let port = free_port()?;
        let process = Self::spawn(port)?;
        wait_for_port(port).await?;
        Ok(Self { port, process })
    }

    fn spawn(port: u16) -> Result<Process, String> {
        Process::spawn(
            Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null()),
        )
    }

    /// A fresh, empty Redis on the same port.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.process.kill();
        self.process = Self::spawn(self.port)?;
        wait_for_port(self.port).await
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// The payment simulator; its address is the first line it prints.
pub struct PspSim {
    pub base: String,
    /// Held so the simulator dies with the run.
    _process: Process,
}

impl PspSim {
    /// Starts `binary` (`flashgate-psp-sim`) on a free port.
    pub async fn start(binary: &Path) -> Result<Self, String> {
        let port = free_port()?;
        let process = Process::spawn(
            Command::new(binary)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args([
                    "--api-key",
                    PSP_API_KEY,
                    "--webhook-secret",
                    PSP_WEBHOOK_SECRET,
                ])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null()),
        )?;
        wait_for_port(port).await?;
        Ok(Self {
            base: format!("http://127.0.0.1:{port}"),
            _process: process,
        })
    }
}

/// One gateway process and its two ports.
pub struct Gateway {
    pub port: u16,
    pub ops_port: u16,
    pub process: Option<Process>,
}

impl Gateway {
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn ops(&self) -> String {
        format!("http://127.0.0.1:{}", self.ops_port)
    }
}

/// Where the gateways find their stores and their provider.
pub struct Wiring {
    pub flashgate: PathBuf,
    /// Where each gateway's log goes (`gateway-<port>.log`), shown when one fails to start.
    pub logs: PathBuf,
    pub database_url: String,
    pub redis_url: String,
    pub psp_base: String,
}

impl Wiring {
    /// Starts (or restarts) `gateway` and waits until it listens.
    pub async fn start(&self, gateway: &mut Gateway) -> Result<(), String> {
        let port = gateway.port.to_string();
        let ops = gateway.ops_port.to_string();
        let mut command = Command::new(&self.flashgate);
        command
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "error")
            .env("DATABASE_URL", &self.database_url)
            .env("REDIS_URL", &self.redis_url)
            .env("FLASHGATE_LISTEN", format!("127.0.0.1:{port}"))
            .env("FLASHGATE_OPS_LISTEN", format!("127.0.0.1:{ops}"))
            .env("FLASHGATE_JWT_SECRET", JWT_SECRET)
            .env("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .stdout(Stdio::null());
        let settings = [
            ("WAITING_ROOM__PASS_SECRET", PASS_SECRET),
            ("PAYMENTS__ENABLED", "true"),
            ("PAYMENTS__BASE_URL", &self.psp_base),
            ("PAYMENTS__API_KEY", PSP_API_KEY),
            ("PAYMENTS__WEBHOOK_SECRET", PSP_WEBHOOK_SECRET),
            ("PAYMENTS__OUTBOX_INTERVAL_MS", "100"),
            ("PAYMENTS__RECONCILE_INTERVAL_MS", "1000"),
            ("PAYMENTS__RECONCILE_AFTER_SECONDS", "2"),
            ("PAYMENTS__RETRY_BACKOFF_MS", "50"),
            ("PAYMENTS__CHECK_BACKOFF_MAX_SECONDS", "5"),
            ("SERVER__DRAIN_DELAY_MS", "300"),
            ("SERVER__SHUTDOWN_GRACE_SECONDS", "5"),
            ("SWEEPER__INTERVAL_MS", "200"),
            ("DATABASE__REQUEST_POOL_MAX", "6"),
            ("DATABASE__BACKGROUND_POOL_MAX", "2"),
            ("DATABASE__ACQUIRE_TIMEOUT_MS", "1000"),
            ("EVENTS__ALLOW_PRIVATE_TARGETS", "true"),
            ("EVENTS__LEADER_RETRY_MS", "500"),
            ("EVENTS__RETRY_MAX_MS", "2000"),
            ("EVENTS__REQUEST_TIMEOUT_MS", "2000"),
        ];
        for (key, value) in settings {
            command.env(format!("FLASHGATE__{key}"), value);
        }
        for scope in ["PER_IP", "PER_USER", "PER_DEAL"] {
            command
                .env(
                    format!("FLASHGATE__LIMITS__{scope}__RATE_PER_SECOND"),
                    "100000",
                )
                .env(format!("FLASHGATE__LIMITS__{scope}__BURST"), "100000");
        }
        let log_path = self.logs.join(format!("gateway-{port}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let process = gateway
            .process
            .insert(Process::spawn_logging(&mut command, log.into())?);
        let deadline = Instant::now() + START_TIMEOUT;
        while tokio::net::TcpStream::connect(("127.0.0.1", gateway.port))
            .await
            .is_err()
        {
            if process.exited() || Instant::now() > deadline {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                return Err(format!(
                    "gateway on port {port} did not start; its log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}
