//! Which requests are protected (contract section 12): the canonical path of a request target,
//! the rules' matching, and the readings a backend might make that the proxy refuses to guess.
//!
//! Pure: no I/O, no pingora types. The proxy calls [`classify`] once per request with the raw
//! target (`RequestHeader::raw_path()`, bytes, so a non-UTF-8 target is judged and not lost) and
//! renders a [`PathRefusal`] as 400.
//!
//! Why a canonical path: backends route paths their own way (Tomcat drops `;params`, Express
//! ignores case and a trailing slash, Go's mux cleans `//` and `./`, most decode `%6F`), so the
//! proxy decides on the path a backend would route, and a protected request is forwarded with the
//! path that was checked. Pass-through requests are forwarded untouched.
//!
//! Decisions where the contract is silent (each is also said at the code that makes it):
//! - Only origin-form (`/a?q`) and absolute-form (`http://host/a?q`, split where pingora's own
//!   classifier splits it) targets have a path. `*`, authority-form (`host:443`) and anything
//!   else give [`PathRefusal::NoPath`]: [`classify`] passes such a request through when its
//!   method could not be protected anyway (`OPTIONS *`, `CONNECT`), and refuses it (400) when it
//!   could: a backend might read a path out of it that the proxy cannot.
//! - A malformed percent-encoding (`%`, `%4`, `%zz`, IIS's `%u006F`) is refused (400) for every
//!   request: backends disagree about it (literal `%`, an error, IIS decodes `%u`), so it has no
//!   one reading to check, and RFC 3986 does not allow it. nginx and Tomcat refuse it too.
//! - Bytes a path may not carry (space, `"`, `<`, `\`, `{`, controls, non-ASCII, ...) are
//!   percent-encoded in the canonical path, so `/caf\u{e9}` and `/caf%c3%a9` are one path. The
//!   output is therefore always ASCII.
//! - The alternative readings (see [`classify`]): `%2F`, `%5C` and `\` as `/` (the contract's), and
//!   two more the contract's wording does not list but its purpose needs: `;` parameters removed
//!   *before* dot segments are resolved (Tomcat reads `/x/..;/api/orders` as `/api/orders`), and
//!   dot segments resolved *before* `//` is merged (a WHATWG URL parser, as in Node's `URL`, Deno
//!   or Bun, reads `/api/orders//..` as `/api/orders/`). Each combination of the three is tried,
//!   always from the decoded path, before any `..` has removed a `%2F` or a `//`. Dot segments
//!   climbing above the root are dropped in these readings, as `path.Clean`, `normpath` and
//!   WHATWG do.
//! - An origin-form target starting with `//` (or `/\`, which a WHATWG parser reads alike) is
//!   also read as a network-path reference, `//host/path` (RFC 3986 4.2), twice: as WHATWG does
//!   (Node's `new URL(req.url, base)`, Deno, Bun: every leading `/` and `\` skipped, the host up
//!   to the next `/`, `\`, `?` or `#`, so `///api/orders` is the host `api` and the path
//!   `/orders`), and as the contract says, the path after the first segment (Python's `urlsplit`:
//!   the host up to the next `/`, `?` or `#`, so `//a\b/api/orders` is the path `/api/orders`).
//!   Each path found goes through the readings above, dot segments climbing above the root
//!   dropped as WHATWG drops them, and the request is refused like an ambiguous one
//!   ([`PathRefusal::NetworkPath`]), also when that path is the plain reading itself
//!   (`///api/orders`). `//api/orders` itself stays protected (the path after its host is
//!   `/orders`): its canonical path is protected and forwarded, so the upstream never sees the `//`.
//! - A request is refused when an alternative reading differs from the plain one and is
//!   protected, whether or not the plain reading is protected too: that is what the contract's
//!   sentence says, and the safer side (an order path carrying an encoded slash is not a
//!   legitimate one; the backend is never asked to route it). Refusing only when the plain
//!   reading is not protected would be one condition in [`classify`].
//! - A rule path of `/` with `match: prefix` protects every path; with `match: exact`, only `/`.

use std::borrow::Cow;
use std::fmt;

use http::{HeaderMap, HeaderName, Method};

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

// ---- the canonical path ------------------------------------------------------------------------

