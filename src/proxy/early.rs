//! Status and enter calls answered in the connection loop ([`crate::limits::Guarded`]), before
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
//! pipelining client sent after it waits in the connection for the next head), parsed by
//! httparse as pingora parses it, into pingora's own `RequestHeader`,
//! passing pingora's own authority checks, classified by the same [`Endpoint::classify`]; no body
//! (a `Content-Length` other than one `0`, a `Transfer-Encoding`), no `Upgrade`, `Expect` or
//! `Keep-Alive`, and `Connection` at most `keep-alive`. Anything else goes to pingora as before,
//! with the same head bytes, so this path never refuses or changes a request the full path would
//! take otherwise. The call itself is the full path's own ([`status::handle`], whose client is the
//! connection here and pingora's session there; [`enter::handle`], told the connection's peer as
//! pingora would tell it). The response is written from the same fields as the full path's and
//! finished as pingora finishes it (its `Date`, its `Connection`): the same bytes, which
//! `tests/early_answers.rs` compares.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::{BufMut, Bytes};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderValue, StatusCode, Version};
use pingora::http::{IntoCaseHeaderName, RequestHeader};
use pingora::protocols::http::{authority, date};
use pingora::protocols::GetSocketDigest;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{answer_fields, enter, identity_in, status, Answer, Endpoint, Field};
use crate::identity::Refusal;
use crate::logging;
use crate::metrics;
use crate::state::{InFlight, RoomState};
use crate::store::Room;

/// pingora's own bound on a head's fields: a head with more is pingora's to refuse.
const MAX_HEADERS: usize = 256;

/// A call the connection loop answers, as taken from its head.
pub struct Early {
    /// Status or enter.
    endpoint: Endpoint,
    request: RequestHeader,
    /// The user asking, or why no user could be told.
    caller: Result<String, Refusal>,
    started: Instant,
    /// Counts the request for a graceful stop until it is logged.
    _in_flight: InFlight,
}

/// The status or enter call `head` is, when this path may answer it (see the module doc).
pub fn take(state: &Arc<RoomState>, head: &[u8]) -> Option<Box<Early>> {
    let settings = state.settings();
    let config = &settings.config;
    // Every other request pays only this look at its first bytes.
    let prefix = config.endpoints.prefix.as_bytes();
    let (endpoint, target) = match head.strip_prefix(b"GET ") {
        Some(target) => (Endpoint::Status, target.strip_prefix(prefix)?.strip_prefix(b"/status")?),
        None => (Endpoint::Enter, head.strip_prefix(b"POST ")?.strip_prefix(prefix)?.strip_prefix(b"/enter")?),
    };
    if !matches!(target.first(), Some(b' ' | b'?')) {
        return None;
    }
    let started = Instant::now();
    let request = request_header(head)?;
    if Endpoint::classify(config, &request).ok()? != (endpoint, None) {
        return None;
    }
    let caller = identity_in(config, &request.headers);
    Some(Box::new(Early { endpoint, request, caller, started, _in_flight: state.request_started() }))
}

impl Early {
    /// Answers the call (holding the poll when it is one to hold, as the full path does) and
    /// writes the answer to `stream`; what becomes of the connection.
    pub async fn serve<S>(
        self: Box<Self>,
        state: &RoomState,
        room: &Arc<Room>,
        stream: &mut S,
        shutdown: &ShutdownWatch,
    ) -> After
    where
        S: AsyncRead + AsyncWrite + GetSocketDigest + Unread + Unpin + Send,
    {
        let settings = state.settings();
        let mut client = Watch { stream: &mut *stream };
        let answer = match (&self.caller, self.endpoint) {
            (Err(refusal), _) => Some(Answer::identity(*refusal)),
            (Ok(user), Endpoint::Enter) => {
                let limited = settings.config.abuse.identities_per_address > 0;
                let peer = limited.then(|| peer_ip(client.stream)).flatten();
                let sender = enter::Sender { peer, headers: &self.request.headers };
                Some(enter::handle(state, &settings, room, &sender, user).await)
            }
            (Ok(user), _) => status::handle(state, &settings, room, &mut client, user).await,
        };
        drop(settings);
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
        metrics::REQUEST_DURATION_BY_ENDPOINT.with(endpoint, |duration| duration.observe(elapsed.as_secs_f64()));
        logging::access(&logging::Access {
            method: self.request.method.as_str(),
            path: self.request.uri.path(),
            status,
            endpoint,
            duration: elapsed,
            user: self.caller.as_deref().unwrap_or("-"),
            error,
        });
    }
}

