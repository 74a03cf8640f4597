//! Connections under attack (contract section 16): the limits a connection on `listen` lives
//! under before any request reaches [`crate::proxy`].
//!
//! **Why here, and why this shape.** pingora 0.9.1 bounds each *read* of a request head (60 s, and
//! only on a connection's first request; a keep-alive connection waits for its next head forever),
//! buffers up to about 1 MiB of unfinished head, re-parses the whole buffer after every read (a
//! head trickled byte by byte costs quadratic CPU) and accepts every connection. No `ProxyHttp`
//! phase runs before a head is complete, so none of this can be fixed from the proxy's phases.
//! The narrowest places that see a connection before pingora parses anything are:
//!
//! - the [`ServerApp`] a listening service runs: [`Guarded`] wraps pingora's `HttpProxy` app and
//!   drives its HTTP/1 keep-alive loop itself (the same dozen lines as pingora's blanket
//!   `ServerApp for HttpServerApp`), so it knows when a connection starts waiting for a head,
//!   on the first request and on every later one. It reads each head itself and hands it to
//!   pingora's new session as the session's pipelined prefix, so an idle or trickling connection
//!   holds no pingora session, request future or head buffer (BENCHMARKS.md, "Memory per
//!   connection"). Each head is read once ([`crate::http1`]) into the framing every later
//!   reader obeys; a call the layer above can answer without pingora (an [`Early`] answerer, the
//!   room's status and enter calls) it hands to that answerer, which never reaches into the loop;
//! - the accepted stream: each one is wrapped in a [`LimitedStream`] that implements pingora's
//!   IO traits by delegation. While a head is awaited it holds the bytes itself and hands them to
//!   pingora only once the blank line that ends the head has arrived. So pingora parses each head
//!   once, never buffers an unfinished one, and never sees a connection that a limit closes (it
//!   takes the close for a client that went away: no error line per slow client). It also
//!   gathers a response's small writes until pingora flushes them, in place of pingora's L4
//!   write buffer, so a waiting connection keeps no write buffer either;
//! - the listener's connection filter (pingora's `connection_filter` feature) refuses a
//!   connection beyond `max_connections`, or beyond `max_connections_per_address` from its peer's
//!   IP, before pingora spawns a task for it. It only reads the counts; [`Guarded`] takes the
//!   slot, so the limits hold exactly even when a burst is accepted faster than tasks start.
//!
//! Deadlines, per request head: while no byte has arrived the connection is idle and is closed at
//! `idle_timeout` (a fresh connection: at the earlier of `idle_timeout` and `header_timeout`);
//! once bytes arrive the head must be complete `header_timeout` after its first byte (a fresh
//! connection: after the accept). A head larger than `max_request_head` gets a 431 with a JSON
//! body and the connection is closed after a short lingering drain, so the client reads the 431
//! instead of a reset. Every value is read from the running settings when a head is awaited, so a
//! reload applies from each connection's next request.
//!
//! While pingora serves a request the stream gives it exactly the body the head declares (a
//! length, or chunked up to its last chunk), never the client's next request: pingora's look at
//! the connection while it waits for the upstream would take that, or the client closing, for the
//! end of the exchange and drop the request at the upstream unanswered. What arrives then is kept
//! for the next head; a claimed order ([`hold_client`]) also keeps the client's leaving from
//! pingora until the upstream's answer has settled its token.
//!
//! A request body is pingora's again (its per-read timeout); the proxy's own endpoints bound
//! theirs by `header_timeout` in total (408, see [`crate::proxy`]), and the upstream's answer by
//! `upstream_timeout` (504).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream, ServerApp};
use pingora::listeners::ConnectionFilter;
use pingora::protocols::http::ServerSession;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::config::LimitsConfig;
use crate::http1::chunked::{ChunkedEnd, Fed};
use crate::http1::head::{self, Body, Framing, HeadEnd};
use crate::metrics;
use crate::process::Process;

/// How long an answer written to a client may take before the connection is given up (pingora's
/// own answers are bounded alike, see [`crate::proxy`]).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

const BAD_REQUEST_LINE_BODY: &str =
    r#"{"error":"the request line must be METHOD, one space, the target, one space, HTTP/1.x"}"#;

/// How long a refused connection's input is read and dropped after its 431, so that closing
/// with unread bytes (a reset) does not destroy the answer before the client reads it.
const LINGER: Duration = Duration::from_secs(1);

const TOO_LARGE_BODY: &str = r#"{"error":"request header too large"}"#;

thread_local! {
    /// What a worker thread reads request heads into before they are copied out at their own
    /// size: no connection keeps a read buffer between reads. Bytes never stay here across a
    /// wait (the head phase moves an unfinished head into its own `held`).
    static READ_BUFFER: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0; 8192].into_boxed_slice());
}

/// The answer to a head over `max_request_head`: written by the stream itself, since pingora
/// never sees that request.
fn too_large_response() -> Vec<u8> {
    format!(
        "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\n\
         Cache-Control: no-store\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{TOO_LARGE_BODY}",
        TOO_LARGE_BODY.len()
    )
    .into_bytes()
}

/// The answer to a request line that is not exactly `METHOD SP target SP HTTP/1.x` (see
/// [`head::plain_request_line`]), in the bytes pingora writes an answer of the proxy's own; the
/// connection is closed after it (what follows cannot be trusted either).
fn bad_request_line_response() -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n\
         Content-Length: {}\r\nDate: ",
        BAD_REQUEST_LINE_BODY.len()
    );
    let date = pingora::protocols::http::date::get_cached_date();
    [head.as_bytes(), date.as_bytes(), b"\r\nConnection: close\r\n\r\n", BAD_REQUEST_LINE_BODY.as_bytes()].concat()
}

/// Requests the connection loop may answer itself, before pingora's session and its request
/// future exist (the room's status and enter calls, [`crate::proxy::early`]). The loop asks and
/// serves; the answerer sees only the head and the connection it is given.
pub trait Early: Send + Sync + 'static {
    type Call: Send + 'static;

    /// The call `head` is, when this answerer takes it; otherwise the head as read (once, by
    /// [`head::read`]), for pingora. A head whose request line is not plain is never taken.
    fn take(&self, head: &[u8]) -> Taken<Self::Call>;

    /// Answers `call` on `conn`; what becomes of the connection.
    fn serve<'a>(
        &'a self,
        call: Self::Call,
        conn: &'a mut LimitedStream,
        shutdown: &'a ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = After> + Send + 'a>>;
}

