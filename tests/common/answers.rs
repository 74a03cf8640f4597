//! What the proxy's own answers look like (contract section 3): JSON, never cached, exactly the
//! keys shown. One copy of each check, so that every test file holds the proxy to the same rules.

use super::client::Resp;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// A room where nobody is admitted while the test runs: its first tick (at start, on an empty
/// line) is the only one within the hour. Pair with `ProxyBuilder::start_settled`.
pub const NO_ADMISSION: &str = "admission: {interval: 1h, batch_size: 1}";

/// Every answer the proxy writes itself: JSON, never cached (section 3, first paragraph).
/// Takes the two headers rather than a `Resp` so that raw-socket answers are held to it too.
#[track_caller]
pub fn assert_own_headers(ctx: &str, content_type: Option<&str>, cache_control: Option<&str>) {
    let mime = content_type
        .unwrap_or_else(|| panic!("{ctx}: no Content-Type"))
        .split(';')
        .next()
        .unwrap()
        .trim();
    assert!(
        mime.eq_ignore_ascii_case("application/json"),
        "{ctx}: Content-Type {content_type:?}, want application/json"
    );
    let cc = cache_control.unwrap_or_else(|| panic!("{ctx}: no Cache-Control"));
    assert!(
        cc.split(',')
            .any(|d| d.trim().eq_ignore_ascii_case("no-store")),
        "{ctx}: Cache-Control {cc:?}, want no-store"
    );
}

/// Status, the JSON headers and the exact body.
#[track_caller]
pub fn assert_answer(ctx: &str, r: &Resp, status: u16, body: Value) {
    assert_eq!(r.status, status, "{ctx}: status; body {}", r.body);
    assert_own_headers(ctx, r.header("content-type"), r.header("cache-control"));
    assert_eq!(r.json(), body, "{ctx}: body");
}

/// An error answer: `{"error": "<reason>"}` and nothing else, JSON, never cached.
#[track_caller]
pub fn assert_error(ctx: &str, r: &Resp, status: u16) {
    assert_eq!(r.status, status, "{ctx}: status; body {}", r.body);
    assert_own_headers(ctx, r.header("content-type"), r.header("cache-control"));
    assert_error_body(ctx, &r.json());
}

/// `{"error": "<non-empty string>"}` and no other key.
#[track_caller]
pub fn assert_error_body(ctx: &str, body: &Value) {
    let obj = body
        .as_object()
        .unwrap_or_else(|| panic!("{ctx}: body is not an object: {body}"));
    assert_eq!(
        obj.keys().collect::<Vec<_>>(),
        vec!["error"],
        "{ctx}: only `error`: {body}"
    );
    assert!(
        obj["error"].as_str().is_some_and(|s| !s.is_empty()),
        "{ctx}: `error` must be a non-empty string: {body}"
    );
}

/// The WAITING body, exactly.
pub fn waiting(position: u64, eta: u64, poll_after: u64) -> Value {
    json!({"status": "WAITING", "position": position, "estimatedWaitTime": eta, "pollAfter": poll_after})
}

/// WAITING in a `NO_ADMISSION` room (one user an hour: eta = position x 3600 past the first
/// batch of one) whose poll_after tiers end in `poll_after` for the first batch and `beyond` after.
pub fn waiting_no_admission(position: u64, first: u64, beyond: u64) -> Value {
    if position <= 1 {
        waiting(position, 0, first)
    } else {
        waiting(position, position * 3600, beyond)
    }
}

pub fn not_in_queue() -> Value {
    json!({"status": "NOT_IN_QUEUE", "pollAfter": null})
}

/// The body's `status` field, `-` when there is none (an error body).
pub fn status_of(r: &Resp) -> String {
    r.json()["status"].as_str().unwrap_or("-").to_owned()
}

/// Canonical lowercase hyphenated UUID, version 4, RFC 4122 variant.
#[track_caller]
pub fn assert_uuid_v4(token: &str) {
    let b = token.as_bytes();
    let shape_ok = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        });
    assert!(shape_ok, "token {token:?} is not a canonical UUID");
    assert_eq!(b[14], b'4', "token {token:?} is not version 4");
    assert!(
        matches!(b[19], b'8' | b'9' | b'a' | b'b'),
        "token {token:?} is not RFC 4122 variant"
    );
    let parsed = uuid::Uuid::parse_str(token).expect("parses as a UUID");
    assert_eq!(parsed.get_version_num(), 4);
}

/// A READY body: exactly these keys, a v4 token, `expiresIn` in 1..=ttl, `pollAfter` null.
/// Returns the token.
#[track_caller]
pub fn assert_ready(ctx: &str, r: &Resp, ttl_secs: u64) -> String {
    assert_eq!(r.status, 200, "{ctx}: status; body {}", r.body);
    assert_own_headers(ctx, r.header("content-type"), r.header("cache-control"));
    let body = r.json();
    let obj = body.as_object().expect("READY body is an object");
    let keys: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["status", "token", "expiresIn", "pollAfter"]),
        "{ctx}: READY keys: {body}"
    );
    assert_eq!(body["status"], "READY", "{ctx}: {body}");
    assert_eq!(body["pollAfter"], Value::Null, "{ctx}: {body}");
    let expires = body["expiresIn"]
        .as_u64()
        .unwrap_or_else(|| panic!("{ctx}: expiresIn not an integer: {body}"));
    assert!(
        (1..=ttl_secs).contains(&expires),
        "{ctx}: expiresIn {expires} outside 1..={ttl_secs}"
    );
    let token = body["token"]
        .as_str()
        .expect("token is a string")
        .to_owned();
    assert_uuid_v4(&token);
    token
}

/// A WAITING answer at `position` (whatever the estimate), the body shown on failure.
#[track_caller]
pub fn assert_waiting_at(r: &Resp, position: u64) {
    assert_eq!(
        (status_of(r), r.json()["position"].as_u64()),
        ("WAITING".to_owned(), Some(position)),
        "{}",
        r.body
    );
}

/// 429 FULL with `retryAfter` R in the body and `Retry-After: R` (section 3).
#[track_caller]
pub fn assert_full(ctx: &str, r: &Resp, retry_after: u64) {
    assert_answer(
        ctx,
        r,
        429,
        json!({"status": "FULL", "retryAfter": retry_after}),
    );
    let header = retry_after.to_string();
    assert_eq!(
        r.header("retry-after"),
        Some(header.as_str()),
        "{ctx}: Retry-After"
    );
}

/// The HTTP status and the body's `status` field, the body shown on failure.
#[track_caller]
pub fn assert_status_is(r: &Resp, http: u16, status: &str) {
    assert_eq!(
        (r.status, status_of(r).as_str()),
        (http, status),
        "{}",
        r.body
    );
}