/// A request target's canonical path, and its query as the client sent it.
#[derive(Clone, PartialEq, Eq)]
pub struct Canonical<'a> {
    path: Cow<'a, str>,
    query: Option<&'a [u8]>,
    /// The whole target was origin-form without a fragment and its path already canonical: it can
    /// be forwarded as it came.
    unchanged: Option<&'a [u8]>,
    /// The path as it came, for the alternative readings.
    raw_path: &'a [u8],
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
fn decode(path: &[u8]) -> Result<Vec<u8>, PathRefusal> {
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

fn merge_slashes(path: &[u8]) -> Vec<u8> {
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
enum Climb {
    Refuse,
    Drop,
}

/// RFC 3986 5.2.4 for a path that starts with `/`: `.` segments dropped, `..` removes the
/// segment before it (an empty one too, when `//` was not merged first), a path ending in a dot
/// segment keeps a trailing slash.
fn remove_dot_segments(path: &[u8], climb: Climb) -> Result<Vec<u8>, PathRefusal> {
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

// ---- matching ----------------------------------------------------------------------------------

/// How a rule's path is compared (`match:` in `protected`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathMatch {
    /// The path itself (the default).
    #[default]
    Exact,
    /// The path and everything below it: `/api/orders` covers `/api/orders/42/pay`, not
    /// `/api/ordersX`. A rule path of `/` covers every path.
    Prefix,
}

/// One `protected` entry, compiled once per (re)load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    method: Method,
    /// The rule's path as requests are compared with it: canonical, `;` parameters removed, no
    /// trailing `/` (except the root).
    key: String,
    matching: PathMatch,
}

impl Rule {
    /// Compiles a rule. Its path goes through the same steps as a request's, so a configured
    /// `/api/%6Frders/` is the rule `/api/orders`; a path that is not one (no leading `/`, a
    /// malformed `%`, climbing above the root) is refused, for the configuration to report.
    pub fn new(method: Method, path: &str, matching: PathMatch) -> Result<Rule, PathRefusal> {
        if !path.starts_with('/') {
            return Err(PathRefusal::NoPath);
        }
        let canonical = canonical_path(path)?;
        let key = match_key(canonical.path()).into_owned();
        Ok(Rule { method, key, matching })
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The path requests are compared with.
    pub fn path(&self) -> &str {
        &self.key
    }

    pub fn matching(&self) -> PathMatch {
        self.matching
    }

    /// Whether a match key (see [`match_key`]) is this rule's path, ASCII-case-insensitively.
    fn covers(&self, key: &[u8]) -> bool {
        let rule = self.key.as_bytes();
        match self.matching {
            PathMatch::Exact => key.eq_ignore_ascii_case(rule),
            PathMatch::Prefix if rule == b"/" => true,
            PathMatch::Prefix => {
                key.len() >= rule.len()
                    && key[..rule.len()].eq_ignore_ascii_case(rule)
                    && (key.len() == rule.len() || key[rule.len()] == b'/')
            }
        }
    }
}

/// The headers that name another method to backends that honour them.
static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// Whether a request's method, or a method named by an override header, is `wanted`
/// ASCII-case-insensitively (some backends upper-case `post`). Every line of each header counts,
/// and each comma-separated item of a line (backends disagree about which one they use).
pub fn method_matches(wanted: &Method, method: &Method, headers: &HeaderMap) -> bool {
    let wanted = wanted.as_str().as_bytes();
    if method.as_str().as_bytes().eq_ignore_ascii_case(wanted) {
        return true;
    }
    METHOD_OVERRIDES.iter().any(|name| {
        headers.get_all(name).iter().any(|value| {
            let value = value.as_bytes();
            value.trim_ascii().eq_ignore_ascii_case(wanted)
                || value.split(|&b| b == b',').any(|item| item.trim_ascii().eq_ignore_ascii_case(wanted))
        })
    })
}

/// What the rules compare: the canonical path with `;` parameters removed from every segment
/// and one trailing `/` removed (the root stays `/`).
pub fn match_key(canonical: &str) -> Cow<'_, str> {
    let key: Cow<'_, str> = if canonical.contains(';') {
        Cow::Owned(strip_params(canonical.as_bytes()))
    } else {
        Cow::Borrowed(canonical)
    };
    strip_trailing_slash(key)
}

fn strip_params(path: &[u8]) -> String {
    let mut out = Vec::with_capacity(path.len());
    let mut in_params = false;
    for &b in path {
        match b {
            b'/' => {
                in_params = false;
                out.push(b);
            }
            b';' => in_params = true,
            _ if in_params => {}
            _ => out.push(b),
        }
    }
    // Bytes of a canonical path or a reading of one: ASCII.
    String::from_utf8(out).expect("ASCII in, ASCII out")
}