/// What an [`Early`] answerer made of a head.
// Returned once per head and taken apart at once: boxing the larger variant would cost every
// forwarded head an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Taken<C> {
    Call(C),
    Not(head::Head),
}

/// No early answers: every head goes to pingora.
pub struct NoEarly;

impl Early for NoEarly {
    type Call = std::convert::Infallible;

    fn take(&self, head: &[u8]) -> Taken<Self::Call> {
        Taken::Not(head::read(head, false))
    }

    fn serve<'a>(
        &'a self,
        call: Self::Call,
        _: &'a mut LimitedStream,
        _: &'a ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = After> + Send + 'a>> {
        match call {}
    }
}

/// What becomes of a connection once an early call is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// It waits for the next request.
    KeepAlive,
    /// It is closed.
    Close,
}

/// A connection that takes back bytes read off it, to be read again first.
pub trait Unread {
    fn unread(&mut self, bytes: &[u8]);
}

/// Connections open on `listen`, shared by the listener's filter and [`Guarded`].
pub struct Connections {
    process: Arc<Process>,
    open: AtomicUsize,
    /// Open connections per peer IP, counted whether or not `max_connections_per_address` is on,
    /// so a reload that turns it on finds the connections already open. An address leaves the map
    /// with its last connection: the map never holds more entries than there are connections.
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

/// Which limit refused a connection: the `limit` label of `waitroom_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Total,
    PerAddress,
}

impl Connections {
    pub fn new(process: Arc<Process>) -> Arc<Connections> {
        Arc::new(Connections { process, open: AtomicUsize::new(0), by_address: Mutex::new(HashMap::new()) })
    }

    /// `max_connections` and `max_connections_per_address` as the running settings have them.
    fn max(&self) -> (usize, usize) {
        let settings = self.process.settings();
        let limits = &settings.config.limits;
        (limits.max_connections, limits.max_connections_per_address)
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    fn by_address(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.by_address.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a connection from `ip` would be refused now, without taking anything.
    fn refuses(&self, ip: Option<IpAddr>) -> Option<Refused> {
        let (max, per_address) = self.max();
        if self.open() >= max {
            return Some(Refused::Total);
        }
        let ip = ip.filter(|_| per_address > 0)?;
        (self.by_address().get(&ip).copied().unwrap_or(0) >= per_address).then_some(Refused::PerAddress)
    }

    /// A slot for one more connection from `ip` (the peer's, when the socket tells it), or which
    /// limit refuses it.
    fn take(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Slot, Refused> {
        let (max, per_address) = self.max();
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .map_err(|_| Refused::Total)?;
        // From here on the slot frees what it took when dropped, refused or not.
        let mut slot = Slot { connections: self.clone(), ip: None };
        metrics::OPEN_CONNECTIONS.inc();
        if let Some(ip) = ip {
            let mut by_address = self.by_address();
            // A refused address has connections open, so no empty entry is left behind.
            let count = by_address.entry(ip).or_insert(0);
            if per_address > 0 && *count >= per_address {
                return Err(Refused::PerAddress);
            }
            *count += 1;
            slot.ip = Some(ip);
        }
        Ok(slot)
    }
}

/// The peer's IP, v4-mapped IPv6 as IPv4: one client is one address whichever way the listener
/// was bound.
fn peer_ip(addr: &std::net::SocketAddr) -> IpAddr {
    addr.ip().to_canonical()
}

/// One open connection; dropping it (with the connection's stream) frees the slot.
struct Slot {
    connections: Arc<Connections>,
    /// The address the connection is counted under, if any.
    ip: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let mut by_address = self.connections.by_address();
            if let Some(count) = by_address.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    by_address.remove(&ip);
                }
            }
        }
        self.connections.open.fetch_sub(1, Ordering::AcqRel);
        metrics::OPEN_CONNECTIONS.dec();
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

fn refused(limit: Refused) {
    let label = match limit {
        Refused::Total => "max_connections",
        Refused::PerAddress => "max_connections_per_address",
    };
    metrics::CONNECTIONS_CLOSED_TOTAL.with_label_values(&[label]).inc();
}

/// The listener's early cut: at `max_connections`, or at `max_connections_per_address` for the
/// peer's IP, a new connection is closed in the accept loop itself, before pingora spawns a task
/// for it.
pub struct AtCapacity(pub Arc<Connections>);

impl std::fmt::Debug for AtCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AtCapacity(open: {})", self.0.open())
    }
}

#[async_trait]
impl ConnectionFilter for AtCapacity {
    async fn should_accept(&self, addr: Option<&std::net::SocketAddr>) -> bool {
        match self.0.refuses(addr.map(peer_ip)) {
            Some(limit) => {
                refused(limit);
                false
            }
            None => true,
        }
    }
}

/// pingora's HTTP app (the proxy) with every connection held to `limits`, and the calls `early`
/// answers taken before pingora.
pub struct Guarded<A, E = NoEarly> {
    app: Arc<A>,
    connections: Arc<Connections>,
    /// `None`: every head goes to pingora (`WAITROOM_EARLY_ANSWERS=off`, see [`crate::server`]).
    early: Option<E>,
}

impl<A, E> Guarded<A, E> {
    pub fn new(app: A, connections: Arc<Connections>, early: Option<E>) -> Guarded<A, E> {
        Guarded { app: Arc::new(app), connections, early }
    }
}

/// What the loop does with a head.
enum Next<C> {
    Early(C),
    Forward(Framing),
    Refuse,
}

/// Reads `head` once (through `early`, when it may take it) and says what comes of it. Not in
/// the loop itself: the read head (a `RequestHeader` included) must not become part of the
/// loop's state, which every idle connection holds.
fn next<E: Early>(early: Option<&E>, head: &[u8]) -> Next<E::Call> {
    let read = match early {
        Some(early) => match early.take(head) {
            Taken::Call(call) => return Next::Early(call),
            Taken::Not(read) => read,
        },
        None => head::read(head, false),
    };
    if read.plain_line {
        Next::Forward(read.framing)
    } else {
        Next::Refuse
    }
}

/// pingora's own timer on a fresh connection's head reads (60 s by default), moved behind ours:
/// it must never fire first, and one pending read of pingora's spans the idle wait and the head.
/// A reused connection keeps pingora's setting (no timer), as our deadlines govern its heads.
fn backstop_secs(limits: &LimitsConfig) -> u64 {
    (limits.idle_timeout + limits.header_timeout).as_secs() + 1
}

