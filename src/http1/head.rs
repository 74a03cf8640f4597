//! A request head: where it ends in the byte stream, whether its request line is plain, and the
//! one framing decision for what follows it.

use std::mem::MaybeUninit;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Version};
use pingora::http::{IntoCaseHeaderName, RequestHeader};

/// pingora's own bound on a head's fields: a head with more is pingora's to refuse.
pub const MAX_HEADERS: usize = 256;

/// Where a request head ends, fed as bytes arrive: the first empty line (`\n\n` or `\n\r\n`)
/// after the request line. Empty lines before the request line are skipped, as httparse skips
/// them, so they cannot end a head early; a bare CR only delays the end, and httparse refuses it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeadEnd {
    #[default]
    Leading,
    InLine,
    LineStart,
    LineStartCr,
}

impl HeadEnd {
    /// Where a head that arrives in `parts`, one read each, ends: the bytes before its end,
    /// counted from the first part's start; `None` while it has not ended.
    pub fn across(parts: &[&[u8]]) -> Option<usize> {
        let mut end = HeadEnd::default();
        let mut seen = 0;
        for part in parts {
            if let Some(n) = end.feed(part) {
                return Some(seen + n);
            }
            seen += part.len();
        }
        None
    }

    /// The number of bytes of `bytes` that belong to the head, once its end is among them.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            *self = match (*self, b) {
                (HeadEnd::Leading, b'\r' | b'\n') => HeadEnd::Leading,
                (HeadEnd::LineStart | HeadEnd::LineStartCr, b'\n') => return Some(i + 1),
                (HeadEnd::LineStart, b'\r') => HeadEnd::LineStartCr,
                (_, b'\n') => HeadEnd::LineStart,
                _ => {
                    // Inside a line: jump to its end.
                    *self = HeadEnd::InLine;
                    match memchr::memchr(b'\n', &bytes[i..]) {
                        Some(at) => {
                            i += at;
                            continue;
                        }
                        None => return None,
                    }
                }
            };
            i += 1;
        }
        None
    }
}

/// How a request's body is framed, as its head declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `Content-Length` bytes (0 without one).
    Length(usize),
    /// `Transfer-Encoding: chunked` alone: the body ends with its last chunk.
    Chunked,
    /// Anything less plain: only pingora reads where the body ends (see the module doc).
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
    pub const NONE: Framing = Framing { body: Body::Length(0), switch: false };
    pub const UNKNOWN: Framing = Framing { body: Body::Unknown, switch: false };
}

/// A head as read once: everything the connection loop, the early answers and the proxy's
/// framing checks need of it.
#[derive(Debug)]
pub struct Head {
    /// The request line is exactly `METHOD SP target SP HTTP/1.x` (see [`plain_request_line`]).
    pub plain_line: bool,
    pub framing: Framing,
    /// pingora's `RequestHeader`, built from the same parse, when it was asked for and the head
    /// is one HTTP/1.1 head that httparse reads to its last byte (without the names' case, which
    /// only a forwarded request needs; the early answers never forward).
    pub request: Option<RequestHeader>,
}

/// Reads `head` (one whole head, as [`HeadEnd`] split it) once. `want_request`: build the
/// `RequestHeader` too (the early answers' candidates only; a forwarded head is pingora's to
/// build).
pub fn read(head: &[u8], want_request: bool) -> Head {
    if !plain_request_line(head) {
        // Refused by the loop whatever else it says: nothing more is read.
        return Head { plain_line: false, framing: Framing::UNKNOWN, request: None };
    }
    let mut fields = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let whole = match parsed.parse_with_uninit_headers(head, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len == head.len(),
        _ => return Head { plain_line: true, framing: Framing::UNKNOWN, request: None },
    };
    let framing = framing_of(&parsed);
    let request = (want_request && whole && parsed.version == Some(1)).then(|| request_header(&parsed)).flatten();
    Head { plain_line: true, framing, request }
}

