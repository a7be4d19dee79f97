//! The client that places the sale's orders: plain HTTP/1.1 connections to the gateway,
//! kept in a stack.
//!
//! The load generator shares the machine with what it measures, so every microsecond it
//! spends per request is taken from the gateway and PostgreSQL. A general client parses
//! the URL, builds a header map, arms a timer and walks its pool for every request; here
//! the target, the body and each user's `Authorization` value are prepared once, a request
//! takes the most recently answered connection (or opens one), and gives it back when its
//! answer is read. At most as many connections are open as requests were ever in flight.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The order body: one unit.
const ONE_UNIT: &[u8] = br#"{"quantity":1}"#;

/// A connection idle this long is closed rather than reused: the gateway may be closing
/// it (its header read timeout), and a request sent on a closing connection is lost.
const IDLE_MAX: Duration = Duration::from_secs(2);

/// How long one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends order requests to one deal of one gateway.
pub struct OrderClient {
    /// `host:port` of the gateway.
    authority: String,
    host: HeaderValue,
    path: Uri,
    idle: Mutex<Vec<(SendRequest<Full<Bytes>>, Instant)>>,
}

/// The status and, for a 201, the body of one answer.
pub struct Answer {
    pub status: u16,
    pub body: Option<Bytes>,
}

impl OrderClient {
    /// A client for `POST {base_url}/v1/deals/{deal_id}/orders`.
    pub fn new(base_url: &str, deal_id: &str) -> Result<Self, String> {
        let base: Uri = base_url.parse().map_err(|e| format!("{base_url}: {e}"))?;
        let authority = base
            .authority()
            .ok_or_else(|| format!("{base_url}: no host"))?
            .to_string();
        let path = format!("/v1/deals/{deal_id}/orders")
            .parse()
            .map_err(|e| format!("deal id {deal_id}: {e}"))?;
        let host = HeaderValue::from_str(&authority).map_err(|e| e.to_string())?;
        Ok(Self {
            authority,
            host,
            path,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// `Authorization` for `token`, prepared before the run.
    pub fn bearer(token: &str) -> Result<HeaderValue, String> {
        HeaderValue::from_str(&format!("Bearer {token}")).map_err(|e| e.to_string())
    }

    /// Places one order; an error is any failure to get an answer in time.
    pub async fn order(
        &self,
        bearer: &HeaderValue,
        key: &str,
        pass: Option<&str>,
    ) -> Result<Answer, String> {
        self.order_from(bearer, key, pass, None).await
    }

    /// Places one order as a proxy would forward it for `client_address` (in
    /// `X-Forwarded-For`), so that one load generator stands for many addresses.
    pub async fn order_from(
        &self,
        bearer: &HeaderValue,
        key: &str,
        pass: Option<&str>,
        client_address: Option<&str>,
    ) -> Result<Answer, String> {
        let request = self.request(bearer, key, pass, client_address)?;
        let mut sender = self.connection().await?;
        let answered = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(Answer {
                status,
                body: (status == 201).then(|| body.to_bytes()),
            })
        })
        .await
        .map_err(|_| "timed out".to_owned())??;
        self.give_back(sender);
        Ok(answered)
    }

    fn request(
        &self,
        bearer: &HeaderValue,
        key: &str,
        pass: Option<&str>,
        client_address: Option<&str>,
    ) -> Result<Request<Full<Bytes>>, String> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.path.clone())
            .header(HOST, self.host.clone())
            .header(AUTHORIZATION, bearer.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("idempotency-key", key);
        if let Some(pass) = pass {
            request = request.header("flashgate-pass", pass);
        }
        if let Some(address) = client_address {
            request = request.header("x-forwarded-for", address);
        }
        request
            .body(Full::new(Bytes::from_static(ONE_UNIT)))
            .map_err(|e| e.to_string())
    }

    /// The most recently answered connection still fit for use, or a new one.
    async fn connection(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        loop {
            let idle = self.idle.lock().map_err(|_| "poisoned")?.pop();
            let Some((sender, since)) = idle else { break };
            if since.elapsed() < IDLE_MAX && sender.is_ready() {
                return Ok(sender);
            }
        }
        let stream = TcpStream::connect(&self.authority)
            .await
            .map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        Ok(sender)
    }

    fn give_back(&self, sender: SendRequest<Full<Bytes>>) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push((sender, Instant::now()));
        }
    }
}
