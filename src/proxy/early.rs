//! Status and enter calls answered in the connection loop ([`crate::connection::Guarded`], which
//! calls [`Answers`] as its [`Early`] answerer), before
//! pingora's session and its request future exist: the rush's hot paths (a new user entering, a
//! waiting user asking where they stand) and the held polls near the front (contract section 13).
//!
//! **Why.** pingora makes a session and a 9 kB request future for every request and moves it
//! around: a fifth of a status poll's instructions were that `memcpy`, and a held poll kept all of
//! it for the length of its hold (about 20 kB; BENCHMARKS.md). The room's own endpoints read no
//! body and write only answers of ours, so they need none of it.
//!
//! **What takes this path, and why it is safe.** Only a head that pingora would take exactly as
//! we read it: `GET {prefix}/status` or `POST {prefix}/enter` in HTTP/1.1, the whole head (what a
//! pipelining client sent after it waits in the connection for the next head), read once by
//! [`crate::http1::head::read`] (httparse, as pingora parses it) into pingora's own
//! `RequestHeader` and the head's framing,
//! passing pingora's own authority checks, classified by the same [`Endpoint::classify`]; no body
//! (a framing other than no body, a `Content-Length` other than one `0`), no `Upgrade`, `Expect` or
//! `Keep-Alive`, and `Connection` at most `keep-alive`. Anything else goes to pingora unchanged,
//! with the same head bytes, so this path never refuses or changes a request the full path would
//! take otherwise. The call itself is the full path's own ([`status::answer`], whose client is the
//! connection here and pingora's session there; [`enter::handle`], told the connection's peer as
//! pingora would tell it). The response is written from the same fields as the full path's and
//! finished as pingora finishes it (its `Date`, its `Connection`): the same bytes, which
//! `tests/early_answers.rs` compares.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::BufMut;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT};
use http::{HeaderMap, Method, StatusCode, Uri};
use pingora::http::RequestHeader;
use pingora::protocols::http::{authority, date};
use pingora::protocols::GetSocketDigest;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{answer_fields, enter, identity_in, status, Answer, Endpoint, Field};
use crate::http1::head::{self, Framing};
use crate::identity::Refusal;
use crate::connection::{After, LimitedStream, Taken, Unread};
use crate::logging;
use crate::process::{InFlight, Process};
use crate::room::Room;

/// The room's status and enter calls, as the connection loop's early answerer.
pub struct Answers {
    process: Arc<Process>,
}

impl Answers {
    pub fn new(process: Arc<Process>) -> Answers {
        Answers { process }
    }
}

impl crate::connection::Early for Answers {
    type Call = Box<Early>;

    fn take(&self, head: &[u8]) -> Taken<Box<Early>> {
        take(&self.process, head)
    }

    fn serve<'a>(
        &'a self,
        call: Box<Early>,
        conn: &'a mut LimitedStream,
        shutdown: &'a ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = After> + Send + 'a>> {
        call.serve(conn, shutdown)
    }
}

/// A call the connection loop answers, as taken from its head.
pub struct Early {
    /// The room the call is to.
    room: Arc<Room>,
    /// Status or enter.
    endpoint: Endpoint,
    /// The request line's method and target, for the access line: a held poll keeps these, not
    /// its `RequestHeader` (its header map and its copies of the fields, over a kilobyte of heap,
    /// for the hold's whole length). Moved out of the request, so no copy is made.
    method: Method,
    uri: Uri,
    /// An enter's header fields, which its sender's limits read ([`super::sender::Sender`]);
    /// empty, with no allocation, for a status call, which reads none after [`take`].
    headers: HeaderMap,
    /// The user asking, or why no user could be told.
    caller: Result<String, Refusal>,
    started: Instant,
    /// Counts the request for a graceful stop until it is logged.
    _in_flight: InFlight,
}

