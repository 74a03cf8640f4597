//! Status polls answered in the connection loop ([`crate::limits::Guarded`]), before pingora's
//! session and its request future exist: the rush's hot path, a waiting user asking where they
//! stand, told from this proxy's view of the line.
//!
//! **Why.** pingora makes a session and a 9 kB request future for every request and moves it
//! around (a fifth of a status's instructions were that `memcpy`, BENCHMARKS.md). An answer the
//! proxy writes itself from memory needs none of it.
//!
//! **What takes this path, and why it is safe.** Only a head that pingora would take exactly as
//! we read it, and whose answer needs neither Redis, nor a hold, nor a body: `GET
//! {prefix}/status` in HTTP/1.1, the whole head and nothing after it, parsed by httparse as
//! pingora parses it, into pingora's own `RequestHeader`, passing pingora's own authority checks;
//! no `Content-Length`, `Transfer-Encoding`, `Upgrade`, `Expect` or `Keep-Alive`, and `Connection`
//! at most `keep-alive`. Anything else, or a user the line does not know, goes to pingora as
//! before, with the same head bytes: this path can only answer what the full path would have
//! answered, never refuse or change a request. The response is built by the same function as the
//! full path's and finished as pingora finishes it (its `Date`, its `Connection`), so the bytes
//! are the same (`tests/early_status.rs` compares them with the full path's).

use std::io;
use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderValue, StatusCode, Version};
use pingora::http::{IntoCaseHeaderName, RequestHeader};
use pingora::protocols::http::{authority, date};

use super::{answer_fields, identity_in, status, Answer, Endpoint, Field};
use crate::logging;
use crate::metrics;
use crate::state::{InFlight, RoomState};

/// pingora's own bound on a head's fields: a head with more is pingora's to refuse.
const MAX_HEADERS: usize = 256;

/// An answer ready to be written, and what logging it needs once it has been.
pub struct Early {
    response: Vec<u8>,
    keep_alive: bool,
    status: u16,
    request: RequestHeader,
    user: Option<String>,
    started: Instant,
    /// Counts the request for a graceful stop until it is logged.
    _in_flight: InFlight,
}

/// The whole response to `head`, when this path may answer it (see the module doc); `stopping`:
/// the server is stopping, so the connection is closed after the answer, as pingora does.
pub fn answer(state: &Arc<RoomState>, head: &[u8], stopping: bool) -> Option<Box<Early>> {
    let settings = state.settings();
    let config = &settings.config;
    // Every other request pays only this look at its first bytes.
    let target = head.strip_prefix(b"GET ")?.strip_prefix(config.endpoints.prefix.as_bytes())?;
    if !matches!(target.strip_prefix(b"/status")?.first(), Some(b' ' | b'?')) {
        return None;
    }
    let started = Instant::now();
    let request = request_header(head)?;
    if Endpoint::classify(config, &request).ok()? != (Endpoint::Status, None) {
        return None;
    }
    let (user, answer) = match identity_in(config, &request.headers) {
        Ok(user) => {
            let answer = status::answer_at_once(state, &settings, &user)?;
            (Some(user), answer)
        }
        Err(refusal) => (None, Answer::identity(refusal)),
    };
    let keep_alive = !stopping;
    let response = render(&answer, keep_alive)?;
    Some(Box::new(Early {
        response,
        keep_alive,
        status: answer.status,
        request,
        user,
        started,
        _in_flight: state.request_started(),
    }))
}

/// pingora's `RequestHeader` for `head`, as pingora builds it (`HttpSession::read_request`), if
/// the head is one this path takes; without the names' case, which only a forwarded request needs.
fn request_header(head: &[u8]) -> Option<RequestHeader> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut fields);
    match parsed.parse(head) {
        // Bytes after the head (a pipelined request) are pingora's to carry over.
        Ok(httparse::Status::Complete(len)) if len == head.len() => {}
        _ => return None,
    }
    if parsed.version != Some(1) {
        return None;
    }
    let mut request = RequestHeader::build_no_case(parsed.method?, parsed.path?.as_bytes(), Some(parsed.headers.len())).ok()?;
    request.set_version(Version::HTTP_11);
    for field in parsed.headers.iter() {
        let name = Bytes::copy_from_slice(field.name.as_bytes()).into_case_header_name();
        let value = HeaderValue::from_bytes(field.value).ok()?;
        request.append_header(name, value).ok()?;
    }
    authority::validate_request_authority(&request).ok()?;
    let fields = &request.headers;
    // A body (even an empty one declared), a protocol switch, a continue, and keep-alive terms
    // are the full path's to handle.
    if [CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE, EXPECT].iter().any(|name| fields.contains_key(name))
        || fields.contains_key("keep-alive")
        || !fields.get_all(CONNECTION).iter().all(|value| value.as_bytes().eq_ignore_ascii_case(b"keep-alive"))
    {
        return None;
    }
    Some(request)
}

/// The response as pingora writes an answer of ours (`write_answer`): the answer's head, then
/// the `Date` and `Connection` pingora adds, in its wire format, then the body.
fn render(answer: &Answer, keep_alive: bool) -> Option<Vec<u8>> {
    let status = StatusCode::from_u16(answer.status).ok()?;
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
    Some(response)
}

impl Early {
    pub fn response(&self) -> &[u8] {
        &self.response
    }

    /// Whether the connection waits for another request after this answer.
    pub fn keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// Counts and logs the request once its answer was written (or could not be), as the full
    /// path's `logging` phase does.
    pub fn done(self: Box<Self>, written: &io::Result<()>) {
        let elapsed = self.started.elapsed();
        let endpoint = Endpoint::Status.label();
        // What tells an operator (and the tests) which path a poll took.
        tracing::debug!(status = self.status, "status answered before pingora's session");
        metrics::REQUEST_DURATION.with_label_values(&[endpoint]).observe(elapsed.as_secs_f64());
        logging::access(&logging::Access {
            method: self.request.method.as_str(),
            path: self.request.uri.path(),
            status: if written.is_ok() { self.status } else { 0 },
            endpoint,
            duration: elapsed,
            user: self.user.as_deref().unwrap_or("-"),
            error: written.as_ref().err().map(|e| e.to_string()),
        });
    }
}