#[async_trait]
impl<A, E> ServerApp for Guarded<A, E>
where
    A: HttpServerApp + Send + Sync + 'static,
    E: Early,
{
    /// pingora's HTTP/1 loop (`apps/mod.rs`, `impl ServerApp for T: HttpServerApp`) with the
    /// stream wrapped and told, before every request, that a head is due. h2c and TLS are not
    /// served on `listen`, so the other branches of that loop are not needed here.
    async fn process_new(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let peer = stream.get_socket_digest().and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(peer_ip));
        let slot = match self.connections.take(peer) {
            Ok(slot) => slot,
            Err(limit) => {
                refused(limit);
                return None; // dropping the stream closes it at once
            }
        };
        let (mut limited, backstop) = {
            let settings = self.connections.process.settings();
            let limits = &settings.config.limits;
            (Box::new(LimitedStream::new(stream, slot, limits)), backstop_secs(limits))
        };
        let mut persistent: Option<HttpPersistentSettings> = None;
        // A limit on requests per connection is counted by pingora's sessions only.
        let early = self.early.as_ref().filter(|_| self.app.server_options().and_then(|o| o.keepalive_request_limit).is_none());
        let mut stopping = shutdown.clone();
        let mut fresh = true;
        loop {
            // Between requests a connection waits here, before pingora's session exists, and
            // reads the next head itself: pingora's request future (9 kB) and its 4 KiB head
            // buffer are made only once a head is there, so an idle keep-alive connection costs
            // little more than its socket, and a request's head costs its own size. (pingora
            // keeps nothing past a head: what a pipelining client sent after one waits in the
            // stream, `LimitedStream::unread`, and the next head is read from there first.)
            // A stopping server closes an idle keep-alive connection, as nginx does, even when
            // a head reached the socket while the stop's wake-up waited for a thread (the two
            // race on a busy machine, and HTTP clients retry an idempotent request that a reused
            // connection closed without an answer). Served still: a fresh connection's first
            // head (accepted before the stop) and what a pipelining client sent earlier, which
            // the proxy took off the socket already (`unread`): those are in flight.
            let idle_keepalive = !fresh && !limited.has_unread();
            let head = tokio::select! {
                biased;
                head = limited.read_head() => head.ok()??,
                _ = stopping.wait_for(|stop| *stop) => return None,
            };
            if idle_keepalive && *stopping.borrow() {
                return None;
            }
            fresh = false;
            let framing = match next(early, &head) {
                Next::Early(call) => {
                    limited = self.answer_early(limited, call, shutdown).await?;
                    continue;
                }
                Next::Forward(framing) => framing,
                Next::Refuse => {
                    // Never pingora's to repair (see `head::plain_request_line`).
                    tracing::debug!("request line refused");
                    let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
                        use tokio::io::AsyncWriteExt;
                        limited.write_all(&bad_request_line_response()).await?;
                        limited.flush().await
                    })
                    .await;
                    return None;
                }
            };
            limited.hand_over(framing);
            let reused = self.serve(limited, head, persistent, backstop, shutdown).await?;
            let (next, settings) = reused.consume();
            limited = next.into_any().downcast::<LimitedStream>().ok()?;
            limited.expect_head(&self.connections.process.settings().config.limits, false);
            persistent = settings;
        }
    }

    async fn cleanup(&self) {
        self.app.http_cleanup().await;
    }
}

impl<A, E> Guarded<A, E>
where
    A: HttpServerApp + Send + Sync + 'static,
    E: Early,
{
    /// A call the connection loop answers itself (see [`Early`]); the stream back when
    /// the connection stays open. Boxed, as `serve`'s future is, to keep the loop's state small.
    fn answer_early<'a>(
        self: &'a Arc<Self>,
        mut limited: Box<LimitedStream>,
        call: E::Call,
        shutdown: &'a ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = Option<Box<LimitedStream>>> + Send + 'a>> {
        Box::pin(async move {
            let Some(early) = &self.early else { return None };
            match early.serve(call, &mut limited, shutdown).await {
                After::KeepAlive => {
                    limited.expect_head(&self.connections.process.settings().config.limits, false);
                    Some(limited)
                }
                // Closed by dropping the stream, as pingora closes a connection it does not keep.
                After::Close => None,
            }
        })
    }

    /// pingora's session for one request, and its request future. Built here, outside the async
    /// loop, so the session (over 400 bytes) is not part of the loop's state, which every idle
    /// connection holds: only the boxed future is, while a request runs.
    fn serve<'a>(
        self: &'a Arc<Self>,
        limited: Box<LimitedStream>,
        head: BytesMut,
        persistent: Option<HttpPersistentSettings>,
        backstop: u64,
        shutdown: &'a ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = Option<ReusedHttpStream>> + Send + 'a>> {
        let mut session = ServerSession::new_http1(limited);
        session.set_pipelined_prefix(head);
        match persistent {
            Some(settings) => settings.apply_to_session(&mut session),
            None => {
                session.set_keepalive(Some(backstop));
                session.set_keepalive_reuses_remaining(self.app.server_options().and_then(|o| o.keepalive_request_limit));
            }
        }
        if *shutdown.borrow() {
            // A stopping server lets no connection wait for another request.
            session.set_keepalive(None);
        }
        self.app.process_new_http(session, shutdown)
    }
}

/// Why a limit closed a connection (the label of `waitroom_connections_closed_total`).
#[derive(Debug, Clone, Copy)]
enum Closed {
    IdleTimeout,
    HeaderTimeout,
    HeadTooLarge,
}

impl Closed {
    fn label(self) -> &'static str {
        match self {
            Closed::IdleTimeout => "idle_timeout",
            Closed::HeaderTimeout => "header_timeout",
            Closed::HeadTooLarge => "head_too_large",
        }
    }
}

#[derive(Debug)]
enum Phase {
    /// A request head is due: bytes are held here until it is whole.
    Head { held: Vec<u8>, end: HeadEnd, first_byte: bool, fresh: bool, started: Instant },
    /// A completed head (and whatever came with it) on its way to pingora.
    Release { bytes: Vec<u8>, at: usize },
    /// A request is being served: reads and writes pass straight through.
    Serving,
    /// Over `max_request_head`: the 431 is being written.
    Refusing { response: Vec<u8>, at: usize },
    /// The 431 is out: the client's input is read and dropped until it closes or LINGER passes.
    Lingering,
    /// A limit closed the connection: every read fails.
    Closed,
}