/// The status or enter call `head` is, when this path may answer it (see the module doc), or the
/// head as read for pingora.
fn take(process: &Arc<Process>, head: &[u8]) -> Taken<Box<Early>> {
    // Every other request pays only this look at its first bytes (per room) before its one read.
    let routes = process.rooms().routes();
    let found = routes.iter().find_map(|route| Some((route, candidate(route.settings.config.endpoints.prefix.as_bytes(), head)?)));
    let Some((route, endpoint)) = found else {
        return Taken::Not(head::read(head, false));
    };
    let room = route.room.clone();
    let config = &route.settings.config;
    let started = Instant::now();
    let mut read = head::read(head, true);
    let Some(request) = read.request.take().filter(|request| read.plain_line && plain(request, read.framing)) else {
        return Taken::Not(read);
    };
    if Endpoint::classify(config, &request).ok() != Some((endpoint, None)) {
        return Taken::Not(read);
    }
    // A room of another host: the full path finds the request's room.
    if route.host.as_deref().is_some_and(|host| !super::route::request_host(&request).is_some_and(|h| h.eq_ignore_ascii_case(host))) {
        return Taken::Not(read);
    }
    room.activity().request();
    let caller = identity_in(config, &request.headers);
    let _in_flight = process.request_started();
    let parts = http::request::Parts::from(request);
    let headers = if endpoint == Endpoint::Enter { parts.headers } else { HeaderMap::new() };
    Taken::Call(Box::new(Early { room, endpoint, method: parts.method, uri: parts.uri, headers, caller, started, _in_flight }))
}

/// The endpoint `head` would call, from its first bytes alone.
fn candidate(prefix: &[u8], head: &[u8]) -> Option<Endpoint> {
    let (endpoint, target) = match head.strip_prefix(b"GET ") {
        Some(target) => (Endpoint::Status, crate::paths::after_prefix(target, prefix)?.strip_prefix(b"/status")?),
        None => (Endpoint::Enter, crate::paths::after_prefix(head.strip_prefix(b"POST ")?, prefix)?.strip_prefix(b"/enter")?),
    };
    matches!(target.first(), Some(b' ' | b'?')).then_some(endpoint)
}

impl Early {
    /// Answers the call (holding the poll when it is one to hold, as the full path does) and
    /// writes the answer to `stream`; what becomes of the connection. Each endpoint's call is
    /// a future of its own type, boxed at its own size: a held poll waits inside its box for as
    /// long as it is held, and one future for both calls would give it the size of an enter's
    /// (its Redis call's state), which it never uses.
    fn serve<'a, S>(self: Box<Self>, stream: &'a mut S, shutdown: &'a ShutdownWatch) -> Pin<Box<dyn Future<Output = After> + Send + 'a>>
    where
        S: AsyncRead + AsyncWrite + GetSocketDigest + Unread + Unpin + Send,
    {
        match self.endpoint {
            Endpoint::Enter => Box::pin(self.enter(stream, shutdown)),
            _ => Box::pin(self.status(stream, shutdown)),
        }
    }

    async fn enter<S>(self: Box<Self>, stream: &mut S, shutdown: &ShutdownWatch) -> After
    where
        S: AsyncRead + AsyncWrite + GetSocketDigest + Unread + Unpin + Send,
    {
        let answer = match &self.caller {
            Err(refusal) => Answer::identity(*refusal),
            Ok(user) => {
                let room = &*self.room;
                // An Arc, not a Guard: the enter waits on Redis with it.
                let settings = room.snapshot();
                let limited = settings.config.abuse.identities_per_address > 0;
                let peer = limited.then(|| peer_ip(stream)).flatten();
                let sender = super::sender::Sender { peer, headers: &self.headers };
                enter::handle(room, &settings, &sender, user).await
            }
        };
        self.finish(Some(answer), stream, shutdown).await
    }

    async fn status<S>(self: Box<Self>, stream: &mut S, shutdown: &ShutdownWatch) -> After
    where
        S: AsyncRead + AsyncWrite + Unread + Unpin + Send,
    {
        let answer = match &self.caller {
            Err(refusal) => Some(Answer::identity(*refusal)),
            // A held poll takes the settings of each reading itself (see `status::answer`).
            Ok(user) => status::answer(&self.room, &mut ClientWatch { stream: &mut *stream }, user).await,
        };
        self.finish(answer, stream, shutdown).await
    }

    /// Writes the answer (`None`: the client left a held poll) and logs the call.
    async fn finish<S>(self: Box<Self>, answer: Option<Answer>, stream: &mut S, shutdown: &ShutdownWatch) -> After
    where
        S: AsyncWrite + Unpin,
    {
        let Some(answer) = answer else {
            self.done(0, Some("the client left a held poll".to_owned()));
            return After::Close;
        };
        // A stopping server keeps no connection open, as pingora's loop does.
        let after = if *shutdown.borrow() { After::Close } else { After::KeepAlive };
        let response = render(&answer, after == After::KeepAlive);
        match write(stream, &response).await {
            Ok(()) => {
                self.done(answer.status, None);
                after
            }
            Err(error) => {
                self.done(0, Some(error.to_string()));
                After::Close
            }
        }
    }

