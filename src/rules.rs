//! The queue's rules as pure functions: no Redis, no sockets, no clock. Everything the proxy tells
//! a waiting user (position, estimated wait, when to poll again, how long a token lives) and every
//! decision about a request's identity or its token is made here, so it is tested here.

use std::net::IpAddr;
use std::time::Duration;

/// One `poll_after` tier: applies when the estimated wait is at least `min_wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollTier {
    pub min_wait: Duration,
    pub poll_after: Duration,
}

/// How fast the line moves: `batch` users every `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub batch: u64,
    pub interval: Duration,
}

/// Seconds until a user at `position` (1 = next) is admitted: 0 within the first batch, else
/// `ceil(position / rate)` with rate = batch / interval users per second.
pub fn estimated_wait_secs(position: u64, rate: Rate) -> u64 {
    if position <= rate.batch || rate.batch == 0 {
        return 0;
    }
    // position * interval / batch, in nanoseconds, rounded up to whole seconds; u128 because a
    // million users times an hour-long interval overflows u64 nanoseconds.
    let nanos = position as u128 * rate.interval.as_nanos();
    let per_sec = rate.batch as u128 * 1_000_000_000;
    nanos.div_ceil(per_sec).min(u64::MAX as u128) as u64
}

/// Seconds a waiting user should wait before polling again: the first tier whose `min_wait` is
/// at most the estimated wait, rounded up to whole seconds. Tiers always end with `min_wait` 0
/// (the configuration guarantees it), so there is always an answer.
pub fn poll_after_secs(estimated_wait_secs: u64, tiers: &[PollTier]) -> u64 {
    let wait = Duration::from_secs(estimated_wait_secs);
    tiers
        .iter()
        .find(|t| t.min_wait <= wait)
        .map(|t| ceil_secs(t.poll_after).max(1))
        .unwrap_or(1)
}

/// The step function "position -> pollAfter" as thresholds a Redis script can apply without
/// knowing the arithmetic: `(first position of the tier, poll_after)`, in tier order. The
/// first entry whose position is reached applies, exactly as [`poll_after_secs`] of
/// [`estimated_wait_secs`] would decide (estimated wait never falls as the position grows).
pub fn poll_thresholds(rate: Rate, tiers: &[PollTier]) -> Vec<(u64, Duration)> {
    tiers
        .iter()
        .map(|t| {
            let needed = ceil_secs(t.min_wait);
            // The smallest position whose estimated wait reaches the tier.
            let (mut lo, mut hi) = (1u64, 1u64 << 53);
            if estimated_wait_secs(hi, rate) < needed {
                return (u64::MAX, t.poll_after);
            }
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if estimated_wait_secs(mid, rate) >= needed {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            (lo, Duration::from_secs(ceil_secs(t.poll_after).max(1)))
        })
        .collect()
}

/// The client address that abuse limits count: the connection's peer, or, when the peer is a
/// trusted proxy, the rightmost `X-Forwarded-For` entry that is not itself a trusted proxy
/// (entries to the left of it could have been written by the client).
pub fn client_address(
    peer: IpAddr,
    forwarded_for: Option<&str>,
    trusted: &[crate::config::Cidr],
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

/// What is left of a token's life in whole seconds, rounded up, at least 1. Not capped by the
/// configured ttl: a token issued before a reload shortened it keeps its own, longer life.
pub fn expires_in_secs(remaining_ms: u64) -> u64 {
    remaining_ms.div_ceil(1000).max(1)
}

/// Whole seconds, rounded up: what a `Retry-After` header or a JSON seconds field carries.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000_000) as u64
}

/// What is wrong with an identity value, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityProblem {
    /// Missing or empty: the user is not authenticated (401).
    Missing,
    /// Longer than [`MAX_IDENTITY_BYTES`] (400).
    TooLong,
    /// A byte outside printable ASCII (400).
    BadBytes,
}

pub const MAX_IDENTITY_BYTES: usize = 256;