/// An accepted connection held to `limits` (see the module doc); everything pingora asks of a
/// stream besides reading and writing is passed to the one inside.
#[derive(Debug)]
pub struct LimitedStream {
    inner: Stream,
    phase: Phase,
    /// The deadline of the current head (or of the linger after a 431) ...
    deadline: Instant,
    /// ... and the timer that wakes a read waiting for it (see `poll_deadline`): a request whose
    /// head is already there touches no timer.
    timer: Pin<Box<Sleep>>,
    header_timeout: Duration,
    max_head: usize,
    /// A response's writes, gathered until pingora flushes them (see `poll_write`). Empty, with
    /// no allocation, while the connection waits for a head.
    pending: Vec<u8>,
    /// Bytes read off the socket that come after the head being served: a pipelined client's
    /// next requests (or a body), and what a held poll's watch read (see [`Unread`]). Read
    /// before the socket, the next head's from here first: pingora keeps nothing past the head
    /// it is given, so bytes handed over with it were lost, and so were the requests in them.
    /// Empty, with no allocation, unless a client sent ahead.
    unread: Vec<u8>,
    /// How many more bytes pingora's session may read: what is left of the body its head
    /// declared (all, for a body of unknown framing or a tunnel). Past it comes the next
    /// request, which pingora would read while it forwards this one (its look at the connection
    /// while it waits for the upstream) and take for bytes sent after the end of a body: it drops
    /// the request at the upstream unanswered and answers nothing. Its reads wait instead, and
    /// what arrives is kept in `unread` for the next head (see `poll_after_request`).
    allowance: Allowance,
    /// Set by the proxy for a request whose upstream answer must be heard whatever the client
    /// does (a protected order: its token is settled by that answer, see [`hold_client`]).
    held: AtomicBool,
    /// The body the head being served declares, whether or not it asks to switch protocols.
    declared: Body,
    /// The head asks to switch protocols: pingora may read every byte (a tunnel after a 101) ...
    switch: bool,
    /// ... unless the proxy forwards it without its `Upgrade` ([`forwarding`]): then only the
    /// declared body, as for any request.
    switch_dropped: AtomicBool,
    /// How the client left while a held request was at the upstream: told to the loop's next
    /// read, once the answer is out, instead of to pingora.
    departed: Option<Departed>,
    _slot: Slot,
}

/// What of the connection's bytes pingora may read while it serves a request (see
/// `LimitedStream::allowance`).
#[derive(Debug, Clone, Copy)]
enum Allowance {
    /// Everything: a body of unknown framing, a tunnel, or no forwarded request.
    All,
    /// This many more bytes of body.
    Length(usize),
    /// A chunked body, up to its end.
    Chunked(ChunkedEnd),
}

impl From<Body> for Allowance {
    fn from(body: Body) -> Allowance {
        match body {
            Body::Length(length) => Allowance::Length(length),
            Body::Chunked => Allowance::Chunked(ChunkedEnd::START),
            Body::Unknown => Allowance::All,
        }
    }
}

/// A client's end of its connection, noticed while a held request was at the upstream.
#[derive(Debug, Clone, Copy)]
enum Departed {
    Closed,
    Failed(io::ErrorKind),
}

/// Marks the request `session` serves as one whose upstream answer must be heard whatever the
/// client does next (contract section 12, one admission, one order): a client that closes its
/// connection, resets it, or sends more after a protected order would otherwise make pingora drop
/// the order at the upstream unanswered, and its claim would be released while the upstream may
/// have taken the order, so one token could place any number of them. The connection's reads
/// then wait until the answer has come (and settled the token); how the client left is seen by
/// the next read, once the answer is written (or fails to be).
pub fn hold_client(session: &pingora::protocols::http::ServerSession) {
    if let Some(limited) = session.stream().and_then(|stream| stream.as_any().downcast_ref::<LimitedStream>()) {
        limited.held.store(true, Ordering::Relaxed);
    }
}

/// Tells the connection under `session` whether its request is forwarded without its `Upgrade`
/// (`drop_switch`, see [`crate::proxy`]), and returns what the connection can vouch for of where
/// the request ends, or `None` for a stream that is not the connection loop's.
pub fn forwarding(session: &pingora::protocols::http::ServerSession, drop_switch: bool) -> Option<Delimited> {
    let limited = session.stream().and_then(|stream| stream.as_any().downcast_ref::<LimitedStream>())?;
    if drop_switch {
        limited.switch_dropped.store(true, Ordering::Relaxed);
    }
    Some(match limited.declared {
        Body::Unknown => Delimited::Not,
        _ if limited.switch && !drop_switch => Delimited::UnlessSwitched,
        _ => Delimited::Yes,
    })
}

/// The body the request `session` serves declares, as the connection loop read its head (the one
/// framing decision, see [`crate::http1`]), or `None` for a stream that is not the loop's.
pub fn declared_body(session: &pingora::protocols::http::ServerSession) -> Option<Body> {
    let limited = session.stream().and_then(|stream| stream.as_any().downcast_ref::<LimitedStream>())?;
    Some(limited.declared)
}

/// Whether the connection knows where a request ends, and so where the next one starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delimited {
    /// Its body's end is plain (a length, or chunked alone).
    Yes,
    /// It may switch protocols: every byte after its head may be the new protocol's.
    UnlessSwitched,
    /// Only pingora reads where its body ends: what the client sends after it cannot be told
    /// apart from it, and may be taken for more body or for an error after the request was sent.
    Not,
}

impl LimitedStream {
    fn new(inner: Stream, slot: Slot, limits: &LimitsConfig) -> LimitedStream {
        let mut stream = LimitedStream {
            inner,
            phase: Phase::Serving,
            deadline: Instant::now(),
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            header_timeout: limits.header_timeout,
            max_head: limits.max_request_head,
            pending: Vec::new(),
            unread: Vec::new(),
            allowance: Allowance::All,
            held: AtomicBool::new(false),
            declared: Body::Length(0),
            switch: false,
            switch_dropped: AtomicBool::new(false),
            departed: None,
            _slot: slot,
        };
        stream.expect_head(limits, true);
        stream
    }