/// What becomes of a connection once its call is over.
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

/// The connection as the client of a held poll: a byte read off it ends the watch and is handed
/// back, the first of the client's next request (a pipelining client sends it before the
/// answer), which the connection reads once the answer is out; the end of the stream, or an
/// error, is the client leaving.
struct Watch<'s, S> {
    stream: &'s mut S,
}

impl<S: AsyncRead + Unread + Unpin + Send> status::Client for Watch<'_, S> {
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
        Poll::Pending => match tokio::time::timeout(super::WRITE_TIMEOUT, write).await {
            Ok(written) => written,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "the client did not read the answer in time")),
        },
    }
}

/// How a request's body is framed, as its head declares it (see [`declared_body`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `Content-Length` bytes (0 without one).
    Length(usize),
    /// `Transfer-Encoding: chunked` alone: the body ends with its last chunk.
    Chunked,
    /// Anything less plain: the connection cannot tell where the body ends.
    Unknown,
}

/// What a head says of what follows it: its body's framing, and whether it asks to switch
/// protocols (`Upgrade`), in which case every byte after the head may be the new protocol's
/// unless the proxy forwards it without its `Upgrade` (contract section 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub body: Body,
    pub switch: bool,
}

impl Framing {
    const NONE: Framing = Framing { body: Body::Length(0), switch: false };

    fn unknown() -> Framing {
        Framing { body: Body::Unknown, switch: false }
    }
}

/// How `head` frames its body, when it says so plainly: one `Content-Length` of digits only, or
/// one `Transfer-Encoding: chunked` and no length. [`Body::Unknown`] otherwise (and for a head
/// with a framing field that httparse cannot read, and for `CONNECT`, a tunnel): the connection
/// then gives pingora every byte it holds, so a framing read differently here than by pingora can
/// never move where the next request starts. An `Upgrade` field is told apart (`switch`).
pub fn declared_body(head: &[u8]) -> Framing {
    // Every forwarded head comes here: most declare nothing, and need no parse to say so.
    if !may_frame(head) {
        return Framing::NONE;
    }
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut fields);
    let Ok(httparse::Status::Complete(_)) = parsed.parse(head) else { return Framing::unknown() };
    if parsed.method == Some("CONNECT") {
        return Framing::unknown();
    }
    let mut framing = Framing::NONE;
    let mut framed = false;
    for field in parsed.headers.iter() {
        let name = field.name;
        let plain = if name.eq_ignore_ascii_case("upgrade") {
            framing.switch = true;
            continue;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            field.value.trim_ascii().eq_ignore_ascii_case(b"chunked").then_some(Body::Chunked)
        } else if name.eq_ignore_ascii_case("content-length") {
            let digits = field.value.trim_ascii();
            let length = (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(digits).ok()?.parse().ok())
                .flatten();
            length.map(Body::Length)
        } else {
            continue;
        };
        // A second framing field, even an equal one, is not plain.
        match plain {
            Some(body) if !framed => {
                framing.body = body;
                framed = true;
            }
            _ => framing.body = Body::Unknown,
        }
    }
    framing
}

