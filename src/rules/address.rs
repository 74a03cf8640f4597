//! Who is on the other end of a connection (contract section 9): the client address that the
//! per-address limit counts, believing `X-Forwarded-For` only from trusted proxies.

use std::net::IpAddr;

/// An address block from `abuse.trusted_proxies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Option<Cidr> {
        let (addr, len) = match text.split_once('/') {
            Some((a, l)) => (a.parse::<IpAddr>().ok()?, Some(l.parse::<u8>().ok()?)),
            None => (text.parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = len.unwrap_or(max);
        (prefix_len <= max).then_some(Cidr { addr, prefix_len })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        fn masked(bits: u128, len: u8, width: u8) -> u128 {
            if len == 0 {
                0
            } else {
                bits >> (width - len)
            }
        }
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u32::from(net) as u128, self.prefix_len, 32)
                    == masked(u32::from(ip) as u128, self.prefix_len, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(net), self.prefix_len, 128)
                    == masked(u128::from(ip), self.prefix_len, 128)
            }
            _ => false,
        }
    }
}

/// The client address that abuse limits count: the connection's peer, or, when the peer is a
/// trusted proxy, the rightmost `X-Forwarded-For` entry that is not itself a trusted proxy
/// (entries to the left of it could have been written by the client).
pub fn client_address(
    peer: IpAddr,
    forwarded_for: Option<&str>,
    trusted: &[Cidr],
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let Some(chain) = forwarded_for else { return peer };
    let mut last_trusted = peer;
    for entry in chain.rsplit(',') {
        match entry.trim().parse::<IpAddr>() {
            Ok(ip) if is_trusted(ip) => last_trusted = ip,
            Ok(ip) => return ip,
            // Garbage in the chain: believe nothing to the left of it.
            Err(_) => return last_trusted,
        }
    }
    last_trusted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_matching() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("1.2.3.4/33").is_none());
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn client_address_believes_only_trusted_hops() {
        let trusted = [Cidr::parse("10.0.0.0/8").unwrap()];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // An untrusted peer is the client, whatever it claims.
        assert_eq!(client_address(ip("1.2.3.4"), Some("9.9.9.9"), &trusted), ip("1.2.3.4"));
        // A trusted peer: the rightmost untrusted entry.
        assert_eq!(client_address(ip("10.0.0.1"), Some("6.6.6.6, 1.2.3.4"), &trusted), ip("1.2.3.4"));
        assert_eq!(
            client_address(ip("10.0.0.1"), Some("6.6.6.6, 1.2.3.4, 10.0.0.7"), &trusted),
            ip("1.2.3.4")
        );
        // Nothing forwarded, or only trusted hops: the last trusted hop.
        assert_eq!(client_address(ip("10.0.0.1"), None, &trusted), ip("10.0.0.1"));
        assert_eq!(client_address(ip("10.0.0.1"), Some("10.0.0.9"), &trusted), ip("10.0.0.9"));
        assert_eq!(client_address(ip("10.0.0.1"), Some("1.1.1.1, junk"), &trusted), ip("10.0.0.1"));
    }
}