    /// A request head is due now: on a fresh connection (`fresh`) or after a response.
    fn expect_head(&mut self, limits: &LimitsConfig, fresh: bool) {
        let now = Instant::now();
        self.header_timeout = limits.header_timeout;
        self.max_head = limits.max_request_head;
        let idle = if fresh { limits.idle_timeout.min(limits.header_timeout) } else { limits.idle_timeout };
        self.deadline = now + idle;
        self.allowance = Allowance::All;
        *self.held.get_mut() = false;
        self.declared = Body::Length(0);
        self.switch = false;
        *self.switch_dropped.get_mut() = false;
        self.phase = Phase::Head { held: Vec::new(), end: HeadEnd::default(), first_byte: false, fresh, started: now };
    }

    /// Counted when the limit strikes: a refused head at its 431, a deadline here.
    fn close(&mut self, why: Closed) -> io::Error {
        self.phase = Phase::Closed;
        let kind = match why {
            Closed::HeadTooLarge => io::ErrorKind::InvalidData,
            Closed::IdleTimeout | Closed::HeaderTimeout => {
                metrics::CONNECTIONS_CLOSED_TOTAL.with_label_values(&[why.label()]).inc();
                io::ErrorKind::TimedOut
            }
        };
        io::Error::new(kind, why.label())
    }

    /// Ready once `deadline` has passed; otherwise the timer will wake this task then.
    ///
    /// The timer is moved earlier at once but never later: a busy keep-alive connection pushes
    /// its deadline forward with every request, and re-arming a timer per request costs a lock
    /// on the runtime's timer wheel. A timer that fires before the current deadline (once per
    /// `idle_timeout` at most) is simply re-armed then.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.timer.deadline() > self.deadline {
                self.timer.as_mut().reset(self.deadline);
            }
            ready!(self.timer.as_mut().poll(cx));
            if Instant::now() >= self.deadline {
                return Poll::Ready(());
            }
            self.timer.as_mut().reset(self.deadline);
        }
    }

    /// The next request head and whatever came with it (`None`: the client closed first), read
    /// through the head phase's deadlines and size limit into a per-thread buffer and kept in one
    /// allocation of its own size (see [`Guarded`]).
    async fn read_head(&mut self) -> io::Result<Option<BytesMut>> {
        let mut head = BytesMut::new();
        std::future::poll_fn(|cx| self.poll_next_head(cx, &mut head)).await?;
        Ok((!head.is_empty()).then_some(head))
    }

    fn poll_next_head(&mut self, cx: &mut Context<'_>, head: &mut BytesMut) -> Poll<io::Result<()>> {
        READ_BUFFER.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            loop {
                let mut buf = ReadBuf::new(&mut scratch[..]);
                ready!(self.poll_phase(cx, &mut buf))?;
                if buf.filled().is_empty() {
                    return Poll::Ready(Ok(()));
                }
                head.extend_from_slice(buf.filled());
                // A head gathered over several reads is released in pieces of the buffer's size.
                if matches!(self.phase, Phase::Serving) {
                    return Poll::Ready(Ok(()));
                }
            }
        })
    }

    /// Reading while a head is due. Returns only with the whole head (or nothing, or an error).
    fn poll_head(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let Phase::Head { first_byte, .. } = &self.phase else { return self.poll_phase(cx, buf) };
            let why = if *first_byte { Closed::HeaderTimeout } else { Closed::IdleTimeout };
            let before = buf.filled().len();
            if !self.unread.is_empty() {
                self.take_unread(buf);
            } else if let Some(departed) = self.departed {
                // The client left during the last request: nothing more comes (an empty read).
                if let Departed::Failed(kind) = departed {
                    return Poll::Ready(Err(kind.into()));
                }
            } else {
                match Pin::new(&mut self.inner).poll_read(cx, buf) {
                    Poll::Pending => {
                        ready!(self.poll_deadline(cx));
                        return Poll::Ready(Err(self.close(why)));
                    }
                    Poll::Ready(result) => result?,
                }
            }
            if Instant::now() >= self.deadline {
                // Bytes that keep coming (a trickle) do not move the deadline.
                buf.set_filled(before);
                return Poll::Ready(Err(self.close(why)));
            }
            let Phase::Head { held, end, first_byte, fresh, started } = &mut self.phase else { unreachable!() };
            let new = &buf.filled()[before..];
            if new.is_empty() {
                // The client closed: pingora sees a connection that went away without a request.
                held.clear();
                return Poll::Ready(Ok(()));
            }
            if !*first_byte {
                *first_byte = true;
                // From the first byte the head has header_timeout (a fresh connection's is
                // counted from the accept).
                let from = if *fresh { *started } else { Instant::now() };
                self.deadline = from + self.header_timeout;
            }
            let done = end.feed(new);
            let head_len = held.len() + done.unwrap_or(new.len());
            if head_len > self.max_head {
                buf.set_filled(before);
                metrics::CONNECTIONS_CLOSED_TOTAL.with_label_values(&[Closed::HeadTooLarge.label()]).inc();
                self.phase = Phase::Refusing { response: too_large_response(), at: 0 };
                return self.poll_phase(cx, buf);
            }
            // The head ends inside this read: what follows it is kept for after it.
            let new = match done {
                Some(end) if end < new.len() => {
                    let after = new[end..].to_vec();
                    self.unread.splice(0..0, after);
                    buf.set_filled(before + end);
                    &buf.filled()[before..]
                }
                _ => new,
            };
            match done {
                // The usual case: the whole head in one read, passed on as it is.
                Some(_) if held.is_empty() => {
                    self.phase = Phase::Serving;
                    return Poll::Ready(Ok(()));
                }
                Some(_) => {
                    held.extend_from_slice(new);
                    buf.set_filled(before);
                    let bytes = std::mem::take(held);
                    self.phase = Phase::Release { bytes, at: 0 };
                    return self.poll_phase(cx, buf);
                }
                None => {
                    held.extend_from_slice(new);
                    buf.set_filled(before);
                }
            }
        }
    }

    fn poll_phase(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            match &mut self.phase {
                Phase::Head { .. } => return self.poll_head(cx, buf),
                Phase::Serving => return self.poll_serving(cx, buf),
                Phase::Release { bytes, at } => {
                    let n = (bytes.len() - *at).min(buf.remaining());
                    buf.put_slice(&bytes[*at..*at + n]);
                    *at += n;
                    if *at == bytes.len() {
                        self.phase = Phase::Serving;
                    }
                    return Poll::Ready(Ok(()));
                }
                Phase::Refusing { response, at } => {
                    ready!(Self::poll_drain(&mut self.inner, &mut self.pending, cx))?;
                    while *at < response.len() {
                        match ready!(Pin::new(&mut self.inner).poll_write(cx, &response[*at..])) {
                            Ok(0) | Err(_) => return Poll::Ready(Err(self.close(Closed::HeadTooLarge))),
                            Ok(n) => *at += n,
                        }
                    }
                    if ready!(Pin::new(&mut self.inner).poll_flush(cx)).is_err()
                        || ready!(Pin::new(&mut self.inner).poll_shutdown(cx)).is_err()
                    {
                        return Poll::Ready(Err(self.close(Closed::HeadTooLarge)));
                    }
                    self.deadline = Instant::now() + LINGER;
                    self.phase = Phase::Lingering;
                }
                Phase::Lingering => {
                    if self.poll_deadline(cx).is_ready() {
                        return Poll::Ready(Err(self.close(Closed::HeadTooLarge)));
                    }
                    // Read into the caller's buffer and drop it: no memory of ours.
                    let before = buf.filled().len();
                    let read = ready!(Pin::new(&mut self.inner).poll_read(cx, buf));
                    let got = buf.filled().len() - before;
                    buf.set_filled(before);
                    if read.is_err() || got == 0 || buf.remaining() == 0 {
                        return Poll::Ready(Err(self.close(Closed::HeadTooLarge)));
                    }
                }
                Phase::Closed => return Poll::Ready(Err(io::Error::from(io::ErrorKind::NotConnected))),
            }
        }
    }
}

