//! Properties of the canonical path and of protection (contract section 12) over many generated
//! targets (proptest): what `waitroom::paths`'s unit tests show for the contract's and issue 14's
//! examples holds for every target, including arbitrary bytes.

use std::borrow::Cow;

use http::{HeaderMap, Method};
use proptest::prelude::*;
use waitroom::paths::{canonical_path, classify, PathMatch, PathRefusal, Rule, Verdict};

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Everything a canonical path promises, asserted.
fn assert_canonical(path: &str) {
    let bytes = path.as_bytes();
    assert!(path.starts_with('/'), "{path:?}");
    assert!(!path.contains("//"), "{path:?}");
    assert!(path.is_ascii(), "{path:?}");
    for segment in path[1..].split('/') {
        assert!(segment != "." && segment != "..", "dot segment in {path:?}");
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = &path[i + 1..i + 3];
            assert!(hex.bytes().all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(&h)), "{path:?}");
            let value = u8::from_str_radix(hex, 16).unwrap();
            assert!(!is_unreserved(value), "encoded unreserved {hex} in {path:?}");
            i += 3;
            continue;
        }
        assert!(
            is_unreserved(b) || b"!$&'()*+,;=:@/".contains(&b),
            "byte {b:#04x} a path may not carry, in {path:?}"
        );
        i += 1;
    }
}

/// RFC 3986 5.2.4, transcribed step by step (input and output buffers), as the reference the
/// canonical path is compared with. Also says whether rule C or D ever had no segment to
/// remove, i.e. whether the path climbs above the root (the RFC stays at the root; the
/// contract refuses).
fn rfc_remove_dot_segments(path: &str) -> (String, bool) {
    let mut input = path.to_string();
    let mut output = String::new();
    let mut climbed = false;
    let mut remove_last = |output: &mut String| match output.rfind('/') {
        Some(i) => output.truncate(i),
        None => climbed = true,
    };
    while !input.is_empty() {
        if let Some(rest) = input.strip_prefix("../").or_else(|| input.strip_prefix("./")) {
            input = rest.to_string(); // A
        } else if input.starts_with("/./") {
            input.replace_range(..3, "/"); // B
        } else if input == "/." {
            input = "/".into(); // B
        } else if input.starts_with("/../") {
            input.replace_range(..4, "/"); // C
            remove_last(&mut output);
        } else if input == "/.." {
            input = "/".into(); // C
            remove_last(&mut output);
        } else if input == "." || input == ".." {
            input.clear(); // D
        } else {
            // E: the first segment, with its leading `/`, moves to the output.
            let start = usize::from(input.starts_with('/'));
            let end = input[start..].find('/').map_or(input.len(), |i| i + start);
            output.push_str(&input[..end]);
            input.replace_range(..end, "");
        }
    }
    (output, climbed)
}

#[test]
fn the_reference_reproduces_rfc3986_examples() {
    // 5.2.4's own walk-throughs, then 5.4's examples merged with the base path /b/c/d;p.
    assert_eq!(rfc_remove_dot_segments("/a/b/c/./../../g"), ("/a/g".into(), false));
    assert_eq!(rfc_remove_dot_segments("mid/content=5/../6"), ("mid/6".into(), false));
    for (reference, expected, climbs) in [
        ("g", "/b/c/g", false),
        ("./g", "/b/c/g", false),
        ("g/", "/b/c/g/", false),
        (".", "/b/c/", false),
        ("./", "/b/c/", false),
        ("..", "/b/", false),
        ("../", "/b/", false),
        ("../g", "/b/g", false),
        ("../..", "/", false),
        ("../../", "/", false),
        ("../../g", "/g", false),
        ("../../../g", "/g", true),
        ("../../../../g", "/g", true),
        ("g.", "/b/c/g.", false),
        (".g", "/b/c/.g", false),
        ("g..", "/b/c/g..", false),
        ("..g", "/b/c/..g", false),
        ("./../g", "/b/g", false),
        ("./g/.", "/b/c/g/", false),
        ("g/./h", "/b/c/g/h", false),
        ("g/../h", "/b/c/h", false),
        ("g;x=1/./y", "/b/c/g;x=1/y", false),
        ("g;x=1/../y", "/b/c/y", false),
    ] {
        let merged = format!("/b/c/{reference}");
        assert_eq!(rfc_remove_dot_segments(&merged), (expected.to_string(), climbs), "{reference}");
        let ours = canonical_path(&merged).map(|c| c.path().to_string());
        if climbs {
            assert_eq!(ours, Err(PathRefusal::AboveRoot), "{reference}");
        } else {
            assert_eq!(ours, Ok(expected.to_string()), "{reference}");
        }
    }
    assert_eq!(rfc_remove_dot_segments("/./g"), ("/g".into(), false));
    assert_eq!(rfc_remove_dot_segments("/../g"), ("/g".into(), true));
}

