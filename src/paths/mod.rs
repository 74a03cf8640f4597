//! Which requests are protected (contract section 12): the canonical path of a request target,
//! the rules' matching, and the readings a backend might make that the proxy refuses to guess.
//!
//! Pure: no I/O, no pingora types. The proxy reads each request's raw target once
//! ([`Target::read`]; `RequestHeader::raw_path()`, bytes, so a non-UTF-8 target is judged and not
//! lost), checks it against each room's rules ([`Target::check`]; [`classify`] is both for one set
//! of rules) and renders a [`PathRefusal`] as 400.
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

mod canonical;
mod rules;

use std::borrow::Cow;
use std::cell::OnceCell;

use http::{HeaderMap, Method};

pub use canonical::{canonical_path, Canonical, PathRefusal};
use canonical::decode;
pub use rules::{match_key, Methods, PathMatch, Rule};
use rules::{network_path_readings, reading_key, Reading};

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
///   [`Methods`]), and the match key of the canonical path is the rule's path.
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
    let target = Target::read(target);
    if !target.check(rules, &Methods::of(method, headers))? {
        return Ok(Verdict::PassThrough);
    }
    match target.read {
        Ok(read) => Ok(Verdict::Protected(read.canonical)),
        Err(refusal) => Err(refusal),
    }
}

/// A request target read once, then judged against any number of rule sets ([`Target::check`],
/// one per room): reading it costs scans of the target, judging it only compares keys, so a proxy
/// with fifty rooms reads each request once and not fifty times. [`classify`] is one read and
/// one check.
pub struct Target<'a> {
    raw: &'a [u8],
    read: Result<Read<'a>, PathRefusal>,
}

struct Read<'a> {
    canonical: Canonical<'a>,
    /// The match key of the canonical path.
    plain: Cow<'a, str>,
    /// The other readings' keys, made the first time a rule's method matches: a request no rule
    /// could protect never pays for them.
    others: OnceCell<Others>,
}

/// The keys of the readings other than the plain one (see [`classify`]).
struct Others {
    /// The paths after the host of a target starting with `//`, in every reading; any protected
    /// one refuses the request, even the plain reading itself.
    network: Vec<String>,
    /// The alternative readings that differ from the plain one.
    alternatives: Vec<String>,
}

impl<'a> Target<'a> {
    pub fn read<T: AsRef<[u8]> + ?Sized>(target: &'a T) -> Target<'a> {
        let raw = target.as_ref();
        let read = canonical_path(raw).map(|canonical| {
            let plain = match &canonical.path {
                Cow::Borrowed(path) => match_key(path),
                Cow::Owned(path) => Cow::Owned(match_key(path).into_owned()),
            };
            Read { canonical, plain, others: OnceCell::new() }
        });
        Target { raw, read }
    }

    /// What `rules` make of the target: `Ok(true)` protected (forwarded with
    /// [`Target::canonical`]'s target), `Ok(false)` passed through as it came, or refused.
    pub fn check(&self, rules: &[Rule], methods: &Methods<'_>) -> Result<bool, PathRefusal> {
        let candidates = || rules.iter().filter(|r| methods.include(&r.method));
        let mut first = candidates().peekable();
        let could_be_protected = first.peek().is_some();
        let read = match &self.read {
            Ok(read) => read,
            // `OPTIONS *`, `CONNECT host:443`: nothing here could be protected.
            Err(PathRefusal::NoPath) if !could_be_protected => return Ok(false),
            Err(refusal) => return Err(*refusal),
        };
        if !could_be_protected {
            return Ok(false);
        }
        let protected = |key: &str| candidates().any(|r| r.covers(key.as_bytes()));
        let others = read.others.get_or_init(|| Others::of(self.raw, &read.canonical, &read.plain));
        if others.network.is_empty() && others.alternatives.is_empty() {
            // The common case: the plain reading only, each rule's method compared once.
            return Ok(first.any(|r| r.covers(read.plain.as_bytes())));
        }
        if others.network.iter().any(|key| protected(key)) {
            return Err(PathRefusal::NetworkPath);
        }
        if others.alternatives.iter().any(|key| protected(key)) {
            return Err(PathRefusal::Ambiguous);
        }
        Ok(protected(&read.plain))
    }

    /// The canonical reading; `None` for a target refused whatever the rules (or naming no path).
    pub fn canonical(&self) -> Option<&Canonical<'a>> {
        self.read.as_ref().ok().map(|read| &read.canonical)
    }
}

impl Others {
    fn of(target: &[u8], canonical: &Canonical<'_>, plain: &str) -> Others {
        let readings = || {
            (0..8u8).map(|bits| Reading { slashes: bits & 1 != 0, params_first: bits & 2 != 0, dots_first: bits & 4 != 0 })
        };
        // Rare (browsers and client libraries never send a target starting with `//`): what this
        // allocates costs the common case nothing.
        let mut network = Vec::new();
        for path in network_path_readings(target) {
            // The path is a part of the target's path, which decoded: this cannot fail.
            let Ok(decoded) = decode(&path) else { continue };
            network.extend(readings().map(|reading| reading_key(&decoded, reading)));
        }
        // Only a path with one of these has another reading: the common case stops here.
        let mut alternatives = Vec::new();
        let raw = canonical.raw_path;
        let maybe_slashes = raw.contains(&b'\\') || raw.contains(&b'%');
        let params = raw.contains(&b';');
        let double = contains(raw, b"//");
        if maybe_slashes || params || double {
            let decoded = decode(raw).expect("the canonical path decoded it");
            let slashes = contains(&decoded, b"%2F") || contains(&decoded, b"%5C");
            for reading in readings().skip(1) {
                if (reading.slashes && !slashes) || (reading.params_first && !params) || (reading.dots_first && !double) {
                    continue;
                }
                let alternative = reading_key(&decoded, reading);
                if alternative != plain {
                    alternatives.push(alternative);
                }
            }
        }
        Others { network, alternatives }
    }
}

// ---- a room's prefix ---------------------------------------------------------------------------

/// `bytes` after `prefix`, when it starts with it. A request is offered to every room before the
/// one it is for, and rooms' prefixes differ from a path within their first 8 bytes as a rule
/// (`/queue/s...` and `/queue/c...`): those are compared as one word, so every other room costs
/// a compare and not a call to `memcmp`.
pub fn after_prefix<'a>(bytes: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    if let (Some(head), Some(wanted)) = (bytes.first_chunk::<8>(), prefix.first_chunk::<8>()) {
        if u64::from_ne_bytes(*head) != u64::from_ne_bytes(*wanted) {
            return None;
        }
    }
    bytes.strip_prefix(prefix)
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
    fn after_a_prefix() {
        for (bytes, prefix, rest) in [
            (&b"/queue/sneakers/enter"[..], &b"/queue/sneakers"[..], Some(&b"/enter"[..])),
            (b"/queue/console/enter", b"/queue/sneakers", None),
            (b"/queue/sneaker", b"/queue/sneakers", None),
            (b"/q/enter", b"/q", Some(&b"/enter"[..])),
            (b"/r/enter", b"/q", None),
            (b"/queue/s", b"/queue/sneakers", None),
            (b"/queue/sneakers", b"/queue/sneakers", Some(&b""[..])),
            (b"", b"/q", None),
        ] {
            assert_eq!(after_prefix(bytes, prefix), rest, "{:?} after {:?}", String::from_utf8_lossy(bytes), String::from_utf8_lossy(prefix));
        }
    }

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
