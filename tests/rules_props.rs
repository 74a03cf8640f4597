//! Properties of the queue's arithmetic and of the request checks in `waitroom::rules`, over many
//! generated inputs (proptest): what the unit tests show for a few examples holds for all.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use proptest::prelude::*;
use waitroom::identity::{check_identity, IdentityProblem};
use waitroom::rules::{
    self, client_address, estimated_wait_secs, expires_in_secs, poll_after_secs, poll_thresholds,
    Cidr, PollTier, Rate,
};

/// A rate an operator could configure: 1..=1000 users every 1 ms..=60 s.
fn rate() -> impl Strategy<Value = Rate> {
    (1u64..=1000, 1u64..=60_000).prop_map(|(batch, ms)| Rate {
        batch,
        interval: Duration::from_millis(ms),
    })
}

/// Valid `poll_after` tiers: min_wait strictly falling, the last one 0 s.
fn tiers() -> impl Strategy<Value = Vec<PollTier>> {
    (
        proptest::collection::btree_set(1u64..=7200, 0..5),
        proptest::collection::vec(1u64..=120_000, 5),
    )
        .prop_map(|(waits, polls)| {
            let mut waits: Vec<u64> = waits.into_iter().rev().collect();
            waits.push(0);
            waits
                .iter()
                .zip(polls.iter().cycle())
                .map(|(w, p)| PollTier {
                    min_wait: Duration::from_secs(*w),
                    poll_after: Duration::from_millis(*p),
                })
                .collect()
        })
}

/// The tier a position falls in, by the thresholds the scripts use.
fn by_thresholds(thresholds: &[(u64, Duration)], position: u64) -> u64 {
    thresholds
        .iter()
        .find(|(first, _)| position >= *first)
        .map(|(_, d)| d.as_secs())
        .expect("the last tier starts at position 1")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn eta_never_falls_as_the_position_grows(r in rate(), a in 1u64..=10_000_000, b in 1u64..=10_000_000) {
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assert!(estimated_wait_secs(lo, r) <= estimated_wait_secs(hi, r));
    }

    #[test]
    fn the_first_batch_waits_zero(r in rate(), pick in 0.0f64..=1.0) {
        let position = 1 + ((r.batch - 1) as f64 * pick) as u64;
        prop_assert_eq!(estimated_wait_secs(position, r), 0);
        prop_assert!(estimated_wait_secs(r.batch + 1, r) >= 1);
    }

    /// ceil(position / rate), rate = batch / interval, as the contract writes it, in f64: equal
    /// wherever the quotient is not within rounding error of a whole number.
    #[test]
    fn eta_is_position_over_rate_rounded_up(r in rate(), position in 1u64..=1_000_000) {
        prop_assume!(position > r.batch);
        let per_sec = r.batch as f64 / r.interval.as_secs_f64();
        let exact = position as f64 / per_sec;
        let eta = estimated_wait_secs(position, r);
        if (exact - exact.round()).abs() < 1e-6 {
            prop_assert_eq!(eta, exact.round() as u64);
        } else {
            prop_assert_eq!(eta, exact.ceil() as u64);
        }
    }

    #[test]
    fn huge_lines_never_overflow(r in rate(), position in any::<u64>()) {
        let eta = estimated_wait_secs(position, r);
        prop_assert!(position <= r.batch || eta >= 1);
    }

    /// The position thresholds the Redis scripts apply give the same pollAfter as the rules.
    #[test]
    fn poll_after_by_thresholds_equals_by_tiers(
        r in rate(),
        t in tiers(),
        positions in proptest::collection::vec(1u64..=5_000_000, 50),
    ) {
        let thresholds = poll_thresholds(r, &t);
        prop_assert_eq!(thresholds.len(), t.len());
        for position in positions {
            let by_rules = poll_after_secs(estimated_wait_secs(position, r), &t);
            prop_assert_eq!(by_rules, by_thresholds(&thresholds, position), "position {}", position);
        }
        // Right at each threshold and just before it, where an off-by-one would show.
        for (first, _) in thresholds.iter().filter(|(f, _)| *f != u64::MAX) {
            for position in [first.saturating_sub(1).max(1), *first] {
                let by_rules = poll_after_secs(estimated_wait_secs(position, r), &t);
                prop_assert_eq!(by_rules, by_thresholds(&thresholds, position), "position {}", position);
            }
        }
    }

    #[test]
    fn poll_after_is_whole_seconds_of_the_chosen_tier(wait in 0u64..=100_000, t in tiers()) {
        let secs = poll_after_secs(wait, &t);
        let tier = t.iter().find(|tier| tier.min_wait <= Duration::from_secs(wait)).unwrap();
        prop_assert_eq!(secs, rules::ceil_secs(tier.poll_after).max(1));
    }

    /// What is left of a token issued with `ttl` (Redis's PTTL: 0..=ttl) is reported within
    /// 1..=ttl, rounded up.
    #[test]
    fn expires_in_stays_within_one_and_the_ttl(ttl_ms in 1u64..=86_400_000, left in 0.0f64..=1.0) {
        let ttl = Duration::from_millis(ttl_ms);
        let remaining_ms = (ttl_ms as f64 * left) as u64;
        let s = expires_in_secs(remaining_ms);
        prop_assert!((1..=rules::ceil_secs(ttl)).contains(&s), "{} not in 1..={}", s, rules::ceil_secs(ttl));
        prop_assert_eq!(s, remaining_ms.div_ceil(1000).max(1));
    }

    #[test]
    fn expires_in_is_never_zero(remaining_ms in any::<u64>()) {
        prop_assert!(expires_in_secs(remaining_ms) >= 1);
    }

    #[test]
    fn ceil_secs_rounds_up(nanos in any::<u64>()) {
        let s = rules::ceil_secs(Duration::from_nanos(nanos));
        prop_assert!(s as u128 * 1_000_000_000 >= nanos as u128);
        prop_assert!(s == 0 || (s as u128 - 1) * 1_000_000_000 < nanos as u128);
    }

    /// Exactly the non-empty printable-ASCII values of at most 256 bytes are identities.
    #[test]
    fn identities_are_printable_ascii_of_at_most_256_bytes(
        bytes in prop_oneof![
            proptest::collection::vec(0x20u8..=0x7e, 0..=300),
            proptest::collection::vec(any::<u8>(), 0..=300),
        ]
    ) {
        let printable = bytes.iter().all(|b| (0x20..=0x7e).contains(b));
        let got = check_identity(Some(&bytes));
        if bytes.is_empty() {
            prop_assert_eq!(got, Err(IdentityProblem::Missing));
        } else if bytes.len() > 256 {
            prop_assert_eq!(got, Err(IdentityProblem::TooLong));
        } else if printable {
            prop_assert_eq!(got.map(str::as_bytes), Ok(bytes.as_slice()));
        } else {
            prop_assert_eq!(got, Err(IdentityProblem::BadBytes));
        }
    }
}

