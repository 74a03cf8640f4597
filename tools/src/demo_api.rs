//! The demo order API: a stand-in for a shop's unmodified order backend.
//!
//! The integration tests, the demo and the benchmarks put waitroom in front of this server, so it
//! has to behave like the thing it imitates and tell us what it saw:
//!
//! - `POST /api/orders` models a backend limited by a database pool: `slots` orders run at once,
//!   the rest queue (FIFO, like a pool's waiters) until a slot frees up. `GET /admin/stats` shows how
//!   many ran and waited at once, which is how a test proves the proxy kept the backend below its
//!   capacity.
//! - Every other request is echoed back as JSON, so a test can prove that the proxy passed a request
//!   through unchanged.
//! - A few request headers (`X-Demo-Fail`, `X-Echo-Status`) let a test script failures without
//!   restarting the server. `X-Demo-Delay-Ms` (an order's own service time) is honoured only when
//!   the server is started with client delays on (`--client-delays`): otherwise any user of a
//!   room in front of this server could make their own order outlast the proxy's
//!   `limits.upstream_timeout`, an outcome the room must treat as unknown. The tests that script
//!   slow orders turn it on; the demo and the benchmarks leave it off.
//!
//! It is deliberately plain hyper (one task per connection, HTTP/1.1 keep-alive) rather than
//! pingora: it must not share code paths with the proxy it is used to test. The binary
//! (`src/bin/demo_order_api.rs`) is only its command line; the crowds read `/admin/stats` through
//! [`StatsSnapshot`], the type this server writes it with.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::{debug, info, warn};

use crate::service::accept_forever;

/// Request bodies are buffered whole (the echo returns them), so cap them to keep a stray upload
/// from eating the benchmark machine's memory.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Upper bound for any service time or per-request delay. A longer sleep is never what a test
/// means; refusing it turns a typo into a 400 instead of a request that hangs for days.
pub const MAX_DELAY_MS: u64 = 60 * 60 * 1000;

/// How the server is set up: its order capacity, and what a request may choose.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Orders processed at once.
    pub slots: u32,
    /// How long each order holds its slot, until `PUT /admin/service-time` changes it.
    pub service_time_ms: u64,
    /// Whether an order's `X-Demo-Delay-Ms` header sets its own service time. Off, the header is
    /// ignored: a client must not be able to choose how long its order takes.
    pub client_delays: bool,
}

/// Serves on `listener` until the process ends: `slots` orders at once, each holding its slot for
/// the service time (`X-Demo-Delay-Ms` instead when client delays are on).
pub async fn serve(listener: TcpListener, settings: Settings) {
    let app = Arc::new(App::new(settings));
    accept_forever(listener, app, serve_connection, accept_failed).await;
}

/// A failed accept is logged here, not in the loop, so that the line names this module.
fn accept_failed(e: &std::io::Error) {
    warn!(error = %e, "accept failed");
}

async fn serve_connection(app: Arc<App>, stream: TcpStream, peer: SocketAddr) {
    // Responses are small and written in one go; Nagle would only add latency to the benchmarks.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| {
        let app = Arc::clone(&app);
        async move { Ok::<_, Infallible>(handle(&app, req).await) }
    });
    let served = http1::Builder::new()
        .keep_alive(true)
        // No header timeout: hyper would also apply it to idle keep-alive connections, and a proxy's
        // pooled upstream connection closed under its feet shows up in tests as a spurious 502.
        .header_read_timeout(None::<Duration>)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        // Clients that hang up mid-request are routine for a load-test target, not a warning.
        debug!(%peer, error = %e, "connection ended with an error");
    }
}

// ---------------------------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------------------------

struct App {
    slots: Semaphore,
    slot_count: u32,
    client_delays: bool,
    stats: Stats,
}

impl App {
    fn new(settings: Settings) -> Self {
        App {
            // u32 -> usize cannot truncate on the 32/64-bit targets we build for; the CLI caps the
            // value far below Semaphore::MAX_PERMITS.
            slots: Semaphore::new(settings.slots as usize),
            slot_count: settings.slots,
            client_delays: settings.client_delays,
            stats: Stats::new(settings.service_time_ms),
        }
    }

    /// Takes an order slot, counting the order as waiting only if it actually has to wait, so that
    /// `peakWaiting` stays 0 while the backend is below capacity.
    async fn take_slot(&self) -> Option<Slot<'_>> {
        let permit = match self.slots.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                let _waiting = Level::enter(&self.stats.waiting, &self.stats.peak_waiting);
                // tokio's semaphore is fair: waiters get slots in arrival order, like a DB pool.
                // It is never closed, so an error here cannot happen; answer it anyway, not panic.
                self.slots.acquire().await.ok()?
            }
        };
        Some(Slot {
            _in_flight: Level::enter(&self.stats.in_flight, &self.stats.peak_in_flight),
            _permit: permit,
        })
    }
}

