//! The connection loop on `listen`: every accepted connection's keep-alive loop, and the limits it
//! lives under before any request reaches [`crate::proxy`] (contract section 16, connections under
//! attack). Slots are counted in [`slots`]; the stream each connection is wrapped in is [`stream`].
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

mod slots;
mod stream;

pub use slots::{AtCapacity, Connections};
use slots::{peer_ip, refused, Slot};
pub use stream::{declared_body, forwarding, hold_client, Delimited, LimitedStream};

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
    /// wait (the head stage moves an unfinished head into its own `held`).
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
    /// Takes the connection's slot and hands the connection to a task of its own
    /// ([`Guarded::keep_alive`]). pingora's accept loop spawns one task a connection whose state
    /// keeps room for the accepted socket and its handshake under a 60 s timer (about 2 kB,
    /// BENCHMARKS.md, "Memory per connection"), dead once the handshake is done but held as long
    /// as this call runs: returning at once frees it, and an idle connection holds only the
    /// small task below. One more spawn a connection, none a request.
    async fn process_new(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let peer = stream.get_socket_digest().and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(peer_ip));
        let slot = match self.connections.take(peer) {
            Ok(slot) => slot,
            Err(limit) => {
                refused(limit);
                return None; // dropping the stream closes it at once
            }
        };
        let (limited, backstop) = {
            let settings = self.connections.process.settings();
            let limits = &settings.config.limits;
            (Box::new(LimitedStream::new(stream, slot, limits)), backstop_secs(limits))
        };
        tokio::spawn(self.clone().keep_alive(limited, backstop, shutdown.clone()));
        None
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
    /// pingora's HTTP/1 loop (`apps/mod.rs`, `impl ServerApp for T: HttpServerApp`) with the
    /// stream wrapped and told, before every request, that a head is due. h2c and TLS are not
    /// served on `listen`, so the other branches of that loop are not needed here. Its state is
    /// what an idle connection's task holds besides the stream.
    pub(crate) async fn keep_alive(
        self: Arc<Self>,
        mut limited: Box<LimitedStream>,
        backstop: u64,
        shutdown: ShutdownWatch,
    ) -> Option<()> {
        // Boxed: pingora's settings for a reused session are 80 bytes that every idle connection
        // would carry in this loop's state, and only a connection that forwarded a request has them.
        let mut persistent: Option<Box<HttpPersistentSettings>> = None;
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
                    limited = self.answer_early(limited, call, &shutdown).await?;
                    continue;
                }
                Next::Forward(framing) => framing,
                Next::Refuse => {
                    refuse(&mut limited).await;
                    return None;
                }
            };
            limited.hand_over(framing);
            let reused = self.serve(limited, head, persistent, backstop, &shutdown).await?;
            let (next, settings) = reused.consume();
            limited = next.into_any().downcast::<LimitedStream>().ok()?;
            limited.expect_head(&self.connections.process.settings().config.limits, false);
            persistent = settings.map(Box::new);
        }
    }

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
        persistent: Option<Box<HttpPersistentSettings>>,
        backstop: u64,
        shutdown: &'a ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = Option<ReusedHttpStream>> + Send + 'a>> {
        let mut session = ServerSession::new_http1(limited);
        session.set_pipelined_prefix(head);
        match persistent {
            Some(settings) => (*settings).apply_to_session(&mut session),
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

/// Answers a request line that is not plain (never pingora's to repair, see
/// [`head::plain_request_line`]) before the connection is closed. Boxed, as the loop's other
/// awaits are: its write and its timer would otherwise be room in the state every idle
/// connection holds.
fn refuse(limited: &mut LimitedStream) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
    Box::pin(async move {
        tracing::debug!("request line refused");
        let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
            use tokio::io::AsyncWriteExt;
            limited.write_all(&bad_request_line_response()).await?;
            limited.flush().await
        })
        .await;
    })
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

#[cfg(test)]
mod tests;