fn strip_trailing_slash(key: Cow<'_, str>) -> Cow<'_, str> {
    if key.len() > 1 && key.ends_with('/') {
        match key {
            Cow::Borrowed(k) => Cow::Borrowed(&k[..k.len() - 1]),
            Cow::Owned(mut k) => {
                k.pop();
                Cow::Owned(k)
            }
        }
    } else {
        key
    }
}

/// How a backend might read a path other than the canonical way (see [`classify`]).
#[derive(Debug, Clone, Copy)]
struct Reading {
    /// `%2F`, `%5C` and `\` as `/`.
    slashes: bool,
    /// `;` parameters removed before dot segments are resolved (Tomcat: `/x/..;/a` is `/a`).
    params_first: bool,
    /// Dot segments resolved before `//` is merged (a WHATWG URL parser: `/a/b//..` is `/a/b/`).
    dots_first: bool,
}

/// A reading's match key, from the path after step 1 (decoding): the readings must see a `%2F`
/// or a `//` before a `..` has removed it. Dot segments climbing above the root are dropped.
fn reading_key(decoded: &[u8], reading: Reading) -> String {
    let mut path = decoded.to_vec();
    if reading.slashes {
        path = read_slashes(&path);
    }
    if reading.params_first {
        path = strip_params(&path).into_bytes();
    }
    let resolved = if reading.dots_first {
        merge_slashes(&remove_dot_segments(&path, Climb::Drop).expect("Climb::Drop never refuses"))
    } else {
        remove_dot_segments(&merge_slashes(&path), Climb::Drop).expect("Climb::Drop never refuses")
    };
    let resolved = String::from_utf8(resolved).expect("ASCII in, ASCII out");
    match_key(&resolved).into_owned()
}

/// `%2F` and `%5C` as `/` (step 1 spells `\` as `%5C` and its hex upper-case).
fn read_slashes(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i] == b'%' && matches!(path.get(i + 1..i + 3), Some(b"2F" | b"5C")) {
            out.push(b'/');
            i += 3;
        } else {
            out.push(path[i]);
            i += 1;
        }
    }
    out
}

