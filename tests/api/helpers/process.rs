//! Child processes (redis-server, flashgate serve) and the ports they listen on.

use std::time::{Duration, Instant};

use super::{POLL_INTERVAL, eventually};

/// A port nothing listens on right now (the listener is closed again at once).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().unwrap().port()
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
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("wait for child") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
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
