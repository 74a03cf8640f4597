//! The canonical path of a request target: the one spelling of a path that the protected rules
//! are compared with and that a protected request is forwarded with. Kept apart from the matching
//! because it is the part every request pays for, and the part that decides what is refused
//! whatever the rules say.

use std::borrow::Cow;
use std::fmt;

/// Why a request target is refused (400 `{"error": message}`); it never reaches the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathRefusal {
    /// A `%` not followed by two hex digits.
    #[error("the path has a malformed percent-encoding")]
    MalformedPercent,
    /// Dot segments climb above the root (`/../x`, `/a/../../x`).
    #[error("the path climbs above the root")]
    AboveRoot,
    /// Read another way a backend reads paths (`%2F`, `%5C` or `\` as `/`, `;` parameters dropped
    /// before dot segments, dot segments before `//`), the path would be protected: the proxy
    /// cannot tell which reading the backend routes.
    #[error("the path is ambiguous: it could name a protected path")]
    Ambiguous,
    /// An origin-form target starting with `//` (or `/\`): read as `//host/path`, as WHATWG URL
    /// parsers (Node's `new URL(req.url, base)`) and Python's `urlsplit` read it, its path would
    /// be protected.
    #[error("the request target is ambiguous: read as //host/path it could name a protected path")]
    NetworkPath,
    /// The target names no path (`*`, `host:443`, an opaque or unparseable target).
    #[error("the request target names no path")]
    NoPath,
}

impl PathRefusal {
    /// Always 400: each is a request the proxy will not interpret.
    pub fn status(self) -> u16 {
        400
    }

    /// The `error` of the JSON body.
    pub fn message(self) -> &'static str {
        match self {
            PathRefusal::MalformedPercent => "the path has a malformed percent-encoding",
            PathRefusal::AboveRoot => "the path climbs above the root",
            PathRefusal::Ambiguous => "the path is ambiguous: it could name a protected path",
            PathRefusal::NetworkPath => {
                "the request target is ambiguous: read as //host/path it could name a protected path"
            }
            PathRefusal::NoPath => "the request target names no path",
        }
    }
}

/// A request target's canonical path, and its query as the client sent it.
#[derive(Clone, PartialEq, Eq)]
pub struct Canonical<'a> {
    pub(super) path: Cow<'a, str>,
    query: Option<&'a [u8]>,
    /// The whole target was origin-form without a fragment and its path already canonical: it can
    /// be forwarded as it came.
    unchanged: Option<&'a [u8]>,
    /// The path as it came, for the alternative readings.
    pub(super) raw_path: &'a [u8],
}

impl fmt::Debug for Canonical<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Canonical")
            .field("path", &self.path)
            .field("query", &self.query.map(String::from_utf8_lossy))
            .field("unchanged", &self.unchanged.is_some())
            .finish()
    }
}

impl<'a> Canonical<'a> {
    /// The canonical path: starts with `/`, no `//`, no `.` or `..` segment, percent-encodings
    /// upper-case and never of an unreserved character; ASCII only. Keeps `;` parameters, case
    /// and a trailing slash.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The query, byte for byte, without its `?`; `None` when the target had no `?`.
    pub fn query(&self) -> Option<&'a [u8]> {
        self.query
    }

    /// What to forward for a protected request: the canonical path, then `?` and the original
    /// query. Borrowed exactly when the target is already that (so the request can be forwarded
    /// as it is); owned when the proxy must rewrite it (`RequestHeader::set_raw_path`).
    pub fn forward_target(&self) -> Cow<'a, [u8]> {
        if let Some(target) = self.unchanged {
            return Cow::Borrowed(target);
        }
        Cow::Owned(match self.query {
            Some(query) => [self.path.as_bytes(), b"?", query].concat(),
            None => self.path.as_bytes().to_vec(),
        })
    }
}

