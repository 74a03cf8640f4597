//! Request headers the room depends on, kept out of a client's reach (contract section 12).
//!
//! - `Connection` may nominate headers for removal before forwarding (RFC 9110 7.6.1), and
//!   pingora honours it. A client that nominates the identity or token header would have the
//!   backend receive an order with no identity; so those names are dropped from `Connection`
//!   before pingora reads it, and the headers travel as the client sent them.

use http::{HeaderMap, HeaderName, HeaderValue};

/// `Connection`'s tokens without those naming one of `kept`: `None` when nothing changes,
/// `Some(None)` when no token is left, `Some(Some(value))` for the new value.
pub fn connection_without(value: &[u8], kept: &[&HeaderName]) -> Option<Option<HeaderValue>> {
    let nominated = |token: &[u8]| kept.iter().any(|name| token.eq_ignore_ascii_case(name.as_str().as_bytes()));
    let tokens: Vec<&[u8]> = value.split(|b| *b == b',').map(<[u8]>::trim_ascii).collect();
    if !tokens.iter().any(|t| nominated(t)) {
        return None;
    }
    let left: Vec<&[u8]> = tokens.into_iter().filter(|t| !t.is_empty() && !nominated(t)).collect();
    if left.is_empty() {
        return Some(None);
    }
    Some(HeaderValue::from_bytes(&left.join(&b", "[..])).ok())
}

/// The `Connection` lines of `headers` with the names in `kept` dropped (a line left empty
/// goes), or `None` when no line names them.
pub fn shielded_connection(headers: &HeaderMap, kept: &[&HeaderName]) -> Option<Vec<HeaderValue>> {
    let lines = headers.get_all(http::header::CONNECTION);
    let mut changed = false;
    let mut rewritten = Vec::new();
    for line in lines {
        match connection_without(line.as_bytes(), kept) {
            None => rewritten.push(line.clone()),
            Some(left) => {
                changed = true;
                rewritten.extend(left);
            }
        }
    }
    changed.then_some(rewritten)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> [HeaderName; 2] {
        [HeaderName::from_static("x-user-id"), HeaderName::from_static("x-entry-token")]
    }

    #[test]
    fn the_identity_and_token_names_are_dropped_from_connection() {
        let [user, token] = names();
        let kept = [&user, &token];
        assert_eq!(connection_without(b"keep-alive", &kept), None);
        assert_eq!(connection_without(b"close, X-User-Id, X-Entry-Token", &kept), Some(Some(HeaderValue::from_static("close"))));
        assert_eq!(connection_without(b"x-user-id", &kept), Some(None));
        assert_eq!(connection_without(b" X-ENTRY-TOKEN ,keep-alive,,", &kept), Some(Some(HeaderValue::from_static("keep-alive"))));
    }

    #[test]
    fn every_connection_line_is_shielded() {
        let [user, token] = names();
        let mut h = HeaderMap::new();
        h.append("connection", HeaderValue::from_static("X-User-Id"));
        h.append("connection", HeaderValue::from_static("close, x-entry-token"));
        h.append("connection", HeaderValue::from_static("keep-alive"));
        let left = shielded_connection(&h, &[&user, &token]).unwrap();
        assert_eq!(left, ["close", "keep-alive"]);
        let mut untouched = HeaderMap::new();
        untouched.append("connection", HeaderValue::from_static("close"));
        assert_eq!(shielded_connection(&untouched, &[&user, &token]), None);
    }
}
