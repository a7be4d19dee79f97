//! Child processes (redis-server, flashgate serve) and the ports they listen on.

use std::time::Duration;

use super::{eventually, poll};

/// A port nothing listens on right now, for a child process to listen on.
///
/// Chosen below the kernel's ephemeral range, as `scripts/scale.sh free-port` does: a port
/// the kernel handed out (bind to port 0) may, before the child binds it, become the local
/// end of one of the busy test run's outgoing connections, and the child then fails to
/// start with "address in use".
pub fn free_port() -> u16 {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    assert!(
        ephemeral_low > 21_000,
        "ephemeral ports start too low ({ephemeral_low})"
    );
    loop {
        // The script's range: its cluster bus ports (port + 10000) lie above it.
        let port = rand::random_range(11_000..ephemeral_low - 10_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() && reserve(port) {
            return port;
        }
    }
}

/// How long a port stays reserved: longer than any test keeps a child listening on it.
const PORT_RESERVED_FOR: Duration = Duration::from_secs(15 * 60);

/// Claims `port` among the test processes running at once (nextest runs each test in its
/// own): a port free now is free for all of them until a child binds it, so two tests could
/// each hand it to a child. The first to create the port's marker file owns it.
fn reserve(port: u16) -> bool {
    let dir = std::env::temp_dir().join("flashgate-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let marker = dir.join(port.to_string());
    let stale = std::fs::metadata(&marker)
        .and_then(|meta| meta.modified())
        .is_ok_and(|at| at.elapsed().unwrap_or_default() > PORT_RESERVED_FOR);
    if stale {
        let _ = std::fs::remove_file(&marker);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker)
        .is_ok()
}

/// Waits until something accepts TCP connections on `port`.
pub async fn wait_for_port(port: u16, timeout: Duration) -> bool {
    eventually(timeout, || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .is_some()
}

/// A child process that is killed when the guard is dropped, even when the test panics.
pub struct ChildGuard {
    pub child: std::process::Child,
}

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit.
    pub async fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {} failed", self.pid());
        let child = &mut self.child;
        poll(timeout, || {
            std::future::ready(child.try_wait().expect("wait for child"))
        })
        .await
        .ok()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes `request` as is to a fresh connection and reads until the server closes it;
/// for requests a normal client will not send. The request should say `Connection: close`.
pub async fn raw_exchange(addr: std::net::SocketAddr, request: Vec<u8>) -> String {
    use std::io::{Read, Write};
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(15)))?;
        // The server may answer and close before reading everything; that is fine.
        let _ = stream.write_all(&request);
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    })
    .await
    .expect("raw exchange task")
    .expect("connect for a raw exchange")
}

/// A PostgreSQL cluster of a test's own (`initdb` on a free port), for tests that stop or
/// restart PostgreSQL without disturbing the shared one. As root, PostgreSQL's tools run
/// as the `postgres` user (PostgreSQL refuses root).
pub struct PrivatePostgres {
    dir: std::path::PathBuf,
    pub port: u16,
}

fn postgres_tool(program: &str) -> std::process::Command {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        let mut command = std::process::Command::new("runuser");
        command.args(["-u", "postgres", "--", program]);
        command
    } else {
        std::process::Command::new(program)
    }
}

fn run_tool(command: &mut std::process::Command) {
    let output = command.output().expect("run a PostgreSQL tool");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl PrivatePostgres {
    pub async fn start() -> PrivatePostgres {
        let dir = std::env::temp_dir().join(format!("fgtest-pg-{}", super::unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::process::Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .output();
        run_tool(
            postgres_tool("initdb")
                .arg("-D")
                .arg(dir.join("data"))
                .args(["-U", "postgres", "--auth=trust", "-N"]),
        );
        let postgres = PrivatePostgres {
            dir,
            port: free_port(),
        };
        postgres.up();
        postgres
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn up(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        run_tool(
            postgres_tool("pg_ctl")
                .arg("-D")
                .arg(self.dir.join("data"))
                .arg("-l")
                .arg(self.dir.join("log"))
                .args(["-w", "-o", &options, "start"]),
        );
    }

    /// Stops at once, as a crash would (no checkpoint, sessions cut).
    pub fn down(&self) {
        run_tool(
            postgres_tool("pg_ctl")
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-w", "-m", "immediate", "stop"]),
        );
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = postgres_tool("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A file a child process writes its log to, read back by the test; removed when dropped.
pub struct LogFile {
    path: std::path::PathBuf,
}

impl LogFile {
    pub fn new(name: &str) -> LogFile {
        let file = format!("fgtest-{name}-{}.log", super::unique_suffix());
        LogFile {
            path: std::env::temp_dir().join(file),
        }
    }

    /// A fresh handle on the file for the child's stderr.
    pub fn stdio(&self) -> std::process::Stdio {
        std::fs::File::create(&self.path)
            .map(std::process::Stdio::from)
            .expect("create the log file")
    }

    /// How far the log is written now, to read only what follows.
    pub fn mark(&self) -> usize {
        std::fs::read(&self.path).map_or(0, |bytes| bytes.len())
    }

    /// The lines written since `mark`.
    pub fn lines_since(&self, mark: usize) -> Vec<String> {
        let bytes = std::fs::read(&self.path).unwrap_or_default();
        let text = String::from_utf8_lossy(bytes.get(mark..).unwrap_or_default());
        text.lines()
            .filter(|line| !line.trim().is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