/// The framing of a parsed head: one `Content-Length` of digits only, or one
/// `Transfer-Encoding: chunked` and no length; [`Body::Unknown`] for anything else (two framing
/// fields, even equal ones; a length with a sign, a list or nothing; another transfer coding)
/// and for `CONNECT`, a tunnel. An `Upgrade` field is told apart (`switch`), never decided here.
fn framing_of(parsed: &httparse::Request) -> Framing {
    if parsed.method == Some("CONNECT") {
        return Framing::UNKNOWN;
    }
    let mut framing = Framing::NONE;
    let mut framed = false;
    for field in parsed.headers.iter() {
        let name = field.name.as_bytes();
        // Every framing name is longer than 6 bytes and starts with c, t or u: most fields
        // (Host, Accept, X-User-Id, ...) leave at the first look.
        let plain = match name.first().map(u8::to_ascii_lowercase) {
            Some(b'u') if name.eq_ignore_ascii_case(b"upgrade") => {
                framing.switch = true;
                continue;
            }
            Some(b't') if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                field.value.trim_ascii().eq_ignore_ascii_case(b"chunked").then_some(Body::Chunked)
            }
            Some(b'c') if name.eq_ignore_ascii_case(b"content-length") => length(field.value).map(Body::Length),
            _ => continue,
        };
        // A second framing field, even an equal one, is not plain; neither is one after a field
        // that did not read plainly (`Content-Length: -1` then `Content-Length: 5`).
        framing.body = match plain {
            Some(body) if !framed => body,
            _ => Body::Unknown,
        };
        framed = true;
    }
    framing
}

/// A `Content-Length` value of digits only (whitespace around them allowed, as httparse leaves
/// it), that fits.
fn length(value: &[u8]) -> Option<usize> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// pingora's `RequestHeader` for a parsed head, as pingora builds it (`HttpSession::read_request`).
fn request_header(parsed: &httparse::Request) -> Option<RequestHeader> {
    let size = Some(parsed.headers.len());
    let mut request = RequestHeader::build_no_case(parsed.method?, parsed.path?.as_bytes(), size).ok()?;
    request.set_version(Version::HTTP_11);
    // The fields go straight into the map: pingora's `append_header` copies each name into a
    // buffer of its own first, to keep its case, which a header built without case drops at
    // once (two allocations a field). The names and values are checked by the same `http`
    // parsers it uses. The parts keep an origin-form target as pingora keeps it, from the URI;
    // any other form keeps pingora's own way, which remembers the target's bytes.
    if !parsed.path?.starts_with('/') {
        for field in parsed.headers.iter() {
            let name = Bytes::copy_from_slice(field.name.as_bytes()).into_case_header_name();
            let value = HeaderValue::from_bytes(field.value).ok()?;
            request.append_header(name, value).ok()?;
        }
        return Some(request);
    }
    let mut parts = http::request::Parts::from(request);
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(field.value).ok()?;
        parts.headers.try_append(name, value).ok()?;
    }
    Some(RequestHeader::from(parts))
}