/// An order holding a slot. Field order matters: fields drop in declaration order, so the in-flight
/// count goes down before the permit is released, and `inFlight` can never exceed `slots` even for
/// an instant.
struct Slot<'a> {
    _in_flight: Level<'a>,
    _permit: SemaphorePermit<'a>,
}

/// Every counter the server keeps, in one place. Atomics rather than a mutex: they are touched on
/// every order, by thousands of tasks, and no reader needs a consistent snapshot of all of them.
struct Stats {
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
    waiting: AtomicU64,
    peak_waiting: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    service_time_ms: AtomicU64,
    /// Not reset by /admin/reset: order ids stay unique for the life of the process.
    last_order_id: AtomicU64,
}

/// `GET /admin/stats` (and the answer to `POST /admin/reset`). Readers deserialize it with this
/// same type, so a field renamed here cannot silently read as 0 in a crowd's results.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct StatsSnapshot {
    pub in_flight: u64,
    pub peak_in_flight: u64,
    pub waiting: u64,
    pub peak_waiting: u64,
    pub completed: u64,
    pub failed: u64,
    pub service_time_ms: u64,
    pub slots: u32,
}

impl Stats {
    fn new(service_time_ms: u64) -> Self {
        Stats {
            in_flight: AtomicU64::new(0),
            peak_in_flight: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            peak_waiting: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            service_time_ms: AtomicU64::new(service_time_ms),
            last_order_id: AtomicU64::new(0),
        }
    }

    fn service_time(&self) -> Duration {
        Duration::from_millis(self.service_time_ms.load(Ordering::Relaxed))
    }

    fn set_service_time_ms(&self, ms: u64) {
        self.service_time_ms.store(ms, Ordering::Relaxed);
    }