impl LimitedStream {
    /// pingora's reads while it serves a request: the body the head declared, from what the
    /// client sent ahead first, then nothing (see `allowance`).
    fn poll_serving(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.switch && *self.switch_dropped.get_mut() {
            // Forwarded without its Upgrade: a request like any other, its body as declared.
            self.switch = false;
            self.allowance = self.declared.into();
        }
        match self.allowance {
            Allowance::Length(0) => self.poll_after_request(cx),
            Allowance::Length(left) => {
                let mut body = ReadBuf::new(buf.initialize_unfilled_to(left.min(buf.remaining())));
                ready!(self.poll_body(cx, &mut body))?;
                let taken = body.filled().len();
                buf.advance(taken);
                self.allowance = Allowance::Length(left - taken);
                Poll::Ready(Ok(()))
            }
            Allowance::Chunked(mut end) => {
                let before = buf.filled().len();
                ready!(self.poll_body(cx, buf))?;
                self.allowance = match end.feed(&buf.filled()[before..]) {
                    Fed::More => Allowance::Chunked(end),
                    Fed::End(at) => {
                        // What came with the body's end is the next request's.
                        let after = buf.filled()[before + at..].to_vec();
                        self.unread.splice(0..0, after);
                        buf.set_filled(before + at);
                        Allowance::Length(0)
                    }
                    Fed::Lost => Allowance::All,
                };
                Poll::Ready(Ok(()))
            }
            Allowance::All if !self.unread.is_empty() => {
                self.take_unread(buf);
                Poll::Ready(Ok(()))
            }
            Allowance::All if self.departed.is_some() => Poll::Pending,
            Allowance::All => {
                let before = buf.filled().len();
                let read = ready!(Pin::new(&mut self.inner).poll_read(cx, buf));
                if !self.held.load(Ordering::Relaxed) {
                    return Poll::Ready(read);
                }
                // A body whose end only pingora knows: a held request's client that leaves is
                // kept from pingora as past the end (a body cut short then waits for pingora's
                // body timeout, and its request is refused as any unfinished body).
                match read {
                    Ok(()) if buf.filled().len() > before => Poll::Ready(Ok(())),
                    Ok(()) => self.depart(Departed::Closed),
                    Err(e) => self.depart(Departed::Failed(e.kind())),
                }
            }
        }
    }

    /// Body bytes for pingora, what the client sent ahead first. A body cut short (an empty read)
    /// is pingora's to refuse: no whole request reached the upstream.
    fn poll_body(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.unread.is_empty() {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        } else {
            self.take_unread(buf);
            Poll::Ready(Ok(()))
        }
    }

    /// pingora's look at the connection once the whole request is its own, while it waits for the
    /// upstream's answer. What the client sends now is its next request: kept in `unread` (up to
    /// `max_request_head`, then left in the socket) for the loop, and pingora waits, woken by the
    /// answer. A client that closes or resets the connection is pingora's to see, which then
    /// gives up the request as nginx does; a held request's is kept for after the answer.
    fn poll_after_request(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut scratch = [0u8; 2048];
        while self.departed.is_none() && self.unread.len() < self.max_head {
            let mut read = ReadBuf::new(&mut scratch);
            let result = ready!(Pin::new(&mut self.inner).poll_read(cx, &mut read));
            let held = self.held.load(Ordering::Relaxed);
            match result {
                Ok(()) if !read.filled().is_empty() => self.unread.extend_from_slice(read.filled()),
                Ok(()) if held => return self.depart(Departed::Closed),
                Err(e) if held => return self.depart(Departed::Failed(e.kind())),
                other => return Poll::Ready(other),
            }
        }
        Poll::Pending
    }

    /// Keeps a held request's client leaving from pingora: its read waits for the answer.
    fn depart(&mut self, how: Departed) -> Poll<io::Result<()>> {
        self.departed = Some(how);
        Poll::Pending
    }

    /// Moves what `buf` has room for from the front of `unread` into it.
    fn take_unread(&mut self, buf: &mut ReadBuf<'_>) {
        let n = self.unread.len().min(buf.remaining());
        buf.put_slice(&self.unread[..n]);
        self.unread.drain(..n);
        if self.unread.is_empty() {
            self.unread = Vec::new();
        }
    }

    /// Whether a client's bytes wait here, taken off the socket during an earlier request.
    fn has_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    /// The head about to go to pingora frames what follows it as `framing`: the one decision
    /// every reader of this request obeys (see [`crate::http1`]).
    fn hand_over(&mut self, framing: Framing) {
        self.declared = framing.body;
        self.switch = framing.switch;
        self.allowance = if framing.switch { Allowance::All } else { framing.body.into() };
    }
}

impl Unread for LimitedStream {
    fn unread(&mut self, bytes: &[u8]) {
        self.unread.splice(0..0, bytes.iter().copied());
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_phase(cx, buf)
    }
}

/// Writes smaller than this are gathered until the flush, so a response's head and a small body
/// leave in one send; pingora's own L4 write buffer (off on `listen`, see `crate::server`) has
/// this size and the same rule.
const GATHER_BELOW: usize = 1460;

