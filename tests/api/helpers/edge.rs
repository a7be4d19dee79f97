//! The edge Worker (edge/cloudflare/worker.js) in workerd, Cloudflare's open-source Workers
//! runtime from npm, in front of a gateway through a counting proxy: the proxy tells how
//! many requests reached the origin per path, and can be pointed at another gateway (a key
//! rotation restarts the fleet with new settings).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::{ChildGuard, free_port, test_log, wait_for_port};

/// What the proxy saw: requests per path, and the client addresses forwarded to it.
#[derive(Default)]
struct Seen {
    per_path: HashMap<String, usize>,
    forwarded_for: Vec<String>,
}

/// A reverse proxy in front of the origin that counts what reaches it.
#[derive(Clone)]
pub struct CountingProxy {
    pub addr: SocketAddr,
    upstream: Arc<Mutex<String>>,
    seen: Arc<Mutex<Seen>>,
}

impl CountingProxy {
    /// A proxy to `upstream` (`http://host:port`) on a free loopback port.
    pub async fn start(upstream: &str) -> CountingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = CountingProxy {
            addr: listener.local_addr().unwrap(),
            upstream: Arc::new(Mutex::new(upstream.to_owned())),
            seen: Arc::default(),
        };
        let served = proxy.clone();
        tokio::spawn(async move {
            let client = super::http_client();
            while let Ok((stream, _)) = listener.accept().await {
                let (proxy, client) = (served.clone(), client.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let (proxy, client) = (proxy.clone(), client.clone());
                        async move { Ok::<_, Infallible>(proxy.relay(&client, request).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        proxy
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on requests go to `upstream`.
    pub fn point_at(&self, upstream: &str) {
        *self.upstream.lock().unwrap() = upstream.to_owned();
    }

    /// Requests that reached the origin for `path`.
    pub fn count(&self, path: &str) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.per_path.get(path).copied().unwrap_or(0)
    }

    /// The `X-Forwarded-For` values of every request that carried one.
    pub fn forwarded_for(&self) -> Vec<String> {
        self.seen.lock().unwrap().forwarded_for.clone()
    }

    async fn relay(
        &self,
        client: &reqwest::Client,
        request: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        let (parts, body) = request.into_parts();
        {
            let mut seen = self.seen.lock().unwrap();
            *seen
                .per_path
                .entry(parts.uri.path().to_owned())
                .or_default() += 1;
            if let Some(value) = parts.headers.get("x-forwarded-for") {
                seen.forwarded_for
                    .push(value.to_str().unwrap_or_default().to_owned());
            }
        }
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let upstream = self.upstream.lock().unwrap().clone();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut headers = parts.headers.clone();
        headers.remove(http::header::HOST);
        let sent = client
            .request(parts.method, format!("{upstream}{path}"))
            .headers(headers)
            .body(body)
            .send()
            .await;
        let Ok(answer) = sent else {
            return status_only(502);
        };
        let mut response = Response::builder().status(answer.status().as_u16());
        for (name, value) in answer.headers() {
            response = response.header(name, value);
        }
        let bytes = answer.bytes().await.unwrap_or_default();
        response
            .body(Full::new(bytes))
            .unwrap_or_else(|_| status_only(502))
    }
}

fn status_only(status: u16) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
    response
}

/// The Worker's directory.
pub fn worker_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("edge/cloudflare")
}

/// workerd serving the Worker with `origin` as its ORIGIN binding, and its cache directory.
pub struct Workerd {
    pub url: String,
    _process: ChildGuard,
    _cache: tempfile_dir::Dir,
}

impl Workerd {
    pub async fn start(origin: &str) -> Workerd {
        let dir = worker_dir();
        let binary = dir.join("node_modules/.bin/workerd");
        assert!(
            binary.exists(),
            "{} is missing: run `npm ci` in edge/cloudflare (scripts/edge.sh does)",
            binary.display()
        );
        let cache = tempfile_dir::Dir::new("flashgate-edge-cache");
        let port = free_port();
        let mut command = std::process::Command::new(&binary);
        command
            .current_dir(&dir)
            .args(["serve", "--experimental", "workerd.capnp"])
            .arg(format!("--socket-addr=http=127.0.0.1:{port}"))
            .arg(format!(
                "--directory-path=edge-cache={}",
                cache.path.display()
            ))
            .env("FLASHGATE_EDGE_ORIGIN", origin);
        if !test_log() {
            command.stdout(std::process::Stdio::null());
        }
        let child = command.spawn().expect("start workerd");
        let process = ChildGuard { child };
        assert!(
            wait_for_port(port, Duration::from_secs(30)).await,
            "workerd did not listen on {port}"
        );
        Workerd {
            url: format!("http://127.0.0.1:{port}"),
            _process: process,
            _cache: cache,
        }
    }
}

/// A directory removed when dropped.
mod tempfile_dir {
    use std::path::PathBuf;

    pub struct Dir {
        pub path: PathBuf,
    }

    impl Dir {
        pub fn new(prefix: &str) -> Dir {
            let path =
                std::env::temp_dir().join(format!("{prefix}-{}", super::super::unique_suffix()));
            std::fs::create_dir_all(&path).expect("create a temporary directory");
            Dir { path }
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
