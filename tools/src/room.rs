//! A room seen from outside: its enter, status and protected order requests over plain HTTP, the
//! way the contract describes them, and the answers as a client reads them.
//!
//! One pooled client with keep-alive serves a whole crowd: users sleep most of the time, so a few
//! dozen connections carry thousands of them, like a browser population behind a CDN. Opening a
//! connection per request would measure the kernel's TCP handshake, not the waiting room.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST, RETRY_AFTER};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio::sync::Semaphore;

/// Where the room is and how it is spoken to.
pub struct RoomSettings {
    /// Base URL of the proxy, or of whatever takes the orders when there is no room.
    pub target: String,
    /// The proxy's `endpoints.prefix`.
    pub prefix: String,
    /// Path of the protected order request (sent as POST).
    pub order_path: String,
    /// The proxy's `identity.header`.
    pub user_header: HeaderName,
    /// The proxy's `token.header`.
    pub token_header: HeaderName,
    /// A request slower than this counts as a dropped connection.
    pub request_timeout: Duration,
    /// Requests in flight at once, at most (one connection each); `None`: no limit.
    pub max_conns: Option<usize>,
    /// The Host the users' requests carry, when the room is chosen by host (contract section
    /// 17: rooms on one proxy may share paths and differ only in `host`); `None`: the target's.
    pub host: Option<String>,
}

/// The proxy's answers to enter and status. Every field the contract may send, all optional, so
/// one type reads WAITING, READY, NOT_IN_QUEUE, FULL and the rest.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueAnswer {
    pub status: String,
    pub position: Option<u64>,
    pub estimated_wait_time: Option<u64>,
    pub poll_after: Option<u64>,
    pub token: Option<String>,
    pub retry_after: Option<u64>,
}

/// A response, read whole.
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<u64>,
    pub body: Bytes,
}

impl Reply {
    pub fn queue_answer(&self) -> Option<QueueAnswer> {
        serde_json::from_slice(&self.body).ok()
    }

    /// How long the proxy asked us to stay away: the header, else the body's `retryAfter`, else
    /// one second.
    pub fn back_off(&self) -> Duration {
        let secs = self
            .retry_after
            .or_else(|| self.queue_answer().and_then(|a| a.retry_after))
            .unwrap_or(1);
        Duration::from_secs(secs.max(1))
    }
}

pub struct Room {
    client: Client<HttpConnector, Full<Bytes>>,
    enter: Uri,
    status: Uri,
    order: Uri,
    user_header: HeaderName,
    token_header: HeaderName,
    host: Option<HeaderValue>,
    request_timeout: Duration,
    /// Stands in for the finite connections of the tier in front of the room (and for the
    /// machine's descriptors): a user waiting for a permit is waiting to be served.
    gate: Option<Semaphore>,
    /// Users who want to send a request but hold no permit yet.
    pending: AtomicI64,
}

impl Room {
    pub fn new(settings: RoomSettings) -> Result<Room, String> {
        let prefix = settings.prefix.trim_end_matches('/');
        if !prefix.starts_with('/') || !settings.order_path.starts_with('/') {
            return Err("the endpoints' prefix and the order path must start with /".into());
        }
        let base = settings.target.trim_end_matches('/');
        let uri = |path: &str| url(&format!("{base}{path}"));
        let mut connector = HttpConnector::new();
        // Small request/response pairs: Nagle would only add delay.
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let host = settings
            .host
            .as_deref()
            .map(|h| HeaderValue::from_str(h).map_err(|e| format!("bad host {h}: {e}")))
            .transpose()?;
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(50))
            .pool_max_idle_per_host(settings.max_conns.unwrap_or(usize::MAX))
            .build(connector);
        Ok(Room {
            client,
            enter: uri(&format!("{prefix}/enter"))?,
            status: uri(&format!("{prefix}/status"))?,
            order: uri(&settings.order_path)?,
            user_header: settings.user_header,
            token_header: settings.token_header,
            host,
            request_timeout: settings.request_timeout,
            gate: settings.max_conns.map(|n| Semaphore::new(n.max(1))),
            pending: AtomicI64::new(0),
        })
    }

    pub async fn enter(&self, user: &str) -> Result<Reply, String> {
        self.send(
            self.request(Method::POST, &self.enter, user)
                .body(Full::default()),
        )
        .await
    }

    pub async fn status(&self, user: &str) -> Result<Reply, String> {
        self.send(
            self.request(Method::GET, &self.status, user)
                .body(Full::default()),
        )
        .await
    }

    /// The protected order; without a token it is what a user sends when there is no room.
    pub async fn order(&self, user: &str, token: Option<&str>) -> Result<Reply, String> {
        let body = serde_json::json!({"item": "demo-ticket", "quantity": 1, "user": user});
        let mut request = self
            .request(Method::POST, &self.order, user)
            .header(CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            request = request.header(&self.token_header, token);
        }
        self.send(request.body(Full::new(Bytes::from(body.to_string()))))
            .await
    }

    /// A request outside the crowd's connection limit (metrics, the backend's stats): an
    /// observer's look must not queue behind the users it observes.
    pub async fn observe(&self, method: Method, uri: &Uri, timeout: Duration) -> Option<Reply> {
        let request = Request::builder()
            .method(method)
            .uri(uri.clone())
            .body(Full::default())
            .ok()?;
        tokio::time::timeout(timeout, self.call(request))
            .await
            .ok()?
            .ok()
    }

    pub fn pending(&self) -> i64 {
        self.pending.load(Ordering::Relaxed).max(0)
    }

    fn request(&self, method: Method, uri: &Uri, user: &str) -> http::request::Builder {
        let request = Request::builder()
            .method(method)
            .uri(uri.clone())
            .header(&self.user_header, user);
        // The client only fills Host in when the request has none.
        match &self.host {
            Some(host) => request.header(HOST, host),
            None => request,
        }
    }

    async fn send(
        &self,
        request: Result<Request<Full<Bytes>>, http::Error>,
    ) -> Result<Reply, String> {
        let request = request.map_err(|e| e.to_string())?;
        let _permit = match &self.gate {
            Some(gate) => {
                self.pending.fetch_add(1, Ordering::Relaxed);
                let permit = gate.acquire().await;
                self.pending.fetch_sub(1, Ordering::Relaxed);
                Some(permit.map_err(|e| e.to_string())?)
            }
            None => None,
        };
        tokio::time::timeout(self.request_timeout, self.call(request))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.request_timeout)))
    }

    async fn call(&self, request: Request<Full<Bytes>>) -> Result<Reply, String> {
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        // Read the body to the end even when it is not needed: only then does the connection go
        // back to the pool.
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply {
            status,
            retry_after,
            body,
        })
    }
}

pub fn url(text: &str) -> Result<Uri, String> {
    text.parse::<Uri>()
        .map_err(|e| format!("bad URL {text}: {e}"))
}