impl LimitedStream {
    /// Sends what `pending` holds, then frees it: an idle connection keeps no write buffer.
    fn poll_drain(inner: &mut Stream, pending: &mut Vec<u8>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !pending.is_empty() {
            match ready!(Pin::new(&mut *inner).poll_write(cx, pending)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => drop(pending.drain(..n)),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        *pending = Vec::new();
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for LimitedStream {
    /// pingora's buffered writer's rule, with a buffer that exists only while a response is being
    /// written: small writes are gathered, a large one first sends what was gathered and then
    /// goes straight to the socket.
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.len() + buf.len() > GATHER_BELOW {
            ready!(Self::poll_drain(&mut this.inner, &mut this.pending, cx))?;
        }
        if buf.len() >= GATHER_BELOW {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        if this.pending.capacity() == 0 {
            // Once a response, at the size it can reach: no growing copies.
            this.pending.reserve_exact(GATHER_BELOW);
        }
        this.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Self::poll_drain(&mut this.inner, &mut this.pending, cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Self::poll_drain(&mut this.inner, &mut this.pending, cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for LimitedStream {
    async fn shutdown(&mut self) {
        let (inner, pending) = (&mut self.inner, &mut self.pending);
        // Whatever was gathered goes out before the close; a failed send has nothing left to save.
        let _ = std::future::poll_fn(|cx| Self::poll_drain(inner, pending, cx)).await;
        self.inner.shutdown().await
    }
}

impl UniqueID for LimitedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for LimitedStream {
    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for LimitedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for LimitedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for LimitedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for LimitedStream {
    // pingora peeks only for an h2c preface, which `listen` does not serve; a peek would bypass
    // the head deadline, so there is none.
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    fn limits(header_ms: u64, idle_ms: u64, max_head: usize) -> LimitsConfig {
        LimitsConfig {
            header_timeout: Duration::from_millis(header_ms),
            idle_timeout: Duration::from_millis(idle_ms),
            max_connections: 10,
            max_connections_per_address: 0,
            upstream_timeout: Duration::from_secs(30),
            max_request_head: max_head,
        }
    }

    /// A limited stream as pingora would read it, and the client's end of its socket.
    fn connection(limits: &LimitsConfig) -> (LimitedStream, DuplexStream) {
        let state = Process::new(Config::parse("upstream: 127.0.0.1:1").unwrap()).unwrap();
        let slot = Connections::new(state).take(None).unwrap();
        let (server, client) = tokio::io::duplex(64 * 1024);
        (LimitedStream::new(Box::new(server), slot, limits), client)
    }

    #[test]
    fn each_address_has_its_own_count_and_leaves_the_map_with_its_last_connection() {
        let yaml = "upstream: 127.0.0.1:1\nlimits: {max_connections: 4, max_connections_per_address: 2}";
        let connections = Connections::new(Process::new(Config::parse(yaml).unwrap()).unwrap());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert_eq!(peer_ip(&"[::ffff:10.0.0.1]:443".parse().unwrap()), a, "one client whichever way listen is bound");
        let a1 = connections.take(Some(a)).unwrap();
        let a2 = connections.take(Some(peer_ip(&"[::ffff:10.0.0.1]:443".parse().unwrap()))).unwrap();
        assert_eq!(connections.refuses(Some(a)), Some(Refused::PerAddress));
        assert_eq!(connections.take(Some(a)).err(), Some(Refused::PerAddress));
        assert_eq!(connections.open(), 2, "a refused connection gives its slot back");
        assert_eq!(connections.refuses(Some(b)), None, "another address is not touched");
        let b1 = connections.take(Some(b)).unwrap();
        let unknown = connections.take(None).unwrap();
        assert_eq!(connections.take(Some(b)).err(), Some(Refused::Total), "max_connections still holds");
        drop(a1);
        let a3 = connections.take(Some(a)).unwrap();
        assert_eq!(connections.by_address().get(&a), Some(&2));
        drop((a2, a3, b1, unknown));
        assert!(connections.by_address().is_empty(), "{:?}", connections.by_address());
        assert_eq!(connections.open(), 0);
    }

    #[tokio::test]
    async fn a_split_head_is_handed_on_whole_and_only_once_complete() {
        let (mut s, mut client) = connection(&limits(5000, 5000, 1024));
        let mut buf = [0u8; 4096];
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        // Cancelled while the head is incomplete: nothing is lost, nothing handed on.
        assert!(tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await.is_err());
        client.write_all(b"Host: a\r\n\r\nBODY").await.unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(matches!(s.phase, Phase::Serving));
        // What came after the head is read next, not lost.
        let n = s.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"BODY");
    }

    #[tokio::test]
    async fn pingora_reads_of_a_next_request_wait_for_the_loop() {
        let (mut s, mut client) = connection(&limits(5000, 5000, 1024));
        let mut buf = [0u8; 4096];
        client.write_all(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}GET /next HTTP/1.1\r\n\r\n").await.unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].ends_with(b"\r\n\r\n"), "the head alone");
        s.hand_over(Framing { body: Body::Length(2), switch: false });
        let n = s.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"{}", "the declared body");
        assert!(tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await.is_err(), "the next request waits");
        // The loop's next head.
        s.expect_head(&limits(5000, 5000, 1024), false);
        let n = s.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET /next HTTP/1.1\r\n\r\n");
    }

    #[tokio::test]
    async fn a_responses_small_writes_leave_together_at_the_flush_and_keep_no_buffer() {
        let (mut s, mut client) = connection(&limits(5000, 5000, 1024));
        let mut buf = vec![0u8; 8192];
        s.write_all(&[b'h'; 200]).await.unwrap();
        s.write_all(&[b'b'; 300]).await.unwrap();
        // A duplex write is readable at once, so one poll shows nothing was sent.
        assert_eq!(s.pending.len(), 500);
        assert!(tokio::time::timeout(Duration::ZERO, client.read(&mut buf)).await.is_err(), "sent before the flush");
        s.flush().await.unwrap();
        let n = client.read(&mut buf).await.unwrap();
        assert_eq!((n, &buf[..200], &buf[200..500]), (500, &[b'h'; 200][..], &[b'b'; 300][..]), "one send, in order");
        assert_eq!(s.pending.capacity(), 0, "a flushed connection holds no write buffer");

        // A large write sends what was gathered first, then goes out itself, in order.
        s.write_all(&[b'h'; 100]).await.unwrap();
        s.write_all(&[b'B'; 3000]).await.unwrap();
        let mut got = Vec::new();
        while got.len() < 3100 {
            let n = client.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!((&got[..100], &got[100..]), (&[b'h'; 100][..], &[b'B'; 3000][..]));
        assert!(s.pending.is_empty());

        // A close sends what was gathered (dropped unsent, it would be lost with the stream).
        s.write_all(b"tail").await.unwrap();
        Shutdown::shutdown(&mut s).await;
        drop(s);
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"tail");
    }

    /// `app` behind the connection loop, with no early answers.
    fn guarded<A: HttpServerApp + Send + Sync + 'static>(app: A) -> Arc<Guarded<A>> {
        let state = Process::new(Config::parse("upstream: 127.0.0.1:1").unwrap()).unwrap();
        Arc::new(Guarded::new(app, Connections::new(state), None::<NoEarly>))
    }

    /// An app that serves nothing: only the loop around it is measured.
    struct Nothing;

    #[async_trait]
    impl HttpServerApp for Nothing {
        async fn process_new_http(self: &Arc<Self>, _: ServerSession, _: &ShutdownWatch) -> Option<ReusedHttpStream> {
            None
        }
    }

    /// Every idle connection holds the connection loop's future (BENCHMARKS.md, "Memory per
    /// connection"). With pingora's session built inside the loop it was 912 bytes; built in
    /// `serve`, the loop keeps only the wait for the next head. The bound leaves room for
    /// compilers, not for a session (over 400 bytes) coming back.
    #[tokio::test]
    async fn an_idle_connections_loop_state_stays_small() {
        let guarded = guarded(Nothing);
        let (server, _client) = tokio::io::duplex(1024);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let connection = ServerApp::process_new(&guarded, Box::new(server), &shutdown);
        let size = std::mem::size_of_val(&*connection);
        assert!(size <= 512, "the connection loop's state is {size} bytes");
    }

    /// An app that answers every request with an empty 204 and counts them.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    #[async_trait]
    impl HttpServerApp for Counting {
        async fn process_new_http(self: &Arc<Self>, mut session: ServerSession, _: &ShutdownWatch) -> Option<ReusedHttpStream> {
            if !session.read_request().await.ok()? {
                return None;
            }
            self.0.fetch_add(1, Ordering::SeqCst);
            let answer = pingora::http::ResponseHeader::build(204, None).ok()?;
            session.write_response_header(Box::new(answer)).await.ok()?;
            let settings = HttpPersistentSettings::for_session(&session);
            let reusable = session.finish().await.ok()??;
            Some(ReusedHttpStream::from_reusable_stream(reusable, settings))
        }
    }

    /// The client's bytes until the server closes, or what came within 5 s.
    async fn until_closed(client: &mut DuplexStream) -> String {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut got)).await;
        String::from_utf8_lossy(&got).into_owned()
    }

    /// The stop and the next head of an idle keep-alive connection arrive together (on a busy
    /// machine the stop's wake-up can wait for a thread while the head reaches the socket): the
    /// connection is closed unanswered, as nginx closes its idle keep-alive connections. The
    /// test's runtime has one thread, so the loop first runs again with both already there.
    #[tokio::test]
    async fn a_stopping_server_closes_an_idle_keep_alive_connection_whose_head_came_with_the_stop() {
        let guarded = guarded(Counting::default());
        let (server, mut client) = tokio::io::duplex(4096);
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let loop_ = guarded.clone();
        let connection = tokio::spawn(async move { loop_.process_new(Box::new(server), &shutdown).await });

        client.write_all(b"GET /a HTTP/1.1\r\nHost: shop\r\n\r\n").await.unwrap();
        let mut first = [0u8; 256];
        let n = client.read(&mut first).await.unwrap();
        assert!(first[..n].starts_with(b"HTTP/1.1 204"), "{:?}", String::from_utf8_lossy(&first[..n]));

        stop.send(true).unwrap();
        client.write_all(b"GET /b HTTP/1.1\r\nHost: shop\r\n\r\n").await.unwrap();
        assert_eq!(until_closed(&mut client).await, "", "the head that came with the stop was answered");
        assert!(connection.await.unwrap().is_none());
        assert_eq!(guarded.app.0.load(Ordering::SeqCst), 1, "only the request before the stop was served");
    }

    /// A connection accepted before the stop is served its first head even when the stop came
    /// first: that request is in flight. It is then closed.
    #[tokio::test]
    async fn a_stopping_server_serves_a_fresh_connections_first_head() {
        let guarded = guarded(Counting::default());
        let (server, mut client) = tokio::io::duplex(4096);
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        client.write_all(b"GET /a HTTP/1.1\r\nHost: shop\r\n\r\n").await.unwrap();
        stop.send(true).unwrap();
        let answer = tokio::join!(guarded.process_new(Box::new(server), &shutdown), until_closed(&mut client)).1;
        assert!(answer.starts_with("HTTP/1.1 204"), "{answer:?}");
        assert_eq!(guarded.app.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_silent_connection_fails_its_read_at_the_idle_deadline() {
        let (mut s, _client) = connection(&limits(5000, 200, 1024));
        let started = Instant::now();
        let error = s.read(&mut [0u8; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_keep_alive_head_has_header_timeout_from_its_first_byte() {
        let l = limits(300, 5000, 1024);
        let (mut s, mut client) = connection(&l);
        let mut buf = [0u8; 256];
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 18);
        s.expect_head(&l, false);
        // Idle for longer than header_timeout is fine (idle_timeout rules until a byte comes).
        assert!(tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await.is_err());
        client.write_all(b"G").await.unwrap();
        let first_byte = Instant::now();
        let error = s.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(first_byte.elapsed() >= Duration::from_millis(290), "{:?}", first_byte.elapsed());
    }

    #[tokio::test]
    async fn a_head_over_the_limit_gets_431_and_nothing_of_it_reaches_the_reader() {
        let (mut s, mut client) = connection(&limits(5000, 5000, 1024));
        // Exactly the limit passes.
        let fits = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(1024 - 23));
        assert_eq!(fits.len(), 1024);
        client.write_all(fits.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        assert_eq!(s.read(&mut buf).await.unwrap(), 1024);

        s.expect_head(&limits(5000, 5000, 1024), false);
        client.write_all(&[b'a'; 1500]).await.unwrap();
        let server = s.read(&mut buf);
        let client_side = async {
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            AsyncWriteExt::shutdown(&mut client).await.unwrap(); // ends the linger at once
            answer
        };
        let (read, answer) = tokio::join!(server, client_side);
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(answer, too_large_response());
    }
}