impl IdentityProblem {
    pub fn status(self) -> u16 {
        match self {
            IdentityProblem::Missing => 401,
            IdentityProblem::TooLong | IdentityProblem::BadBytes => 400,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            IdentityProblem::Missing => "missing user identity",
            IdentityProblem::TooLong => "user identity is longer than 256 bytes",
            IdentityProblem::BadBytes => "user identity must be printable ASCII",
        }
    }
}

/// Checks an identity value (a header's raw bytes, or a verified claim) and returns it as text.
pub fn check_identity(raw: Option<&[u8]>) -> Result<&str, IdentityProblem> {
    let bytes = raw.unwrap_or_default();
    if bytes.is_empty() {
        return Err(IdentityProblem::Missing);
    }
    if bytes.len() > MAX_IDENTITY_BYTES {
        return Err(IdentityProblem::TooLong);
    }
    if !bytes.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Err(IdentityProblem::BadBytes);
    }
    // Printable ASCII is always valid UTF-8.
    std::str::from_utf8(bytes).map_err(|_| IdentityProblem::BadBytes)
}

/// Compares a presented token with the user's current one without leaking, through timing, how
/// many leading bytes matched.
pub fn token_matches(presented: &[u8], current: &[u8]) -> bool {
    if presented.len() != current.len() {
        return false;
    }
    presented.iter().zip(current).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// What a protected request's upstream outcome means for the token it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFate {
    /// The order went through: the token is spent.
    Consume,
    /// The order failed (or never reached the backend): the user may retry with the same token.
    Keep,
}

/// Only a 2xx spends a token; anything else leaves the user free to retry until it expires.
pub fn token_fate(upstream_status: Option<u16>) -> TokenFate {
    match upstream_status {
        Some(s) if (200..300).contains(&s) => TokenFate::Consume,
        _ => TokenFate::Keep,
    }
}

