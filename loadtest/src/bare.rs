//! The baseline: a hyper 1.x server that answers every request with one fixed answer and
//! does nothing else, so "what a refusal costs" can be compared with "what answering
//! costs" on the same machine in the same run.
//!
//! To compare like with like it can replay an answer captured from the gateway
//! (`--answer FILE`, the bytes `curl -si` prints): the same status, headers and body,
//! sent to the same request, whose body it never reads, just as the gateway leaves a
//! refused request's body unread. hyper adds `date` and `content-length` itself, as it
//! does for the gateway. Without a file it answers a tiny JSON body.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_LENGTH, DATE, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The one answer the bare server gives.
#[derive(Clone)]
pub struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    /// `{"ok":true}`, 200, `application/json`.
    pub fn tiny_json() -> Self {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        Self {
            status: StatusCode::OK,
            headers,
            body: Bytes::from_static(br#"{"ok":true}"#),
        }
    }

    /// Reads an HTTP/1.1 response as `curl -si` prints it: status line, headers, an empty
    /// line, the body. `date` and `content-length` are left to hyper.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&raw).ok_or_else(|| format!("{}: not an HTTP/1.1 response", path.display()))
    }

    fn parse(raw: &[u8]) -> Option<Self> {
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = std::str::from_utf8(&raw[..split]).ok()?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let mut headers = HeaderMap::new();
        for line in lines {
            let (name, value) = line.split_once(':')?;
            let name = HeaderName::from_bytes(name.trim().as_bytes()).ok()?;
            if name == DATE || name == CONTENT_LENGTH {
                continue;
            }
            headers.append(name, HeaderValue::from_str(value.trim()).ok()?);
        }
        Some(Self {
            status: StatusCode::from_u16(status).ok()?,
            headers,
            body: Bytes::copy_from_slice(&raw[split + 4..]),
        })
    }

    fn response(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body.clone()));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        response
    }
}

/// Serves until the process ends; prints the bound address first. With `loops` above
/// zero, each of that many threads runs its own current-thread runtime accepting on a
/// copy of the listener, instead of the one multi-thread runtime `main` started: the
/// layout to compare the default with.
pub async fn serve(listen: SocketAddr, answer: Answer, loops: usize) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    println!("bare server listening on http://{}", listener.local_addr()?);
    let answer = Arc::new(answer);
    if loops == 0 {
        return accept(listener, answer).await;
    }
    let listener = listener.into_std()?;
    let mut threads = Vec::new();
    for _ in 0..loops {
        let (copy, answer) = (listener.try_clone()?, answer.clone());
        threads.push(std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move { accept(TcpListener::from_std(copy)?, answer).await })
        }));
    }
    for thread in threads {
        thread
            .join()
            .map_err(|_| std::io::Error::other("a serving thread panicked"))??;
    }
    Ok(())
}

async fn accept(listener: TcpListener, answer: Arc<Answer>) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let answer = answer.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_request: Request<hyper::body::Incoming>| {
                let response = answer.response();
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_captured_answer() {
        let raw = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/problem+json\r\n\
retry-after: 1\r\ncontent-length: 4\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\n\r\n{\"a\"";
        let answer = Answer::parse(raw).unwrap();
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers.len(), 2);
        assert_eq!(answer.headers["retry-after"], "1");
        assert_eq!(answer.body, Bytes::from_static(b"{\"a\""));
    }
}