    /// Counts and logs the request once it is over, as the full path's `logging` phase does.
    fn done(self: Box<Self>, status: u16, error: Option<String>) {
        let elapsed = self.started.elapsed();
        let endpoint = self.endpoint.label();
        // What tells an operator (and the tests) which path a call took.
        tracing::debug!(endpoint, status, "answered before pingora's session");
        self.room.metrics().requests.request_duration.with(endpoint, |duration| duration.observe(elapsed.as_secs_f64()));
        logging::access(&logging::Access {
            method: self.method.as_str(),
            path: self.uri.path(),
            status,
            endpoint,
            duration: elapsed,
            user: self.caller.as_deref().unwrap_or("-"),
            error,
        });
    }
}

/// The connection as the client of a held poll: a byte read off it ends the watch and is handed
/// back, the first of the client's next request (a pipelining client sends it before the
/// answer), which the connection reads once the answer is out; the end of the stream, or an
/// error, is the client leaving.
struct ClientWatch<'s, S> {
    stream: &'s mut S,
}

impl<S: AsyncRead + Unread + Unpin + Send> status::Client for ClientWatch<'_, S> {
    async fn watch(&mut self) -> status::Watched {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte).await {
            Ok(0) | Err(_) => status::Watched::Left,
            Ok(_) => {
                self.stream.unread(&byte);
                status::Watched::Spoke
            }
        }
    }
}

/// The connection's peer, as pingora's session tells it (`Session::client_addr`).
fn peer_ip(stream: &impl GetSocketDigest) -> Option<IpAddr> {
    let digest = stream.get_socket_digest()?;
    digest.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip())
}

/// Writes `response` whole, bounded as pingora bounds the writes of its own answers.
async fn write<S: AsyncWrite + Unpin>(stream: &mut S, response: &[u8]) -> io::Result<()> {
    let mut write = std::pin::pin!(async {
        stream.write_all(response).await?;
        stream.flush().await
    });
    // An answer is small and the socket's buffer nearly always takes it at once: the timer is
    // armed only for a client that is not reading.
    match std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await {
        Poll::Ready(written) => written,
        Poll::Pending => match tokio::time::timeout(crate::connection::WRITE_TIMEOUT, write).await {
            Ok(written) => written,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "the client did not read the answer in time")),
        },
    }
}

/// Whether a request read as `request`, framed as `framing`, is one the full path would take
/// exactly as this path does: pingora's own authority checks pass, and nothing in it is the full
/// path's to handle (a body, an empty one declared once, as a fetch without a body sends it,
/// being no body; a protocol switch; a continue; keep-alive terms).
fn plain(request: &RequestHeader, framing: Framing) -> bool {
    if framing != Framing::NONE || authority::validate_request_authority(request).is_err() {
        return false;
    }
    let fields = &request.headers;
    let mut lengths = fields.get_all(CONTENT_LENGTH).iter();
    let no_body = match (lengths.next(), lengths.next()) {
        (None, _) => true,
        (Some(length), None) => length == "0",
        (Some(_), Some(_)) => false,
    };
    no_body
        && !fields.contains_key(EXPECT)
        && !fields.contains_key("keep-alive")
        && fields.get_all(CONNECTION).iter().all(|value| value.as_bytes().eq_ignore_ascii_case(b"keep-alive"))
}

/// The response as pingora writes an answer of ours (`write_answer`): the answer's head, then
/// the `Date` and `Connection` pingora adds, in its wire format, then the body.
fn render(answer: &Answer, keep_alive: bool) -> Vec<u8> {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Vec::with_capacity(192 + answer.body.len());
    response.put_slice(b"HTTP/1.1 ");
    response.put_slice(status.as_str().as_bytes());
    response.put_u8(b' ');
    response.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    response.put_slice(b"\r\n");
    let mut line = |name: &str, value: &[u8]| {
        response.put_slice(name.as_bytes());
        response.put_slice(b": ");
        response.put_slice(value);
        response.put_slice(b"\r\n");
    };
    for (name, value) in answer_fields(answer) {
        match value {
            Field::Text(text) => line(name, text.as_bytes()),
            Field::Number(number) => line(name, itoa::Buffer::new().format(number).as_bytes()),
        }
    }
    line("Date", date::get_cached_date().as_bytes());
    line("Connection", if keep_alive { b"keep-alive" } else { b"close" });
    response.put_slice(b"\r\n");
    response.put_slice(&answer.body);
    response
}