/// A path made of segments that exercise the dot rules, some with encoded dots.
fn dotty_path() -> impl Strategy<Value = String> {
    let segment = prop_oneof![
        Just("a"),
        Just("b"),
        Just("g;x=1"),
        Just("."),
        Just(".."),
        Just(""),
        Just("%2E"),
        Just("%2e%2E"),
        Just(".%2e"),
        Just("..."),
        Just("%41b"),
    ];
    (proptest::collection::vec(segment, 0..10), any::<bool>()).prop_map(|(segments, trailing)| {
        let mut path = format!("/{}", segments.join("/"));
        if trailing {
            path.push('/');
        }
        path
    })
}

/// The decoding the dotty alphabet needs: `%2E`/`%2e` is `.`, `%41` is `A`.
fn decode_dotty(path: &str) -> String {
    path.replace("%2E", ".").replace("%2e", ".").replace("%41", "A")
}

fn merge_slashes(path: &str) -> String {
    let mut out = String::new();
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// A protected rule's path, in lower case letters.
fn rule_path() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec("[a-z]{1,6}", 1..4)
}

/// How a backend might spell the same path: each a rewrite that Tomcat, Express, Go or Flask
/// routes like the original.
#[derive(Debug, Clone)]
enum Spelling {
    Case(usize),
    EncodeUnreserved { at: usize, lower_hex: bool },
    Param(usize),
    DoubleSlash(usize),
    DotSegment(usize),
    DotDotSegment(usize),
    TrailingSlash,
    EncodedSlash { at: usize, which: usize },
}

fn spelling() -> impl Strategy<Value = Spelling> {
    prop_oneof![
        any::<usize>().prop_map(Spelling::Case),
        (any::<usize>(), any::<bool>()).prop_map(|(at, lower_hex)| Spelling::EncodeUnreserved { at, lower_hex }),
        any::<usize>().prop_map(Spelling::Param),
        any::<usize>().prop_map(Spelling::DoubleSlash),
        any::<usize>().prop_map(Spelling::DotSegment),
        any::<usize>().prop_map(Spelling::DotDotSegment),
        Just(Spelling::TrailingSlash),
        (any::<usize>(), 0usize..4).prop_map(|(at, which)| Spelling::EncodedSlash { at, which }),
    ]
}

/// Applies a spelling to a path of letters and slashes (with what earlier spellings added).
fn respell(path: &str, spelling: &Spelling) -> String {
    let slashes: Vec<usize> = path.match_indices('/').map(|(i, _)| i).collect();
    let letters: Vec<usize> = path
        .char_indices()
        .filter(|(i, c)| c.is_ascii_alphabetic() && !path[..*i].ends_with('%') && !path[..*i].ends_with(';'))
        .map(|(i, _)| i)
        .collect();
    let at_slash = |n: usize| slashes[n % slashes.len()];
    match *spelling {
        Spelling::Case(n) if !letters.is_empty() => {
            let i = letters[n % letters.len()];
            let mut out = path.to_string();
            let c = path.as_bytes()[i];
            let flipped = if c.is_ascii_lowercase() { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() };
            out.replace_range(i..i + 1, std::str::from_utf8(&[flipped]).unwrap());
            out
        }
        Spelling::EncodeUnreserved { at, lower_hex } if !letters.is_empty() => {
            let i = letters[at % letters.len()];
            // Only a letter not inside an escape or parameter: `%41` decodes back to it.
            if path[..i].rfind('%').is_some_and(|p| i - p <= 2) || path[..i].contains(';') {
                return path.to_string();
            }
            let hex = format!("%{:02X}", path.as_bytes()[i]);
            let hex = if lower_hex { hex.to_lowercase() } else { hex };
            format!("{}{hex}{}", &path[..i], &path[i + 1..])
        }
        Spelling::Param(n) => {
            // `;x=1` at the end of a segment: before a slash or at the end.
            let i = (slashes.iter().copied().filter(|&i| i > 0).chain([path.len()]))
                .nth(n % slashes.len())
                .unwrap_or(path.len());
            format!("{};x=1{}", &path[..i], &path[i..])
        }
        Spelling::DoubleSlash(n) => {
            let i = at_slash(n);
            format!("{}/{}", &path[..i], &path[i..])
        }
        Spelling::DotSegment(n) => {
            let i = at_slash(n);
            format!("{}/.{}", &path[..i], &path[i..])
        }
        Spelling::DotDotSegment(n) => {
            let i = at_slash(n);
            format!("{}/zz/..{}", &path[..i], &path[i..])
        }
        Spelling::TrailingSlash if !path.ends_with('/') => format!("{path}/"),
        Spelling::EncodedSlash { at, which } if slashes.len() > 1 => {
            // Not the leading slash: `%2Fapi` is no path at all.
            let i = slashes[1 + at % (slashes.len() - 1)];
            let slash = ["%2F", "%2f", "%5C", "\\"][which];
            format!("{}{slash}{}", &path[..i], &path[i + 1..])
        }
        _ => path.to_string(),
    }
}