/// The canonical path of a request target (contract section 12): the target's path (query and
/// fragment dropped), percent-encodings of unreserved characters decoded and others upper-cased,
/// then runs of `/` merged, then dot segments removed (RFC 3986 5.2.4), in that order:
/// `/api//../orders` is `/orders`, `/api/%2E%2E/orders` is `/orders`.
///
/// Takes `&str` or raw bytes. Allocates nothing when the path is already canonical.
pub fn canonical_path<T: AsRef<[u8]> + ?Sized>(target: &T) -> Result<Canonical<'_>, PathRefusal> {
    let target = target.as_ref();
    let split = split_target(target)?;
    let path = if is_canonical(split.path) {
        // is_canonical admits ASCII only.
        Cow::Borrowed(std::str::from_utf8(split.path).expect("a canonical path is ASCII"))
    } else {
        Cow::Owned(canonicalize(split.path)?)
    };
    // Forwarded as it came only when nothing at all would change (pingora drops a fragment).
    let as_is = split.origin_form && split.without_fragment.len() == target.len();
    let unchanged = (as_is && matches!(path, Cow::Borrowed(_))).then_some(target);
    Ok(Canonical { path, query: split.query, unchanged, raw_path: split.path })
}

struct Split<'a> {
    path: &'a [u8],
    query: Option<&'a [u8]>,
    origin_form: bool,
    /// The target up to its fragment.
    without_fragment: &'a [u8],
}

/// Splits a target into path and query. Absolute-form is split where pingora's own classifier
/// (`pingora_http::authority::raw_target_authority`) splits it, so the path judged here is the
/// path pingora hands on; the targets that classifier calls ambiguous (`http:/\host`, `http:x`)
/// pingora refuses itself, and here they name no path.
fn split_target(target: &[u8]) -> Result<Split<'_>, PathRefusal> {
    let without_fragment = match target.iter().position(|&b| b == b'#') {
        Some(i) => &target[..i],
        None => target,
    };
    let (path_and_query, origin_form) = if without_fragment.first() == Some(&b'/') {
        (without_fragment, true)
    } else {
        (absolute_form_path(without_fragment).ok_or(PathRefusal::NoPath)?, false)
    };
    let (path, query) = match path_and_query.iter().position(|&b| b == b'?') {
        Some(i) => (&path_and_query[..i], Some(&path_and_query[i + 1..])),
        None => (path_and_query, None),
    };
    // `http://host` and `http://host?q` have the path `/` (RFC 9112 3.2.2).
    let path: &[u8] = if path.is_empty() { b"/" } else { path };
    Ok(Split { path, query, origin_form, without_fragment })
}

/// The path and query of an absolute-form target (`scheme://authority/path?query`), `None` for
/// any other form.
fn absolute_form_path(target: &[u8]) -> Option<&[u8]> {
    let colon = target.iter().position(|&b| b == b':')?;
    let scheme = &target[..colon];
    let valid_scheme = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !valid_scheme {
        return None;
    }
    let authority = target[colon + 1..].strip_prefix(b"//")?;
    let http_family =
        ["http", "https", "ws", "wss"].iter().any(|s| s.as_bytes().eq_ignore_ascii_case(scheme));
    let end = authority.iter().position(|&b| matches!(b, b'/' | b'?')).unwrap_or(authority.len());
    // URL parsers read `\` as `/` in these schemes, which would move the authority's end.
    if http_family && (end == 0 || authority[..end].contains(&b'\\')) {
        return None;
    }
    Some(&authority[end..])
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Bytes a canonical path carries as they are (RFC 3986 `pchar` and `/`, less `%`).
fn is_path_byte(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':' | b'@' | b'/'
        )
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// The hot path's check: whether a path is already canonical, in one scan without allocating.
fn is_canonical(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'/' {
            // A segment after this slash: empty (`//`), `.` or `..` means work to do. The last
            // slash (a trailing one) is an empty last segment, which is canonical.
            let rest = &path[i + 1..];
            let seg_end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
            let seg = &rest[..seg_end];
            if (seg.is_empty() && seg_end < rest.len()) || seg == b"." || seg == b".." {
                return false;
            }
        } else if b == b'%' {
            let (Some(&h), Some(&l)) = (path.get(i + 1), path.get(i + 2)) else { return false };
            let upper = |c: u8| c.is_ascii_digit() || (b'A'..=b'F').contains(&c);
            if !upper(h) || !upper(l) || is_unreserved(hex_value(h).unwrap() << 4 | hex_value(l).unwrap()) {
                return false;
            }
            i += 2;
        } else if !is_path_byte(b) {
            return false;
        }
        i += 1;
    }
    true
}