/// Addresses from two small pools, so chains mix trusted and untrusted hops often.
fn hop() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        (0u8..8).prop_map(|d| IpAddr::V4(Ipv4Addr::new(10, 0, 0, d))), // trusted (10.0.0.0/24)
        (0u8..8).prop_map(|d| IpAddr::V4(Ipv4Addr::new(192, 0, 2, d))), // the clients
    ]
}

fn trusted() -> Vec<Cidr> {
    vec![Cidr::parse("10.0.0.0/24").unwrap()]
}

fn is_trusted(ip: IpAddr) -> bool {
    trusted().iter().any(|c| c.contains(ip))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Never a trusted address when the peer or the chain holds an untrusted one; with a
    /// trusted peer it is the rightmost untrusted entry, whatever the client wrote to its left.
    #[test]
    fn client_address_is_the_rightmost_untrusted_hop(peer in hop(), chain in proptest::collection::vec(hop(), 0..6)) {
        let header = chain.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(", ");
        let got = client_address(peer, (!chain.is_empty()).then_some(header.as_str()), &trusted());
        if !is_trusted(peer) {
            prop_assert_eq!(got, peer);
        } else if let Some(expected) = chain.iter().rev().find(|ip| !is_trusted(**ip)) {
            prop_assert_eq!(got, *expected);
            prop_assert!(!is_trusted(got));
        } else {
            // Only trusted hops: the one nearest the client.
            prop_assert_eq!(got, chain.first().copied().unwrap_or(peer));
        }
    }

    /// Garbage in the chain: nothing to its left is believed, and the answer is still either the
    /// peer or an address that was in the header.
    #[test]
    fn client_address_stops_at_garbage(
        peer in hop(),
        left in proptest::collection::vec(hop(), 0..4),
        junk in "[a-z:. ]{0,12}",
        right in proptest::collection::vec(hop(), 0..4),
    ) {
        let mut parts: Vec<String> = left.iter().map(IpAddr::to_string).collect();
        parts.push(junk.clone());
        parts.extend(right.iter().map(IpAddr::to_string));
        let header = parts.join(",");
        let got = client_address(peer, Some(&header), &trusted());
        let junk_is_an_address = junk.trim().parse::<IpAddr>().is_ok();
        prop_assert!(got == peer || left.contains(&got) || right.contains(&got) || junk_is_an_address);
        if is_trusted(peer) && !junk_is_an_address {
            if let Some(expected) = right.iter().rev().find(|ip| !is_trusted(**ip)) {
                prop_assert_eq!(got, *expected);
            } else {
                prop_assert!(!left.contains(&got) || right.contains(&got) || got == peer);
            }
        }
    }

    /// Any header text at all: no panic, and an untrusted peer is always the answer.
    #[test]
    fn client_address_survives_any_header(header in ".{0,64}", d in any::<u8>()) {
        let peer = IpAddr::V4(Ipv4Addr::new(198, 51, 100, d));
        prop_assert_eq!(client_address(peer, Some(&header), &trusted()), peer);
        let _ = client_address(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), Some(&header), &trusted());
    }
}