/// Whether `head`'s request line is exactly `METHOD SP target SP HTTP/1.x` (contract section
/// 12). pingora repairs a line with two spaces, a tab, a NUL or a CR before the version into a
/// target ending in `%20` or `%09`, a path no rule protects, which a backend that trims
/// whitespace routes as the protected one: such a line is refused before pingora sees it.
/// Empty lines before it are skipped, as httparse skips them.
pub fn plain_request_line(head: &[u8]) -> bool {
    let start = head.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(head.len());
    let rest = &head[start..];
    let line = match memchr::memchr(b'\n', rest) {
        Some(end) => &rest[..end],
        None => rest,
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn framing(head: &[u8]) -> Framing {
        read(head, false).framing
    }

    #[test]
    fn only_a_plain_framing_is_a_declared_body() {
        let head = |fields: &str| format!("POST /x HTTP/1.1\r\nHost: a\r\n{fields}\r\n");
        let body = |head: &[u8]| {
            let framing = framing(head);
            if framing.switch {
                Body::Unknown
            } else {
                framing.body
            }
        };
        assert_eq!(body(head("").as_bytes()), Body::Length(0));
        assert_eq!(body(head("Content-Length: 12\r\n").as_bytes()), Body::Length(12));
        assert_eq!(body(head("content-length:  7 \r\n").as_bytes()), Body::Length(7));
        assert_eq!(body(head("Transfer-Encoding: chunked\r\n").as_bytes()), Body::Chunked);
        assert_eq!(body(head("transfer-encoding: Chunked \r\n").as_bytes()), Body::Chunked);
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
            "Content-Length: -1\r\nContent-Length: 5\r\n",
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
            "Upgrade: websocket\r\nConnection: upgrade\r\n",
            "upgrade: h2c\r\n",
        ] {
            assert_eq!(body(head(unclear).as_bytes()), Body::Unknown, "{unclear:?}");
        }
        assert_eq!(body(b"CONNECT shop:443 HTTP/1.1\r\nHost: shop:443\r\n\r\n"), Body::Unknown);
        // Names only like a framing field's, and framing words elsewhere, frame nothing.
        let lookalikes = "Content-Length-Hint: 5\r\nX-Upgrade: h2c\r\nCookie: content-length:5\r\nTE: chunked\r\n";
        assert_eq!(body(head(lookalikes).as_bytes()), Body::Length(0));
        // Other fields starting with `u` are no switch (the mutation pass's one survivor).
        let others = "User-Agent: curl\r\nUpgrade-Insecure-Requests: 1\r\nContent-Length: 4\r\n";
        assert_eq!(framing(head(others).as_bytes()), Framing { body: Body::Length(4), switch: false });
        assert_eq!(body(b"GET /x HTTP/1.1\nhost: a\ncontent-length: 3\n\n"), Body::Length(3));
        // A head httparse cannot read, whatever pingora then makes of it.
        assert_eq!(body(b"GET /x HTTP/1.1\r\nContent-Length: 5\r\nBad Name: x\r\n\r\n"), Body::Unknown);
        assert_eq!(body(b"GET /x HTTP/1.1\r\nX: a\r\n b\r\nContent-Length: 5\r\n\r\n"), Body::Unknown);
    }

    #[test]
    fn a_switch_keeps_the_framing_it_would_have_without_it() {
        let framing_of = |head: &[u8]| framing(head);
        assert_eq!(
            framing_of(b"POST /o HTTP/1.1\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\n"),
            Framing { body: Body::Length(2), switch: true }
        );
        assert_eq!(
            framing_of(b"GET /ws HTTP/1.1\r\nupgrade: websocket\r\nConnection: upgrade\r\n\r\n"),
            Framing { body: Body::Length(0), switch: true }
        );
        assert_eq!(
            framing_of(b"POST /o HTTP/1.1\r\nUpgrade: h2c\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Framing { body: Body::Unknown, switch: true }
        );
    }

    #[test]
    fn the_request_header_is_built_only_when_asked_and_whole() {
        let head = b"GET /q/status?x=1 HTTP/1.1\r\nHost: a\r\nX-User-Id: u\r\n\r\n";
        assert!(read(head, false).request.is_none());
        let request = read(head, true).request.expect("built");
        assert_eq!(request.uri, "/q/status?x=1");
        assert_eq!(request.headers["x-user-id"], "u");
        assert!(read(b"GET /q/status HTTP/1.0\r\nHost: a\r\n\r\n", true).request.is_none(), "HTTP/1.0");
        assert!(read(b"GET /q/status HTTP/1.1\r\nHost: a\r\n\r\nX", true).request.is_none(), "bytes after the head");
    }

    #[test]
    fn only_a_plain_request_line_passes() {
        for plain in [
            "POST /api/orders HTTP/1.1\r\nHost: a\r\n\r\n",
            "\r\nGET /x?y=1 HTTP/1.0\r\n\r\n",
            "GET http://a/b HTTP/1.1\nHost: a\n\n",
            "OPTIONS * HTTP/1.1\r\n\r\n",
        ] {
            assert!(plain_request_line(plain.as_bytes()), "{plain:?}");
            assert!(read(plain.as_bytes(), false).plain_line);
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
            assert!(!plain_request_line(repaired.as_bytes()), "{repaired:?}");
            assert!(!read(repaired.as_bytes(), true).plain_line);
        }
    }

    fn end_of(parts: &[&[u8]]) -> Option<usize> {
        HeadEnd::across(parts)
    }

    #[test]
    fn a_head_ends_at_its_first_empty_line_however_it_is_split() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nBODY";
        assert_eq!(end_of(&[head]), Some(head.len() - 4));
        for cut in 0..head.len() {
            assert_eq!(end_of(&[&head[..cut], &head[cut..]]), Some(head.len() - 4), "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = head.chunks(1).collect();
        assert_eq!(end_of(&bytes), Some(head.len() - 4));
        assert_eq!(end_of(&[b"GET / HTTP/1.1\nHost: a\n\n"]), Some(24));
        assert_eq!(end_of(&[b"GET / HTTP/1.1\r\nHost: a\n\r\n"]), Some(26));
    }

    #[test]
    fn empty_lines_before_the_request_line_do_not_end_a_head() {
        assert_eq!(end_of(&[b"\r\n\r\n\n\n", b"GET / HTTP/1.1\r\n"]), None);
        assert_eq!(end_of(&[b"\r\n\r\nGET / HTTP/1.1\r\n\r\n"]), Some(22));
        // A bare CR at a line start is no end (httparse refuses it; the deadline still runs).
        assert_eq!(end_of(&[b"GET / HTTP/1.1\r\n\rX: y\r\n"]), None);
        assert_eq!(end_of(&[b"GET / HTTP/1.1\r\nX: y"]), None);
    }
}
