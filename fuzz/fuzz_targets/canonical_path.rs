//! The canonical path (contract section 12) and the protection decision on arbitrary request
//! targets: never a panic; a canonical path keeps its promises (starts with `/`, no `//`, no dot
//! segment, ASCII, upper-case escapes never of an unreserved character) and is its own canonical
//! path; what a protected request is forwarded with is protected again, unchanged.

#![no_main]

use std::borrow::Cow;
use std::sync::LazyLock;

use http::{HeaderMap, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;
use waitroom::paths::{canonical_path, classify, PathMatch, Rule, Verdict};

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        Rule::new(Method::POST, "/api/orders", PathMatch::Exact).unwrap(),
        Rule::new(Method::PUT, "/api/carts", PathMatch::Prefix).unwrap(),
    ]
});

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn assert_canonical(path: &str) {
    let bytes = path.as_bytes();
    assert!(path.starts_with('/') && !path.contains("//") && path.is_ascii(), "{path:?}");
    assert!(path[1..].split('/').all(|s| s != "." && s != ".."), "{path:?}");
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = &bytes[i + 1..i + 3];
            assert!(hex.iter().all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)), "{path:?}");
            let value = u8::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap();
            assert!(!is_unreserved(value), "{path:?}");
            i += 3;
        } else {
            assert!(is_unreserved(bytes[i]) || b"!$&'()*+,;=:@/".contains(&bytes[i]), "{path:?}");
            i += 1;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the method and whether an override header names POST.
    let (choice, target) = data.split_first().map_or((0, data), |(c, rest)| (*c, rest));
    if let Ok(c) = canonical_path(target) {
        assert_canonical(c.path());
        let again = canonical_path(c.path()).expect("a canonical path is accepted");
        assert_eq!(again.path(), c.path());
        assert!(matches!(again.forward_target(), Cow::Borrowed(_)));
        let forward = c.forward_target();
        let forwarded = canonical_path(&forward[..]).expect("a forward target is accepted");
        assert_eq!((forwarded.path(), forwarded.query()), (c.path(), c.query()));
    }
    let method = [Method::POST, Method::GET, Method::PUT, Method::OPTIONS][(choice & 3) as usize].clone();
    let mut headers = HeaderMap::new();
    if choice & 4 != 0 {
        headers.insert("x-http-method-override", HeaderValue::from_static("post"));
    }
    if let Ok(Verdict::Protected(c)) = classify(&RULES, &method, &headers, target) {
        let forward = c.forward_target();
        match classify(&RULES, &method, &headers, &forward[..]) {
            Ok(Verdict::Protected(again)) => assert_eq!(again.forward_target(), forward),
            other => panic!("forwarded {:?} classifies as {other:?}", String::from_utf8_lossy(&forward)),
        }
    }
});