fn headers() -> HeaderMap {
    HeaderMap::new()
}

/// Counts this thread's allocations, so a test can show the hot path makes none.
struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations_of(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(|n| n.get());
    f();
    ALLOCATIONS.with(|n| n.get()) - before
}

/// A request whose path is already canonical costs no allocation, protected or not, with or
/// without a query, with an override header that names another method.
#[test]
fn canonical_paths_allocate_nothing() {
    let rules = [
        Rule::new(Method::POST, "/api/orders", PathMatch::Exact).unwrap(),
        Rule::new(Method::PUT, "/api/carts", PathMatch::Prefix).unwrap(),
    ];
    let mut with_override = HeaderMap::new();
    with_override.insert("x-http-method-override", http::HeaderValue::from_static("PATCH"));
    let empty = headers();
    for (method, target, headers) in [
        (Method::GET, "/static/app.js?v=3", &empty),
        (Method::POST, "/api/orders", &empty),
        (Method::POST, "/api/orders?id=1&x=%2e", &empty),
        (Method::POST, "/api/orders/", &empty),
        (Method::PUT, "/api/carts/42/items", &empty),
        (Method::POST, "/somewhere/else", &with_override),
        (Method::GET, "/a%20b/%C3%A9", &empty),
    ] {
        let count = allocations_of(|| {
            let verdict = classify(&rules, &method, headers, target).unwrap();
            if let Verdict::Protected(c) = &verdict {
                assert!(matches!(c.forward_target(), Cow::Borrowed(_)));
            }
            std::hint::black_box(verdict);
        });
        assert_eq!(count, 0, "{method} {target}");
    }
    // The count itself works: a path to rewrite allocates.
    assert!(allocations_of(|| drop(std::hint::black_box(canonical_path("/a//b").unwrap()))) > 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_on_bytes(target in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(c) = canonical_path(&target[..]) {
            assert_canonical(c.path());
            let _ = c.forward_target();
        }
        let rules = [Rule::new(Method::POST, "/api/orders", PathMatch::Prefix).unwrap()];
        let _ = classify(&rules, &Method::POST, &headers(), &target[..]);
    }

    #[test]
    fn canonical_paths_keep_their_promises(target in "(/|[a-z]+://[a-z]*)[a-zA-Z0-9%./;\\\\?#~_-]{0,40}") {
        if let Ok(c) = canonical_path(&target) {
            assert_canonical(c.path());
        }
    }

    #[test]
    fn canonicalisation_is_idempotent(target in "/[a-zA-Z0-9%./;\\\\?#~_ é-]{0,40}") {
        if let Ok(c) = canonical_path(&target) {
            let again = canonical_path(c.path()).expect("a canonical path is accepted");
            prop_assert_eq!(again.path(), c.path());
            prop_assert!(matches!(again.forward_target(), Cow::Borrowed(_)), "a canonical path is borrowed");
            // The forwarded target is the canonical path and the original query.
            let forward = c.forward_target().into_owned();
            let forwarded = canonical_path(&forward[..]).unwrap();
            prop_assert_eq!(forwarded.path(), c.path());
            prop_assert_eq!(forwarded.query(), c.query());
        }
    }

    #[test]
    fn agrees_with_rfc3986_remove_dot_segments(path in dotty_path()) {
        let (expected, climbs) = rfc_remove_dot_segments(&merge_slashes(&decode_dotty(&path)));
        match canonical_path(&path) {
            Ok(c) => {
                prop_assert!(!climbs, "{} climbs, accepted as {}", path, c.path());
                prop_assert_eq!(c.path(), expected.as_str());
            }
            Err(refusal) => {
                prop_assert_eq!(refusal, PathRefusal::AboveRoot);
                prop_assert!(climbs, "{} refused, RFC gives {}", path, expected);
            }
        }
    }

    /// The room's promise: however a protected path is respelled, the request is protected or
    /// refused, never passed through.
    #[test]
    fn respelled_protected_paths_never_pass(
        rule in rule_path(),
        below in proptest::collection::vec("[a-z]{1,4}", 0..3),
        prefix in any::<bool>(),
        spellings in proptest::collection::vec(spelling(), 0..6),
        method in prop_oneof![Just("POST"), Just("post"), Just("Post")],
    ) {
        let rule_path = format!("/{}", rule.join("/"));
        let matching = if prefix { PathMatch::Prefix } else { PathMatch::Exact };
        let rules = [Rule::new(Method::POST, &rule_path, matching).unwrap()];
        let mut path = rule_path.clone();
        if prefix && !below.is_empty() {
            path = format!("{path}/{}", below.join("/"));
        }
        for s in &spellings {
            path = respell(&path, s);
        }
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let verdict = classify(&rules, &method, &headers(), &path);
        prop_assert!(
            !matches!(verdict, Ok(Verdict::PassThrough)),
            "{} passes through the rule {:?} {}", path, matching, rule_path
        );
        if let Ok(Verdict::Protected(c)) = verdict {
            // What is forwarded is what was checked: classified again, it is protected as is.
            let forward = c.forward_target().into_owned();
            match classify(&rules, &method, &headers(), &forward[..]) {
                Ok(Verdict::Protected(again)) => {
                    prop_assert!(matches!(again.forward_target(), Cow::Borrowed(_)));
                }
                other => prop_assert!(false, "forwarded {:?} classifies as {:?}", String::from_utf8_lossy(&forward), other),
            }
        }
    }

    /// A target starting with `//` is also read as `//host/path`, as Node's
    /// `new URL(req.url, base)` and Python's `urlsplit` read it: with a protected path, however
    /// respelled, after a host however written, it is refused; with another path it passes.
    #[test]
    fn a_host_in_front_of_a_protected_path_is_refused(
        rule in proptest::collection::vec("[a-m]{1,6}", 1..4),
        prefix in any::<bool>(),
        spellings in proptest::collection::vec(spelling(), 0..4),
        host in "[n-z]{1,6}",
        written in 0usize..6,
        other in proptest::collection::vec("[n-z]{1,6}", 0..3),
    ) {
        let rule_path = format!("/{}", rule.join("/"));
        let matching = if prefix { PathMatch::Prefix } else { PathMatch::Exact };
        let rules = [Rule::new(Method::POST, &rule_path, matching).unwrap()];
        // The host as WHATWG reads it (any run of `/` and `\` before it, userinfo, a port), and
        // as only Python does (a `\` inside it; WHATWG ends the host there).
        let front = match written {
            0 => format!("//{host}"),
            1 => format!("/\\{host}"),
            2 => format!("///{host}"),
            3 => format!("//user@{host}:8080"),
            4 => format!("//\\{host}"),
            _ => format!("//{host}\\{host}"),
        };
        let mut path = rule_path.clone();
        for s in &spellings {
            path = respell(&path, s);
        }
        let target = format!("{front}{path}");
        prop_assert_eq!(
            classify(&rules, &Method::POST, &headers(), &target),
            Err(PathRefusal::NetworkPath),
            "{} with the rule {:?} {}", target, matching, rule_path
        );
        let target = format!("{front}/{}", other.join("/"));
        prop_assert_eq!(classify(&rules, &Method::POST, &headers(), &target), Ok(Verdict::PassThrough), "{}", target);
    }

    /// A request no rule's method names is never refused for ambiguity, and a canonical path
    /// that does not name a rule's path passes.
    #[test]
    fn other_methods_pass_unless_the_path_is_invalid(target in "/[a-zA-Z0-9%./;\\\\~_-]{0,40}") {
        let rules = [Rule::new(Method::POST, "/api/orders", PathMatch::Prefix).unwrap()];
        match classify(&rules, &Method::GET, &headers(), &target) {
            Ok(Verdict::PassThrough) => {}
            Err(PathRefusal::MalformedPercent) | Err(PathRefusal::AboveRoot) => {
                prop_assert!(canonical_path(&target).is_err());
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