/// The paths URL parsers find in an origin-form target read as a network-path reference
/// (`//host/path`), query and fragment dropped, each starting with `/`; none when the target does
/// not start with `//` or `/\`. First WHATWG's reading (every leading `/` and `\` skipped, the
/// host up to the next `/`, `\`, `?` or `#`), then, for `//`, the contract's "path after its first
/// segment", which is Python's `urlsplit` (the host up to the next `/`, `?` or `#`).
fn network_path_readings(target: &[u8]) -> Vec<Vec<u8>> {
    fn path_of(rest: &[u8]) -> Vec<u8> {
        let end = rest.iter().position(|&b| matches!(b, b'?' | b'#')).unwrap_or(rest.len());
        match &rest[..end] {
            // `//shop` and `//shop?q` name the root.
            [] => b"/".to_vec(),
            // WHATWG reads `\` as `/` in http(s) URLs; any further `\` is the `slashes` reading's.
            [b'\\', path @ ..] => [&b"/"[..], path].concat(),
            path => path.to_vec(),
        }
    }
    if !matches!(target, [b'/', b'/' | b'\\', ..]) {
        return Vec::new();
    }
    let slashes = target.iter().position(|&b| !matches!(b, b'/' | b'\\')).unwrap_or(target.len());
    let host = &target[slashes..];
    let host_end = host.iter().position(|&b| matches!(b, b'/' | b'\\' | b'?' | b'#')).unwrap_or(host.len());
    let mut readings = vec![path_of(&host[host_end..])];
    if let Some(host) = target.strip_prefix(b"//") {
        let host_end = host.iter().position(|&b| matches!(b, b'/' | b'?' | b'#')).unwrap_or(host.len());
        readings.push(path_of(&host[host_end..]));
    }
    readings
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---- the decision ------------------------------------------------------------------------------

/// What the proxy does with a request that is not refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Not protected: forwarded exactly as it came.
    PassThrough,
    /// Protected: checked for its token, then forwarded with [`Canonical::forward_target`].
    Protected(Canonical<'a>),
}

/// Decides a request (contract section 12): protected, passed through, or refused (400).
///
/// - Protected: the method, or one named by an override header, is a rule's method (see
///   [`method_matches`]), and the match key of the canonical path is the rule's path.
/// - Refused, whatever the method: a malformed percent-encoding; dot segments above the root.
/// - Refused when some rule's method matches: a target that names no path; an ambiguous path:
///   one whose alternative reading differs from the plain one and is protected. The readings:
///   `%2F`/`%5C`/`\` as `/` (when the path has one), `;` parameters removed before dot segments
///   are resolved (when it has a `;`), dot segments resolved before `//` is merged (when it has
///   a `//`), in every combination; and for an origin-form target starting with `//` or `/\`,
///   each of these readings of the path after its host (see [`network_path_readings`]).
///
/// A request whose method no rule has costs one scan of the path (no allocation) when the path
/// is already canonical.
pub fn classify<'a, T: AsRef<[u8]> + ?Sized>(
    rules: &[Rule],
    method: &Method,
    headers: &HeaderMap,
    target: &'a T,
) -> Result<Verdict<'a>, PathRefusal> {
    let candidates = || rules.iter().filter(|r| method_matches(&r.method, method, headers));
    let could_be_protected = candidates().next().is_some();
    let canonical = match canonical_path(target) {
        Ok(c) => c,
        // `OPTIONS *`, `CONNECT host:443`: nothing here could be protected.
        Err(PathRefusal::NoPath) if !could_be_protected => return Ok(Verdict::PassThrough),
        Err(refusal) => return Err(refusal),
    };
    if !could_be_protected {
        return Ok(Verdict::PassThrough);
    }
    let protected = |key: &str| candidates().any(|r| r.covers(key.as_bytes()));
    let plain = match_key(canonical.path());
    // Rare (browsers and client libraries never send a target starting with `//`): what this
    // allocates costs the common case nothing.
    for path in network_path_readings(target.as_ref()) {
        // The path is a part of the target's path, which decoded: this cannot fail.
        let Ok(decoded) = decode(&path) else { continue };
        for bits in 0..8u8 {
            let reading =
                Reading { slashes: bits & 1 != 0, params_first: bits & 2 != 0, dots_first: bits & 4 != 0 };
            // Refused even when this reading is the plain one: the contract refuses any `//`
            // target whose path after the first segment is protected.
            if protected(&reading_key(&decoded, reading)) {
                return Err(PathRefusal::NetworkPath);
            }
        }
    }
    // Only a path with one of these has another reading: the common case stops here.
    let raw = canonical.raw_path;
    let maybe_slashes = raw.contains(&b'\\') || raw.contains(&b'%');
    let params = raw.contains(&b';');
    let double = contains(raw, b"//");
    if maybe_slashes || params || double {
        let decoded = decode(raw).expect("the canonical path decoded it");
        let slashes = contains(&decoded, b"%2F") || contains(&decoded, b"%5C");
        for bits in 1..8u8 {
            let reading =
                Reading { slashes: bits & 1 != 0, params_first: bits & 2 != 0, dots_first: bits & 4 != 0 };
            if (reading.slashes && !slashes)
                || (reading.params_first && !params)
                || (reading.dots_first && !double)
            {
                continue;
            }
            let alternative = reading_key(&decoded, reading);
            if alternative != plain && protected(&alternative) {
                return Err(PathRefusal::Ambiguous);
            }
        }
    }
    if protected(&plain) {
        Ok(Verdict::Protected(canonical))
    } else {
        Ok(Verdict::PassThrough)
    }
}

// ---- the client address's list -----------------------------------------------------------------

/// What stands for an `X-Forwarded-For` line that is not text.
const UNREADABLE: &str = "unreadable";

/// Every `X-Forwarded-For` line, in order, as one comma-separated list (contract section 9), for
/// `rules::client_address(peer, forwarded_for(headers).as_deref(), trusted)`. Borrowed when
/// there is one line. A line that is not text stands as an entry that parses as no address, so
/// `client_address` believes nothing to the left of it, as for any other garbage.
pub fn forwarded_for(headers: &HeaderMap) -> Option<Cow<'_, str>> {
    let mut lines = headers.get_all("x-forwarded-for").iter();
    let first = lines.next()?;
    let Some(second) = lines.next() else { return Some(Cow::Borrowed(text(first))) };
    let mut list = String::from(text(first));
    for line in std::iter::once(second).chain(lines) {
        list.push_str(", ");
        list.push_str(text(line));
    }
    Some(Cow::Owned(list))
}