    /// Counts a completed order and hands out its id.
    fn complete_order(&self) -> u64 {
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.last_order_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn fail_order(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Peaks restart from the current level rather than from 0, so that "peak >= current" holds
    /// even when a test resets while orders are still running (on an idle server that is 0).
    fn reset(&self) {
        self.peak_in_flight
            .store(self.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
        self.peak_waiting
            .store(self.waiting.load(Ordering::Relaxed), Ordering::Relaxed);
        self.completed.store(0, Ordering::Relaxed);
        self.failed.store(0, Ordering::Relaxed);
    }

    fn snapshot(&self, slots: u32) -> StatsSnapshot {
        StatsSnapshot {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            peak_in_flight: self.peak_in_flight.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            peak_waiting: self.peak_waiting.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            service_time_ms: self.service_time_ms.load(Ordering::Relaxed),
            slots,
        }
    }
}

/// One unit of a gauge with a high-water mark, held for as long as the value lives. Tied to a
/// guard rather than paired inc/dec calls because hyper drops a request's future when its client
/// goes away: the count must come down on that path too.
struct Level<'a> {
    current: &'a AtomicU64,
}

impl<'a> Level<'a> {
    fn enter(current: &'a AtomicU64, peak: &AtomicU64) -> Self {
        let now = current.fetch_add(1, Ordering::Relaxed) + 1;
        peak.fetch_max(now, Ordering::Relaxed);
        Level { current }
    }
}

impl Drop for Level<'_> {
    fn drop(&mut self) {
        self.current.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// Routing and handlers
// ---------------------------------------------------------------------------------------------

type Reply = Response<Full<Bytes>>;

enum Route {
    Order,
    SetServiceTime,
    Stats,
    Reset,
    Echo,
}

/// Exact method and path only: anything else, including `GET /api/orders`, is an echo, because a
/// proxy test wants to see exactly how such requests arrive.
fn route(method: &Method, path: &str) -> Route {
    match (method, path) {
        (&Method::POST, "/api/orders") => Route::Order,
        (&Method::PUT, "/admin/service-time") => Route::SetServiceTime,
        (&Method::GET, "/admin/stats") => Route::Stats,
        (&Method::POST, "/admin/reset") => Route::Reset,
        _ => Route::Echo,
    }
}

async fn handle(app: &App, req: Request<Incoming>) -> Reply {
    let (parts, body) = req.into_parts();
    // Read the body on every route, not just the echo: an unread body stops hyper from reusing
    // the connection, and keep-alive is what the benchmarks measure.
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return error_reply(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
        }
        Err(_) => return error_reply(StatusCode::BAD_REQUEST, "could not read the request body"),
    };

    match route(&parts.method, parts.uri.path()) {
        Route::Order => create_order(app, &parts.headers).await,
        Route::SetServiceTime => set_service_time(app, &body),
        Route::Stats => json_reply(StatusCode::OK, &app.stats.snapshot(app.slot_count)),
        Route::Reset => {
            app.stats.reset();
            json_reply(StatusCode::OK, &app.stats.snapshot(app.slot_count))
        }
        Route::Echo => echo(&parts, &body),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Order {
    order_id: u64,
    user: Option<String>,
}

async fn create_order(app: &App, headers: &HeaderMap) -> Reply {
    // Forced failures answer at once and take no slot: they stand for orders the backend rejects
    // up front (validation, conflict), which is what the token-keeping rules are tested against.
    match header_number(headers, "x-demo-fail", 400..=599) {
        Ok(Some(status)) => {
            app.stats.fail_order();
            return error_reply(status_code(status), "forced failure");
        }
        Ok(None) => {}
        Err(msg) => return error_reply(StatusCode::BAD_REQUEST, msg),
    }
    // With client delays off the header is not read at all, so a malformed one is no error.
    let client_delay = if app.client_delays {
        header_number(headers, "x-demo-delay-ms", 0..=MAX_DELAY_MS)
    } else {
        Ok(None)
    };
    let service_time = match client_delay {
        Ok(delay) => delay.map(Duration::from_millis),
        Err(msg) => return error_reply(StatusCode::BAD_REQUEST, msg),
    };
    let user = headers
        .get("x-user-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());

    let Some(slot) = app.take_slot().await else {
        app.stats.fail_order();
        return error_reply(StatusCode::SERVICE_UNAVAILABLE, "no order slot available");
    };
    // Read the service time only once the slot is ours, so that a PUT /admin/service-time applies
    // to every order that has not started yet, including those already queued.
    let service_time = service_time.unwrap_or_else(|| app.stats.service_time());
    tokio::time::sleep(service_time).await;
    let order_id = app.stats.complete_order();
    drop(slot);
    json_reply(StatusCode::CREATED, &Order { order_id, user })
}

#[derive(Deserialize)]
struct ServiceTime {
    ms: u64,
}

fn set_service_time(app: &App, body: &[u8]) -> Reply {
    let ms = match serde_json::from_slice::<ServiceTime>(body) {
        Ok(ServiceTime { ms }) if ms <= MAX_DELAY_MS => ms,
        Ok(_) => return error_reply(StatusCode::BAD_REQUEST, "ms: at most one hour"),
        Err(_) => {
            return error_reply(
                StatusCode::BAD_REQUEST,
                r#"expected {"ms": <milliseconds>}"#,
            )
        }
    };
    app.stats.set_service_time_ms(ms);
    info!(service_time_ms = ms, "service time changed");
    json_reply(StatusCode::OK, &serde_json::json!({ "serviceTimeMs": ms }))
}

#[derive(Serialize)]
struct Echo<'a> {
    method: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    /// Pairs rather than a map: repeated headers must all show, in order. hyper lowercases names
    /// and groups repeats of one name together; within a name the wire order is kept.
    headers: Vec<(&'a str, Cow<'a, str>)>,
    body: Cow<'a, str>,
}

fn echo(parts: &http::request::Parts, body: &[u8]) -> Reply {
    let status = match header_number(&parts.headers, "x-echo-status", 200..=599) {
        Ok(status) => status.map_or(StatusCode::OK, status_code),
        Err(msg) => return error_reply(StatusCode::BAD_REQUEST, msg),
    };
    let echo = Echo {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), String::from_utf8_lossy(value.as_bytes())))
            .collect(),
        body: String::from_utf8_lossy(body),
    };
    let mut reply = json_reply(status, &echo);
    reply
        .headers_mut()
        .insert("x-echo", HeaderValue::from_static("yes"));
    reply
}

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// A numeric control header: absent is `None`; present but not a number in `range` is an error
/// naming the header, so that a mistyped test fails loudly instead of silently using defaults.
fn header_number(
    headers: &HeaderMap,
    name: &'static str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Option<u64>, String> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    match value
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        Some(n) if range.contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "{name}: expected a number from {} to {}",
            range.start(),
            range.end()
        )),
    }
}

/// Callers pass numbers already checked to lie in 200..=599, which are all valid status codes; the
/// fallback only keeps this function total.
fn status_code(n: u64) -> StatusCode {
    u16::try_from(n)
        .ok()
        .and_then(|n| StatusCode::from_u16(n).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn error_reply(status: StatusCode, message: impl Into<String>) -> Reply {
    json_reply(status, &serde_json::json!({ "error": message.into() }))
}

fn json_reply(status: StatusCode, body: &impl Serialize) -> Reply {
    // Our bodies are plain structs of strings and numbers, which always serialise; the fallback
    // exists so that no input can turn into a panic.
    let (status, bytes) = match serde_json::to_vec(body) {
        Ok(bytes) => (status, Bytes::from(bytes)),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Bytes::from_static(br#"{"error":"could not serialise the response"}"#),
        ),
    };
    let mut reply = Response::new(Full::new(bytes));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}