/// The three steps, in the contract's order, for a path that is not canonical yet.
fn canonicalize(path: &[u8]) -> Result<String, PathRefusal> {
    let decoded = decode(path)?;
    // 2. and 3. Runs of `/` merged, then dot segments removed; climbing above the root refused.
    let merged = merge_slashes(&decoded);
    let resolved = remove_dot_segments(&merged, Climb::Refuse)?;
    Ok(String::from_utf8(resolved).expect("canonical bytes are ASCII"))
}

/// Step 1. Percent-encodings: unreserved decoded, others upper-cased; bytes a path may not carry
/// encoded (so the output is ASCII and each byte has one spelling).
pub(super) fn decode(path: &[u8]) -> Result<Vec<u8>, PathRefusal> {
    let mut decoded = Vec::with_capacity(path.len() + 8);
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'%' {
            let high = path.get(i + 1).copied().and_then(hex_value);
            let low = path.get(i + 2).copied().and_then(hex_value);
            let (Some(high), Some(low)) = (high, low) else {
                return Err(PathRefusal::MalformedPercent);
            };
            let value = high << 4 | low;
            if is_unreserved(value) {
                decoded.push(value);
            } else {
                push_encoded(&mut decoded, value);
            }
            i += 3;
        } else {
            push_byte(&mut decoded, b);
            i += 1;
        }
    }
    Ok(decoded)
}

/// Appends one byte of the raw path as the canonical path spells it.
fn push_byte(out: &mut Vec<u8>, b: u8) {
    if is_path_byte(b) {
        out.push(b);
    } else {
        push_encoded(out, b);
    }
}

fn push_encoded(out: &mut Vec<u8>, b: u8) {
    out.extend_from_slice(&[b'%', HEX_UPPER[(b >> 4) as usize], HEX_UPPER[(b & 15) as usize]]);
}

pub(super) fn merge_slashes(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    for &b in path {
        if !(b == b'/' && out.last() == Some(&b'/')) {
            out.push(b);
        }
    }
    out
}

/// What a `..` at the root does: the canonical path refuses it (contract); the alternative
/// readings drop it, as `path.Clean` and `normpath` do, so the reading still names a path.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Climb {
    Refuse,
    Drop,
}