fn text(value: &http::HeaderValue) -> &str {
    value.to_str().unwrap_or(UNREADABLE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn canon(target: &str) -> Result<String, PathRefusal> {
        canonical_path(target).map(|c| c.path().to_string())
    }

    fn post_rule(path: &str, matching: PathMatch) -> Rule {
        Rule::new(Method::POST, path, matching).unwrap()
    }

    fn decide(
        rules: &[Rule],
        method: &str,
        target: &str,
        headers: &[(&'static str, &str)],
    ) -> Result<Option<String>, PathRefusal> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        classify(rules, &method, &map, target).map(|v| match v {
            Verdict::PassThrough => None,
            Verdict::Protected(c) => Some(String::from_utf8(c.forward_target().into_owned()).unwrap()),
        })
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

    #[test]
    fn issue_14_bypasses_are_protected_or_refused() {
        let rules = [post_rule("/api/orders", PathMatch::Exact)];
        let protected = |target: &str| decide(&rules, "POST", target, &[]);
        for (target, forwarded) in [
            ("/api/orders", "/api/orders"),
            ("/api/orders/", "/api/orders/"),
            ("/API/orders", "/API/orders"),
            ("/api/%6Frders", "/api/orders"),
            ("/api/%6frders", "/api/orders"),
            ("/api/orders;x=1", "/api/orders;x=1"),
            ("/api;v=2/orders;x=1/", "/api;v=2/orders;x=1/"),
            ("//api/orders", "/api/orders"),
            ("/api/./orders", "/api/orders"),
            ("/api/x/../orders", "/api/orders"),
            ("/api/orders?id=7&x=%2e", "/api/orders?id=7&x=%2e"),
            ("/api/%2E/orders/%2e", "/api/orders/"),
            ("http://shop/api/orders?q", "/api/orders?q"),
        ] {
            assert_eq!(protected(target), Ok(Some(forwarded.to_string())), "{target}");
        }
        for ambiguous in [
            "/api%2Forders",
            "/api%2forders",
            "/api%5Corders",
            "/api%5corders",
            "/api\\orders",
            "/x/..;/api/orders",
            "/api/;/orders",
            "/api/orders%2F",
            "/api//../orders",
            "/api/orders//..",
            "/api/orders/x//../..",
            "/x%2F..%2Fapi/orders",
            // The reading starts before `..` removes the segment holding the `%2F`.
            "/api%2Fzz/../orders",
            "/..%2Fapi/orders",
        ] {
            assert_eq!(protected(ambiguous), Err(PathRefusal::Ambiguous), "{ambiguous}");
        }
        for other in [
            "/api/ordersX",
            "/api/orders/42",
            "/api",
            "/api/orders.json",
            "/api/%2Forders%2F..",
            "/api/orders%3Bx",
        ] {
            assert_eq!(protected(other), Ok(None), "{other}");
        }
        // Climbing above the root is refused for every request, protected method or not.
        assert_eq!(protected("/../api/orders"), Err(PathRefusal::AboveRoot));
        assert_eq!(decide(&rules, "GET", "/a/../../x", &[]), Err(PathRefusal::AboveRoot));
        assert_eq!(decide(&rules, "GET", "/a/%zz", &[]), Err(PathRefusal::MalformedPercent));
    }

    /// Node's `new URL(req.url, base)` routes `//shop/api/orders` as `/api/orders` (the host
    /// `shop`), Python's `urlsplit` too; the canonical path `/shop/api/orders` is not protected.
    #[test]
    fn targets_read_as_host_and_path_are_refused_when_the_path_is_protected() {
        let rules = [post_rule("/api/orders", PathMatch::Exact)];
        let protected = |target: &str| decide(&rules, "POST", target, &[]);
        for refused in [
            "//shop/api/orders",
            "//shop/api/orders?x=1",
            "//shop/api/orders#f",
            "//shop/api/orders/",
            "//shop/API/orders;v=2",
            "//shop/api/%6Frders",
            "//shop/api//orders",
            "//shop/x/../api/orders",
            "//user:pw@shop/api/orders",
            "//shop:8080/api/orders",
            // WHATWG: `\` is `/`, leading slashes of any kind are skipped, the host ends at `\`.
            "/\\shop/api/orders",
            "//\\shop/api/orders",
            "//shop\\api/orders",
            "///x/api/orders",
            "////x/api/orders",
            // Python: the host ends at `/` only.
            "//a\\b/api/orders",
            // The other readings apply to the path after the host.
            "//shop/api%2Forders",
            "//shop/x/..;/api/orders",
        ] {
            assert_eq!(protected(refused), Err(PathRefusal::NetworkPath), "{refused}");
        }
        // Named by an override header, the method counts too.
        assert_eq!(
            decide(&rules, "GET", "//shop/api/orders", &[("x-http-method-override", "POST")]),
            Err(PathRefusal::NetworkPath)
        );
        for passed in [
            "//cdn/static/app.js",
            "//shop/api/orders/42",
            "//shop/api",
            "//shop",
            "//shop?/api/orders",
            "//shop#/api/orders",
            "//api/ordersX",
            "/shop//api/orders",
        ] {
            assert_eq!(protected(passed), Ok(None), "{passed}");
        }
        assert_eq!(decide(&rules, "GET", "//shop/api/orders", &[]), Ok(None));
        // The canonical path protected and every reading after a host something else: protected
        // and forwarded without its `//`, so the upstream reads no host in it.
        assert_eq!(protected("//api/orders"), Ok(Some("/api/orders".into())));
        // A reading after a host that is the canonical path itself is refused all the same.
        for refused in ["///api/orders", "//shop/../api/orders", "//n/x%2Fx/../../api/orders"] {
            assert_eq!(protected(refused), Err(PathRefusal::NetworkPath), "{refused}");
        }
        let shop = [post_rule("/shop/api/orders", PathMatch::Exact)];
        assert_eq!(decide(&shop, "POST", "//shop/api/orders", &[]), Ok(Some("/shop/api/orders".into())));

        // The root: `//shop` names `/`.
        let root = [post_rule("/", PathMatch::Exact)];
        for refused in ["//shop", "//shop/", "//shop?q=1", "//shop#f", "/\\shop"] {
            assert_eq!(decide_with(&root, refused), Err(PathRefusal::NetworkPath), "{refused}");
        }
        assert_eq!(decide_with(&root, "//"), Err(PathRefusal::NetworkPath));
        let prefix = [post_rule("/api/orders", PathMatch::Prefix)];
        assert_eq!(decide_with(&prefix, "//x/api/orders/42/pay"), Err(PathRefusal::NetworkPath));
        assert_eq!(decide_with(&prefix, "//x/api/ordersX"), Ok(None));
    }

    #[test]
    fn methods_and_overrides() {
        let rules = [post_rule("/api/orders", PathMatch::Exact)];
        let yes = Ok(Some("/api/orders".to_string()));
        assert_eq!(decide(&rules, "post", "/api/orders", &[]), yes);
        assert_eq!(decide(&rules, "Post", "/api/orders", &[]), yes);
        assert_eq!(decide(&rules, "GET", "/api/orders", &[]), Ok(None));
        for header in ["x-http-method-override", "x-http-method", "x-method-override"] {
            assert_eq!(decide(&rules, "GET", "/api/orders", &[(header, "POST")]), yes, "{header}");
            assert_eq!(decide(&rules, "GET", "/api/orders", &[(header, " post ")]), yes, "{header}");
        }
        assert_eq!(
            decide(
                &rules,
                "GET",
                "/api/orders",
                &[("x-http-method-override", "PUT"), ("x-http-method-override", "POST")]
            ),
            yes
        );
        assert_eq!(decide(&rules, "GET", "/api/orders", &[("x-http-method-override", "GET, POST")]), yes);
        assert_eq!(decide(&rules, "GET", "/api/orders", &[("x-http-method-override", "PUT")]), Ok(None));
        // With no matching method, nothing is ambiguous and a pathless target passes.
        assert_eq!(decide(&rules, "GET", "/api%2Forders", &[]), Ok(None));
        assert_eq!(decide(&rules, "OPTIONS", "*", &[]), Ok(None));
        assert_eq!(decide(&rules, "CONNECT", "shop:443", &[]), Ok(None));
        assert_eq!(decide(&rules, "POST", "*", &[]), Err(PathRefusal::NoPath));
        assert_eq!(decide(&rules, "GET", "*", &[("x-http-method", "POST")]), Err(PathRefusal::NoPath));
        assert_eq!(
            decide(&rules, "GET", "/api%2Forders", &[("x-method-override", "POST")]),
            Err(PathRefusal::Ambiguous)
        );
    }

    #[test]
    fn prefix_rules() {
        let rules = [post_rule("/api/orders", PathMatch::Prefix)];
        let decide = |target: &str| decide(&rules, "POST", target, &[]);
        for target in [
            "/api/orders",
            "/api/orders/",
            "/api/orders/42/pay",
            "/API/ORDERS/42",
            "/api/orders;x/42",
            "/api/orders/42/../43",
        ] {
            assert!(matches!(decide(target), Ok(Some(_))), "{target}");
        }
        for target in ["/api/ordersX", "/api/orders-old/1", "/api/order", "/api", "/"] {
            assert_eq!(decide(target), Ok(None), "{target}");
        }
        // Both readings protected: refused all the same (the contract's literal reading).
        assert_eq!(decide("/api/orders/a%2Fb"), Err(PathRefusal::Ambiguous));
        // The alternative reading leaves the prefix: the plain one is protected.
        assert!(matches!(decide("/api/orders/x%2F..%2F..%2Fadmin"), Ok(Some(_))));

        let root = [post_rule("/", PathMatch::Prefix)];
        for target in ["/", "/anything", "/a/b/c/", "/;x"] {
            assert!(matches!(decide_with(&root, target), Ok(Some(_))), "{target}");
        }
        let exact_root = [post_rule("/", PathMatch::Exact)];
        assert!(matches!(decide_with(&exact_root, "/"), Ok(Some(_))));
        assert!(matches!(decide_with(&exact_root, "/;x"), Ok(Some(_))));
        assert_eq!(decide_with(&exact_root, "/a"), Ok(None));
    }

    fn decide_with(rules: &[Rule], target: &str) -> Result<Option<String>, PathRefusal> {
        decide(rules, "POST", target, &[])
    }

    #[test]
    fn rule_paths_are_compiled_like_requests() {
        assert_eq!(post_rule("/api/%6Frders/", PathMatch::Exact).path(), "/api/orders");
        assert_eq!(post_rule("/api//orders;x", PathMatch::Exact).path(), "/api/orders");
        assert_eq!(post_rule("/", PathMatch::Prefix).path(), "/");
        assert_eq!(Rule::new(Method::POST, "api", PathMatch::Exact), Err(PathRefusal::NoPath));
        assert_eq!(Rule::new(Method::POST, "/%z", PathMatch::Exact), Err(PathRefusal::MalformedPercent));
        assert_eq!(Rule::new(Method::POST, "/..", PathMatch::Exact), Err(PathRefusal::AboveRoot));
        let rules = [post_rule("/api/Orders/", PathMatch::Exact)];
        assert!(matches!(decide_with(&rules, "/api/orders"), Ok(Some(_))));
    }

    #[test]
    fn match_keys() {
        assert_eq!(match_key("/api/orders;x=1/"), "/api/orders");
        assert_eq!(match_key("/a;x/b;y;z"), "/a/b");
        assert_eq!(match_key("/"), "/");
        assert_eq!(match_key("/;x"), "/");
        assert_eq!(match_key("/a//"), "/a/", "one trailing slash only");
        assert!(matches!(match_key("/api/orders/"), Cow::Borrowed("/api/orders")));
    }

    #[test]
    fn forwarded_for_reads_every_line() {
        let mut headers = HeaderMap::new();
        assert_eq!(forwarded_for(&headers), None);
        headers.append("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        assert!(matches!(forwarded_for(&headers), Some(Cow::Borrowed("6.6.6.6"))));
        headers.append("x-forwarded-for", HeaderValue::from_static("1.2.3.4, 10.0.0.7"));
        assert_eq!(forwarded_for(&headers).as_deref(), Some("6.6.6.6, 1.2.3.4, 10.0.0.7"));
        headers.append("x-forwarded-for", HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(forwarded_for(&headers).as_deref(), Some("6.6.6.6, 1.2.3.4, 10.0.0.7, unreadable"));

        // With rules::client_address: HAProxy's appended line is the one believed.
        let trusted = vec![crate::rules::Cidr::parse("10.0.0.0/8").unwrap()];
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", HeaderValue::from_static("9.9.9.9"));
        headers.append("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        let peer = "10.0.0.1".parse().unwrap();
        let address = crate::rules::client_address(peer, forwarded_for(&headers).as_deref(), &trusted);
        assert_eq!(address, "1.2.3.4".parse::<std::net::IpAddr>().unwrap());
    }
}
