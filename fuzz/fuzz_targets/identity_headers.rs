//! The identity header check and JWT verification on arbitrary bytes, arriving as the trusted
//! header, a bearer token or a cookie: never a panic; a refusal is 400 or 401; an accepted user
//! is printable ASCII of at most 256 bytes, and in header mode exactly the header's value.

#![no_main]

#[path = "common.rs"]
mod common;

use http::header::{AUTHORIZATION, COOKIE};
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use waitroom::config::IdentityConfig;
use waitroom::identity::{cookie, identify};

fn value(parts: &[&[u8]]) -> Option<HeaderValue> {
    HeaderValue::from_bytes(&parts.concat()).ok()
}

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    if let Some(v) = value(&[data]) {
        headers.insert("x-user-id", v);
    }
    if let Some(v) = value(&[b"Bearer ", data]) {
        headers.insert(AUTHORIZATION, v);
    }
    if let Some(v) = value(&[b"theme=dark; wr_id=", data]) {
        headers.insert(COOKIE, v);
    }
    // The raw bytes as a whole Cookie header too, for the cookie parser itself.
    if let Some(v) = value(&[data]) {
        headers.append(COOKIE, v);
    }
    let _ = cookie(&headers, "wr_id");
    for config in common::IDENTITIES.iter() {
        match identify(config, &headers) {
            Ok(user) => {
                common::assert_valid_user(&user);
                if matches!(config, IdentityConfig::Header(_)) {
                    assert_eq!(user.as_bytes(), data);
                }
            }
            Err(refusal) => assert!(matches!(refusal.status(), 400 | 401), "{refusal:?}"),
        }
        if let IdentityConfig::Jwt(verifier) = config {
            match verifier.verify_token(data) {
                Ok(user) => common::assert_valid_user(&user),
                Err(refusal) => assert!(matches!(refusal.status(), 400 | 401), "{refusal:?}"),
            }
        }
    }
});
