//! Requests that never wait (contract section 18): the shop's own services, staff, the order
//! API's health checks. A protected request from a `bypass.addresses` block, or carrying
//! `bypass.header` with its secret, is forwarded as a valid one would be, with no token, claim or
//! spend.
//!
//! The address is the client address of section 9, never a header a client writes on its own:
//! `X-Forwarded-For` counts only behind `abuse.trusted_proxies`. The secret is compared in
//! constant time, so a timing probe learns nothing of it but its length. The header is taken off
//! every forwarded request, protected or not, bypassing or not: the secret has no business at the
//! order API, and a wrong one must not reach it in shadow mode either (pass-through requests lose
//! it in `request_filter`).

use std::net::IpAddr;

use http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::config::BypassConfig;
use crate::rules::Cidr;

/// What the bypass rules found on a protected request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The request skips the room.
    pub skips: bool,
    /// It carries the bypass header (with any value), which must not travel on.
    pub carries_header: bool,
}

/// Whether a protected request skips the room. `peer` is the connection's peer address (`None`
/// when pingora does not know it: a Unix socket, which no address rule can match). A request
/// that matches nothing costs one header lookup and a comparison per address block; the
/// `X-Forwarded-For` chain is read only when the peer is a trusted proxy.
pub fn applies(bypass: &BypassConfig, trusted: &[Cidr], peer: Option<IpAddr>, headers: &HeaderMap) -> Found {
    let mut found = Found { skips: false, carries_header: false };
    if let Some(rule) = &bypass.header {
        let mut values = headers.get_all(&rule.name).iter();
        let (first, second) = (values.next(), values.next());
        found.carries_header = first.is_some();
        // One copy only: with two, the proxy would judge one and the upstream might read the other.
        if let (Some(value), None) = (first, second) {
            if bool::from(value.as_bytes().ct_eq(rule.secret.expose())) {
                found.skips = true;
                return found;
            }
        }
    }
    if bypass.addresses.is_empty() {
        return found;
    }
    let Some(peer) = peer else { return found };
    let client = if trusted.iter().any(|c| c.contains(peer)) {
        let forwarded = crate::paths::forwarded_for(headers);
        crate::rules::client_address(peer, forwarded.as_deref(), trusted)
    } else {
        peer
    };
    found.skips = bypass.addresses.iter().any(|block| block.contains(client));
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use http::HeaderValue;

    fn config(extra: &str) -> Config {
        std::env::set_var("WAITROOM_BYPASS_UNIT_SECRET", "s3cret");
        Config::parse(&format!("upstream: 127.0.0.1:1\n{extra}")).unwrap()
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn applies_to(c: &Config, peer: Option<IpAddr>, h: &HeaderMap) -> bool {
        applies(&c.bypass, &c.abuse.trusted_proxies, peer, h).skips
    }

    #[test]
    fn addresses_are_the_client_address_of_section_9() {
        let c = config("bypass: {addresses: [192.168.7.0/24]}\nabuse: {trusted_proxies: [10.0.0.0/8]}");
        assert!(applies_to(&c, ip("192.168.7.9"), &headers(&[])));
        assert!(!applies_to(&c, ip("192.168.8.9"), &headers(&[])));
        // An untrusted peer's X-Forwarded-For is its own writing.
        assert!(!applies_to(&c, ip("1.2.3.4"), &headers(&[("x-forwarded-for", "192.168.7.9")])));
        // Behind a trusted proxy, the rightmost untrusted entry.
        assert!(applies_to(&c, ip("10.0.0.1"), &headers(&[("x-forwarded-for", "192.168.7.9")])));
        assert!(!applies_to(&c, ip("10.0.0.1"), &headers(&[("x-forwarded-for", "192.168.7.9, 1.2.3.4")])));
        assert!(!applies_to(&c, None, &headers(&[])));
    }

    #[test]
    fn the_header_must_carry_the_secret_exactly_once() {
        let c = config("bypass: {header: {name: X-Waitroom-Bypass, secret_env: WAITROOM_BYPASS_UNIT_SECRET}}");
        assert!(applies_to(&c, ip("1.2.3.4"), &headers(&[("x-waitroom-bypass", "s3cret")])));
        for wrong in ["s3cre", "s3crett", "S3CRET", ""] {
            assert!(!applies_to(&c, ip("1.2.3.4"), &headers(&[("x-waitroom-bypass", wrong)])), "{wrong}");
        }
        let twice = headers(&[("x-waitroom-bypass", "s3cret"), ("x-waitroom-bypass", "s3cret")]);
        assert!(!applies_to(&c, ip("1.2.3.4"), &twice));
        assert!(!applies_to(&c, ip("1.2.3.4"), &headers(&[("x-other", "s3cret")])));
        let wrong = applies(&c.bypass, &[], ip("1.2.3.4"), &headers(&[("x-waitroom-bypass", "nope")]));
        assert_eq!(wrong, Found { skips: false, carries_header: true }, "a wrong secret is still taken off");
    }
}