/// RFC 3986 5.2.4 for a path that starts with `/`: `.` segments dropped, `..` removes the
/// segment before it (an empty one too, when `//` was not merged first), a path ending in a dot
/// segment keeps a trailing slash.
pub(super) fn remove_dot_segments(path: &[u8], climb: Climb) -> Result<Vec<u8>, PathRefusal> {
    debug_assert!(path.first() == Some(&b'/'));
    let mut out: Vec<u8> = Vec::with_capacity(path.len());
    let segments: Vec<&[u8]> = path[1..].split(|&b| b == b'/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            b"." => {}
            b".." => match out.iter().rposition(|&b| b == b'/') {
                Some(slash) => out.truncate(slash),
                None if climb == Climb::Refuse => return Err(PathRefusal::AboveRoot),
                None => {}
            },
            seg => {
                out.push(b'/');
                out.extend_from_slice(seg);
                continue;
            }
        }
        if i == last {
            out.push(b'/');
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(target: &str) -> Result<String, PathRefusal> {
        canonical_path(target).map(|c| c.path().to_string())
    }

    #[test]
    fn each_refusal_is_a_400_that_says_why() {
        // The wording is what a shop's support reads back from a user's screenshot: pinned here
        // because the end-to-end tests only see that an error is there.
        for (refusal, message) in [
            (PathRefusal::MalformedPercent, "the path has a malformed percent-encoding"),
            (PathRefusal::AboveRoot, "the path climbs above the root"),
            (PathRefusal::Ambiguous, "the path is ambiguous: it could name a protected path"),
            (
                PathRefusal::NetworkPath,
                "the request target is ambiguous: read as //host/path it could name a protected path",
            ),
            (PathRefusal::NoPath, "the request target names no path"),
        ] {
            assert_eq!(refusal.status(), 400, "{refusal:?}");
            assert_eq!(refusal.message(), message, "{refusal:?}");
        }
    }

    #[test]
    fn a_canonical_path_debugs_as_what_was_decided() {
        // Failing property tests print this: it has to show the path and the query.
        let c = canonical_path("/a//b?x=1").unwrap();
        assert_eq!(format!("{c:?}"), r#"Canonical { path: "/a/b", query: Some("x=1"), unchanged: false }"#);
    }

    #[test]
    fn contract_examples() {
        assert_eq!(canon("/api//../orders"), Ok("/orders".into()));
        assert_eq!(canon("/api/%2E%2E/orders"), Ok("/orders".into()));
        assert_eq!(canon("/api/%2e%2E/orders"), Ok("/orders".into()));
        assert_eq!(canon("/api/orders;x=1/"), Ok("/api/orders;x=1/".into()), "keeps ; and a trailing slash");
        assert_eq!(canon("/API/Orders"), Ok("/API/Orders".into()), "keeps case");
        assert_eq!(canon("/../x"), Err(PathRefusal::AboveRoot));
        assert_eq!(canon("/a/../../x"), Err(PathRefusal::AboveRoot));
        assert_eq!(canon("/%2E%2E/x"), Err(PathRefusal::AboveRoot));
        assert_eq!(canon("//..//x"), Err(PathRefusal::AboveRoot));
    }

    #[test]
    fn percent_encodings() {
        assert_eq!(canon("/api/%6Frders"), Ok("/api/orders".into()));
        assert_eq!(canon("/%41%7a%30%2D%2e%5F%7E"), Ok("/Az0-._~".into()));
        assert_eq!(canon("/a%2fb%5cc%3b%c3%a9"), Ok("/a%2Fb%5Cc%3B%C3%A9".into()));
        assert_eq!(canon("/100%25"), Ok("/100%25".into()));
        for bad in ["/%", "/%4", "/%zz", "/%4g", "/api/%u006Frders", "/a%"] {
            assert_eq!(canon(bad), Err(PathRefusal::MalformedPercent), "{bad}");
        }
        // Bytes a path may not carry get one spelling: encoded.
        assert_eq!(canon("/a b\\c\"{}"), Ok("/a%20b%5Cc%22%7B%7D".into()));
        assert_eq!(canon("/caf\u{e9}"), canon("/caf%c3%a9"));
        assert_eq!(canonical_path(&b"/\xff\x00"[..]).unwrap().path(), "/%FF%00");
    }

    #[test]
    fn query_and_fragment_and_forms() {
        let c = canonical_path("/a/./b?x=%2e&y=/../#frag").unwrap();
        assert_eq!((c.path(), c.query()), ("/a/b", Some(&b"x=%2e&y=/../"[..])));
        assert_eq!(&*c.forward_target(), b"/a/b?x=%2e&y=/../");
        let c = canonical_path("http://shop.example/api//orders?id=1").unwrap();
        assert_eq!((c.path(), c.query()), ("/api/orders", Some(&b"id=1"[..])));
        assert_eq!(canon("http://host"), Ok("/".into()));
        assert_eq!(canon("https://host?q"), Ok("/".into()));
        assert_eq!(canon("HTTP://host/a"), Ok("/a".into()));
        assert_eq!(canon("foo://host/a/../b"), Ok("/b".into()));
        assert_eq!(canon("/a#/../.."), Ok("/a".into()));
        assert_eq!(canon("/a?"), Ok("/a".into()));
        assert_eq!(canonical_path("/a?").unwrap().query(), Some(&b""[..]));
        for no_path in [
            "*",
            "shop.example:443",
            "",
            "api/orders",
            "http:/\\host/api/orders",
            "http:host",
            "http:///x",
            "ht_tp://h/x",
            "foo:bar://h/api/orders",
        ] {
            assert_eq!(canon(no_path), Err(PathRefusal::NoPath), "{no_path}");
        }
    }

    #[test]
    fn canonical_paths_are_borrowed() {
        for target in [
            "/",
            "/api/orders",
            "/api/orders/",
            "/api/orders;x=1?a=b",
            "/a%2Fb",
            "/.well-known/x",
            "/a..b/c.",
        ] {
            let c = canonical_path(target).unwrap();
            assert!(matches!(c.path, Cow::Borrowed(_)), "{target}");
            assert!(matches!(c.forward_target(), Cow::Borrowed(t) if t == target.as_bytes()), "{target}");
        }
        for target in ["//a", "/a/.", "/a/..", "/./a", "/%2e", "/%2f", "/a b", "/a#f", "http://h/a"] {
            assert!(matches!(canonical_path(target).unwrap().forward_target(), Cow::Owned(_)), "{target}");
        }
    }

    /// RFC 3986 5.2.4's walk-throughs and 5.4's examples, each reference merged with the base
    /// path `/b/c/d;p` as 5.2.3 does; the abnormal ones that climb above the root are refused.
    #[test]
    fn rfc3986_dot_segments() {
        assert_eq!(canon("/a/b/c/./../../g"), Ok("/a/g".into()));
        assert_eq!(canon("/mid/content=5/../6"), Ok("/mid/6".into()));
        for (reference, expected) in RFC3986_EXAMPLES {
            let merged =
                if reference.starts_with('/') { reference.to_string() } else { format!("/b/c/{reference}") };
            match expected {
                Some(e) => assert_eq!(canon(&merged), Ok(e.to_string()), "{reference}"),
                None => assert_eq!(canon(&merged), Err(PathRefusal::AboveRoot), "{reference}"),
            }
        }
    }

    /// (reference, path of the resolved URI; `None` where RFC 3986 clamps at the root and the
    /// contract refuses).
    const RFC3986_EXAMPLES: &[(&str, Option<&str>)] = &[
        ("g", Some("/b/c/g")),
        ("./g", Some("/b/c/g")),
        ("g/", Some("/b/c/g/")),
        ("/g", Some("/g")),
        ("g;x", Some("/b/c/g;x")),
        ("g;x?y#s", Some("/b/c/g;x")),
        (".", Some("/b/c/")),
        ("./", Some("/b/c/")),
        ("..", Some("/b/")),
        ("../", Some("/b/")),
        ("../g", Some("/b/g")),
        ("../..", Some("/")),
        ("../../", Some("/")),
        ("../../g", Some("/g")),
        ("../../../g", None),
        ("../../../../g", None),
        ("/./g", Some("/g")),
        ("/../g", None),
        ("g.", Some("/b/c/g.")),
        (".g", Some("/b/c/.g")),
        ("g..", Some("/b/c/g..")),
        ("..g", Some("/b/c/..g")),
        ("./../g", Some("/b/g")),
        ("./g/.", Some("/b/c/g/")),
        ("g/./h", Some("/b/c/g/h")),
        ("g/../h", Some("/b/c/h")),
        ("g;x=1/./y", Some("/b/c/g;x=1/y")),
        ("g;x=1/../y", Some("/b/c/y")),
    ];
}