/// The label `waitroom_upstream_responses_total` puts on an upstream outcome.
pub fn status_class(upstream_status: Option<u16>) -> &'static str {
    match upstream_status {
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(batch: u64, ms: u64) -> Rate {
        Rate { batch, interval: Duration::from_millis(ms) }
    }

    fn default_tiers() -> Vec<PollTier> {
        [(60, 10), (10, 5), (0, 2)]
            .into_iter()
            .map(|(m, p)| PollTier {
                min_wait: Duration::from_secs(m),
                poll_after: Duration::from_secs(p),
            })
            .collect()
    }

    #[test]
    fn estimated_wait_follows_the_contract_example() {
        // rate 100/s, position 342 -> 4.
        assert_eq!(estimated_wait_secs(342, rate(10, 100)), 4);
    }

    #[test]
    fn the_first_batch_waits_zero() {
        assert_eq!(estimated_wait_secs(1, rate(10, 100)), 0);
        assert_eq!(estimated_wait_secs(10, rate(10, 100)), 0);
        assert_eq!(estimated_wait_secs(11, rate(10, 100)), 1);
        assert_eq!(estimated_wait_secs(100, rate(10, 100)), 1);
        assert_eq!(estimated_wait_secs(101, rate(10, 100)), 2);
    }

    #[test]
    fn estimated_wait_with_slow_rates_and_huge_lines() {
        assert_eq!(estimated_wait_secs(3, rate(1, 1000)), 3);
        assert_eq!(estimated_wait_secs(2, rate(1, 1500)), 3);
        assert_eq!(estimated_wait_secs(1_000_000, rate(10, 100)), 10_000);
        assert_eq!(estimated_wait_secs(u64::MAX, rate(1, 3_600_000)), u64::MAX);
    }

    #[test]
    fn poll_after_tiers() {
        let t = default_tiers();
        assert_eq!(poll_after_secs(0, &t), 2);
        assert_eq!(poll_after_secs(9, &t), 2);
        assert_eq!(poll_after_secs(10, &t), 5);
        assert_eq!(poll_after_secs(59, &t), 5);
        assert_eq!(poll_after_secs(60, &t), 10);
        assert_eq!(poll_after_secs(10_000, &t), 10);
    }

    #[test]
    fn sub_second_poll_after_rounds_up() {
        let t = [PollTier { min_wait: Duration::ZERO, poll_after: Duration::from_millis(1500) }];
        assert_eq!(poll_after_secs(3, &t), 2);
    }

    #[test]
    fn poll_thresholds_agree_with_the_arithmetic() {
        for r in [rate(10, 100), rate(1, 1000), rate(3, 700), rate(50, 100)] {
            let tiers = default_tiers();
            let thresholds = poll_thresholds(r, &tiers);
            for position in 1..20_000u64 {
                let by_rules = poll_after_secs(estimated_wait_secs(position, r), &tiers);
                let by_thresholds = thresholds
                    .iter()
                    .find(|(first, _)| position >= *first)
                    .map(|(_, d)| d.as_secs())
                    .unwrap();
                assert_eq!(by_rules, by_thresholds, "rate {r:?} position {position}");
            }
        }
        assert_eq!(poll_thresholds(rate(10, 100), &default_tiers())[0].0, 5_901);
    }

    #[test]
    fn client_address_believes_only_trusted_hops() {
        use crate::config::Cidr;
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

    #[test]
    fn expires_in_rounds_up_and_is_at_least_one() {
        assert_eq!(expires_in_secs(300_000), 300);
        assert_eq!(expires_in_secs(299_001), 300);
        assert_eq!(expires_in_secs(299_000), 299);
        assert_eq!(expires_in_secs(1), 1);
        assert_eq!(expires_in_secs(0), 1);
        // A token issued under a longer ttl before a reload reports its own remaining life.
        assert_eq!(expires_in_secs(900_000), 900);
    }

    #[test]
    fn identity_rules() {
        assert_eq!(check_identity(None), Err(IdentityProblem::Missing));
        assert_eq!(check_identity(Some(b"")), Err(IdentityProblem::Missing));
        assert_eq!(check_identity(Some(b"alice")), Ok("alice"));
        assert_eq!(check_identity(Some(b"a b~!")), Ok("a b~!"));
        assert_eq!(check_identity(Some(&[b'a'; 256])).map(str::len), Ok(256));
        assert_eq!(check_identity(Some(&[b'a'; 257])), Err(IdentityProblem::TooLong));
        assert_eq!(check_identity(Some(b"tab\there")), Err(IdentityProblem::BadBytes));
        assert_eq!(check_identity(Some("caf\u{e9}".as_bytes())), Err(IdentityProblem::BadBytes));
        assert_eq!(check_identity(Some(&[0x7f])), Err(IdentityProblem::BadBytes));
        assert_eq!(IdentityProblem::Missing.status(), 401);
        assert_eq!(IdentityProblem::BadBytes.status(), 400);
    }

    #[test]
    fn token_comparison() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abc", b"abd"));
        assert!(!token_matches(b"abc", b"abcd"));
        assert!(!token_matches(b"", b"a"));
    }

    #[test]
    fn only_2xx_spends_a_token() {
        assert_eq!(token_fate(Some(200)), TokenFate::Consume);
        assert_eq!(token_fate(Some(201)), TokenFate::Consume);
        assert_eq!(token_fate(Some(299)), TokenFate::Consume);
        assert_eq!(token_fate(Some(302)), TokenFate::Keep);
        assert_eq!(token_fate(Some(409)), TokenFate::Keep);
        assert_eq!(token_fate(Some(500)), TokenFate::Keep);
        assert_eq!(token_fate(None), TokenFate::Keep);
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(Some(201)), "2xx");
        assert_eq!(status_class(Some(304)), "3xx");
        assert_eq!(status_class(Some(404)), "4xx");
        assert_eq!(status_class(Some(503)), "5xx");
        assert_eq!(status_class(None), "error");
    }
}
