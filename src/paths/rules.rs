//! The `protected` rules and what they are compared with: a rule's method (or one an override
//! header names) and its match key, and the other ways a backend might read the same path. The
//! readings live beside the rules because they exist only to ask "could a backend route this to a
//! protected path?"; the decision itself is `classify`'s.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, Method};

use super::canonical::{canonical_path, merge_slashes, remove_dot_segments, Climb, PathRefusal};

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
    pub(super) method: Method,
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
        // Methods match ASCII-case-insensitively: held upper-case, a rule's is compared with a
        // request's (upper-cased once, see `Methods`) as one value, not byte by byte.
        Ok(Rule { method: upper_case(method), key, matching })
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

    /// Whether some request could match both this rule and `other`: the same method, and one
    /// rule's path among those the other matches (two rooms' rules must never both claim one
    /// request, contract section 17).
    pub fn overlaps(&self, other: &Rule) -> bool {
        self.method == other.method && (self.covers(other.key.as_bytes()) || other.covers(self.key.as_bytes()))
    }

    /// Whether this rule matches the path `path` (canonical), whatever the method.
    pub fn covers_path(&self, path: &str) -> bool {
        self.covers(match_key(path).as_bytes())
    }

    /// Whether a match key (see [`match_key`]) is this rule's path, ASCII-case-insensitively.
    pub(super) fn covers(&self, key: &[u8]) -> bool {
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

/// A request's method, and whether override headers name others, read once: each room's rules
/// are then compared without looking the headers up again (three lookups a rule, which fifty
/// rooms would make a third of a pass-through request's cost). A rule matches when the method,
/// or one an override header names, is its method ASCII-case-insensitively (some backends
/// upper-case `post`); every line of each override header counts, and each comma-separated item
/// of a line (backends disagree about which one they use).
pub struct Methods<'h> {
    /// The request's method, upper-cased.
    method: Method,
    /// The headers, when an override header is among them (rare): only then are they read again.
    overrides: Option<&'h HeaderMap>,
}

impl<'h> Methods<'h> {
    pub fn of(method: &Method, headers: &'h HeaderMap) -> Methods<'h> {
        // One pass over the request's few header names costs less than three hashed lookups.
        let overridden = headers.keys().any(|name| METHOD_OVERRIDES.contains(name));
        Methods { method: upper_case(method.clone()), overrides: overridden.then_some(headers) }
    }

    /// Whether the request's method, or one its override headers name, is `wanted`
    /// (ASCII-case-insensitively; a rule's method is upper-case already).
    pub fn include(&self, wanted: &Method) -> bool {
        if self.method == *wanted {
            return true;
        }
        let Some(headers) = self.overrides else { return false };
        let wanted = wanted.as_str().as_bytes();
        METHOD_OVERRIDES.iter().any(|name| {
            headers.get_all(name).iter().any(|value| {
                let value = value.as_bytes();
                value.trim_ascii().eq_ignore_ascii_case(wanted)
                    || value.split(|&b| b == b',').any(|item| item.trim_ascii().eq_ignore_ascii_case(wanted))
            })
        })
    }
}

/// `method` upper-cased; as it is when already (the common case: nothing is allocated).
fn upper_case(method: Method) -> Method {
    if !method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return method;
    }
    // Upper-casing keeps a token a token.
    Method::from_bytes(method.as_str().to_ascii_uppercase().as_bytes()).unwrap_or(method)
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

/// How a backend might read a path other than the canonical way (see
/// [`classify`](super::classify)).
#[derive(Debug, Clone, Copy)]
pub(super) struct Reading {
    /// `%2F`, `%5C` and `\` as `/`.
    pub(super) slashes: bool,
    /// `;` parameters removed before dot segments are resolved (Tomcat: `/x/..;/a` is `/a`).
    pub(super) params_first: bool,
    /// Dot segments resolved before `//` is merged (a WHATWG URL parser: `/a/b//..` is `/a/b/`).
    pub(super) dots_first: bool,
}

/// A reading's match key, from the path after step 1 (decoding): the readings must see a `%2F`
/// or a `//` before a `..` has removed it. Dot segments climbing above the root are dropped.
pub(super) fn reading_key(decoded: &[u8], reading: Reading) -> String {
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
pub(super) fn network_path_readings(target: &[u8]) -> Vec<Vec<u8>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_match_whatever_their_case_once_read() {
        let rule = Rule::new(Method::from_bytes(b"post").unwrap(), "/api/orders", PathMatch::Exact).unwrap();
        assert_eq!(rule.method(), &Method::POST);
        let none = HeaderMap::new();
        let lower = Method::from_bytes(b"pOsT").unwrap();
        assert!(Methods::of(&lower, &none).include(rule.method()));
        assert!(Methods::of(&Method::POST, &none).include(rule.method()));
        assert!(!Methods::of(&Method::GET, &none).include(rule.method()));
        let mut overridden = HeaderMap::new();
        overridden.append("x-http-method", http::HeaderValue::from_static("get, post "));
        assert!(Methods::of(&Method::GET, &overridden).include(rule.method()));
        let odd = Rule::new(Method::from_bytes(b"purge").unwrap(), "/cache", PathMatch::Prefix).unwrap();
        assert!(Methods::of(&Method::from_bytes(b"PURGE").unwrap(), &none).include(odd.method()));
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
}