/// The answer to a request line that is not exactly `METHOD SP target SP HTTP/1.x` (contract
/// section 12), or `None` for a plain one. pingora repairs such a line (two spaces, a tab, a NUL
/// or a CR before the version) into a target ending in `%20` or `%09`, a path no rule protects,
/// which a backend that trims whitespace routes as the protected one: so it is refused here,
/// before pingora sees it, and the connection is closed (what follows cannot be trusted either).
pub fn bad_request_line(head: &[u8]) -> Option<Vec<u8>> {
    let start = head.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(head.len());
    let rest = &head[start..];
    let line = match memchr::memchr(b'\n', rest) {
        Some(end) => &rest[..end],
        None => rest,
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if plain_request_line(line) {
        return None;
    }
    Some(render(&Answer::error(400, "the request line must be METHOD, one space, the target, one space, HTTP/1.x"), false))
}

fn plain_request_line(line: &[u8]) -> bool {
    let mut parts = line.splitn(3, |&b| b == b' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    // RFC 9110's token characters.
    let tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    !method.is_empty()
        && method.iter().all(tchar)
        && !target.is_empty()
        && target.iter().all(|&b| b > b' ' && b != 0x7f)
        && matches!(version, b"HTTP/1.1" | b"HTTP/1.0")
}

/// Whether `head` may declare a body or a tunnel: it names `CONNECT`, or a line of it starts with
/// a field named `Content-Length`, `Transfer-Encoding` or `Upgrade`, in any case. Every field's
/// name starts a line, right after its line feed (httparse, as pingora runs it, refuses a space
/// before a name or its colon), so a head with none of these declares no body.
fn may_frame(head: &[u8]) -> bool {
    const NAMES: [&[u8]; 3] = [b"content-length:", b"transfer-encoding:", b"upgrade:"];
    head.starts_with(b"CONNECT ")
        || memchr::memchr_iter(b'\n', head).any(|at| {
            let line = &head[at + 1..];
            NAMES.iter().any(|name| line.get(..name.len()).is_some_and(|start| start.eq_ignore_ascii_case(name)))
        })
}

/// pingora's `RequestHeader` for `head`, as pingora builds it (`HttpSession::read_request`), if
/// the head is one this path takes; without the names' case, which only a forwarded request needs.
fn request_header(head: &[u8]) -> Option<RequestHeader> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut fields);
    match parsed.parse(head) {
        // The connection loop hands over the head alone (bytes after it wait for it there).
        Ok(httparse::Status::Complete(len)) if len == head.len() => {}
        _ => return None,
    }
    if parsed.version != Some(1) {
        return None;
    }
    let size = Some(parsed.headers.len());
    let mut request = RequestHeader::build_no_case(parsed.method?, parsed.path?.as_bytes(), size).ok()?;
    request.set_version(Version::HTTP_11);
    for field in parsed.headers.iter() {
        let name = Bytes::copy_from_slice(field.name.as_bytes()).into_case_header_name();
        let value = HeaderValue::from_bytes(field.value).ok()?;
        request.append_header(name, value).ok()?;
    }
    authority::validate_request_authority(&request).ok()?;
    let fields = &request.headers;
    // A body (an empty one declared once, as a fetch without a body sends it, is no body), a
    // protocol switch, a continue, and keep-alive terms are the full path's to handle.
    let mut lengths = fields.get_all(CONTENT_LENGTH).iter();
    let no_body = match (lengths.next(), lengths.next()) {
        (None, _) => true,
        (Some(length), None) => length == "0",
        (Some(_), Some(_)) => false,
    };
    if !no_body
        || [TRANSFER_ENCODING, UPGRADE, EXPECT].iter().any(|name| fields.contains_key(name))
        || fields.contains_key("keep-alive")
        || !fields.get_all(CONNECTION).iter().all(|value| value.as_bytes().eq_ignore_ascii_case(b"keep-alive"))
    {
        return None;
    }
    Some(request)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_framing_is_a_declared_body() {
        let head = |fields: &str| format!("POST /x HTTP/1.1\r\nHost: a\r\n{fields}\r\n");
        let declared_body = |head: &[u8]| {
            let framing = super::declared_body(head);
            if framing.switch {
                Body::Unknown
            } else {
                framing.body
            }
        };
        assert_eq!(declared_body(head("").as_bytes()), Body::Length(0));
        assert_eq!(declared_body(head("Content-Length: 12\r\n").as_bytes()), Body::Length(12));
        assert_eq!(declared_body(head("content-length:  7 \r\n").as_bytes()), Body::Length(7));
        assert_eq!(declared_body(head("Transfer-Encoding: chunked\r\n").as_bytes()), Body::Chunked);
        assert_eq!(declared_body(head("transfer-encoding: Chunked \r\n").as_bytes()), Body::Chunked);
        for unclear in [
            "Content-Length: +5\r\n",
            "Content-Length: 5, 5\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: \r\n",
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "Content-Length: 99999999999999999999999\r\n",
            "Upgrade: websocket\r\nConnection: upgrade\r\n",
            "upgrade: h2c\r\n",
        ] {
            assert_eq!(declared_body(head(unclear).as_bytes()), Body::Unknown, "{unclear:?}");
        }
        assert_eq!(declared_body(b"CONNECT shop:443 HTTP/1.1\r\nHost: shop:443\r\n\r\n"), Body::Unknown);
        // Names only like a framing field's, and framing words elsewhere, frame nothing.
        let lookalikes = "Content-Length-Hint: 5\r\nX-Upgrade: h2c\r\nCookie: content-length:5\r\n";
        assert_eq!(declared_body(head(lookalikes).as_bytes()), Body::Length(0));
        assert_eq!(declared_body(b"GET /x HTTP/1.1\nhost: a\ncontent-length: 3\n\n"), Body::Length(3));
        // A head httparse cannot read, whatever pingora then makes of it.
        assert_eq!(declared_body(b"not a head\r\nContent-Length: 5\r\n\r\n"), Body::Unknown);
    }

    #[test]
    fn a_switch_keeps_the_framing_it_would_have_without_it() {
        let framing = super::declared_body(b"POST /o HTTP/1.1\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\n");
        assert_eq!(framing, Framing { body: Body::Length(2), switch: true });
        let framing = super::declared_body(b"GET /ws HTTP/1.1\r\nupgrade: websocket\r\nConnection: upgrade\r\n\r\n");
        assert_eq!(framing, Framing { body: Body::Length(0), switch: true });
        let framing =
            super::declared_body(b"POST /o HTTP/1.1\r\nUpgrade: h2c\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!(framing, Framing { body: Body::Unknown, switch: true });
    }

    #[test]
    fn only_a_plain_request_line_passes() {
        for plain in [
            "POST /api/orders HTTP/1.1\r\nHost: a\r\n\r\n",
            "\r\nGET /x?y=1 HTTP/1.0\r\n\r\n",
            "GET http://a/b HTTP/1.1\nHost: a\n\n",
            "OPTIONS * HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(bad_request_line(plain.as_bytes()), None, "{plain:?}");
        }
        for repaired in [
            "POST /api/orders  HTTP/1.1\r\n\r\n",
            "POST /api/orders\tHTTP/1.1\r\n\r\n",
            "POST /api/orders\t HTTP/1.1\r\n\r\n",
            "POST /api/orders\x0b HTTP/1.1\r\n\r\n",
            "POST /api/orders\0 HTTP/1.1\r\n\r\n",
            "POST /api/orders\r HTTP/1.1\r\n\r\n",
            "POST  /api/orders HTTP/1.1\r\n\r\n",
            "POST /api/orders HTTP/1.1 \r\n\r\n",
            "POST /api/orders HTTP/2.0\r\n\r\n",
            "POST /api/orders\r\n\r\n",
            " POST /api/orders HTTP/1.1\r\n\r\n",
            "POST /api/ord ers HTTP/1.1\r\n\r\n",
        ] {
            let answer = bad_request_line(repaired.as_bytes()).expect(repaired);
            let answer = String::from_utf8(answer).unwrap();
            assert!(answer.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{answer}");
            assert!(answer.contains("Connection: close\r\n"), "{answer}");
        }
    }
}
