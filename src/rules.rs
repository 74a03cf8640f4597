//! The queue's rules as pure functions: no Redis, no sockets, no clock. Everything the proxy tells
//! a waiting user (position, estimated wait, when to poll again, how long a token lives), every
//! decision about a request's identity or its token, and the adaptive controller's step (p95 from
//! the room's latency histogram, next batch) is made here, so it is tested here.

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
    wait_secs(position, Pace::configured(rate))
}

/// What a waiting user's estimate is made of: positions up to `first_batch` leave with the next
/// tick (wait 0), the others at `rate`. With the fixed rate both come from the configuration;
/// when the admission listens (contract section 11) the first batch is the batch in force and
/// the rate the room's measured one (see [`measured_pace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub first_batch: u64,
    pub rate: Rate,
}

impl Pace {
    /// The fixed rate of section 3: the first batch is `batch_size`.
    pub fn configured(rate: Rate) -> Pace {
        Pace { first_batch: rate.batch, rate }
    }
}

/// Seconds until a user at `position` is admitted at `pace`: 0 within the first batch, else
/// `ceil(position / rate)`.
pub fn wait_secs(position: u64, pace: Pace) -> u64 {
    let rate = pace.rate;
    if position <= pace.first_batch || rate.batch == 0 {
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
    pace_thresholds(Pace::configured(rate), tiers)
}

/// [`poll_thresholds`] for any pace: what the scripts enforce when the estimate comes from the
/// room's measured rate. A binary search per tier, cheap enough to redo whenever the pace moves.
pub fn pace_thresholds(pace: Pace, tiers: &[PollTier]) -> Vec<(u64, Duration)> {
    tiers
        .iter()
        .map(|t| {
            let needed = ceil_secs(t.min_wait);
            // The smallest position whose estimated wait reaches the tier.
            let (mut lo, mut hi) = (1u64, 1u64 << 53);
            if wait_secs(hi, pace) < needed {
                return (u64::MAX, t.poll_after);
            }
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if wait_secs(mid, pace) >= needed {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            (lo, Duration::from_secs(ceil_secs(t.poll_after).max(1)))
        })
        .collect()
}

// ---- admission that listens (contract section 11) ---------------------------------------------

/// How far back the room's measured admission rate looks.
pub const MEASURE_WINDOW: Duration = Duration::from_secs(10);

/// The pace enter and status estimate with while any admission switch is on: the room's measured
/// admission rate over the last [`MEASURE_WINDOW`], and the batch in force as the first batch.
///
/// - `admitted_recently`: users admitted (ticks and instant passes) in the last 10 s;
/// - `since_first`: time since the room's first recorded admission, `None` before it. While it
///   is shorter than 10 s the window is that time plus one interval: a tick admits for the
///   interval that follows it, so the first batch alone stands for one interval, not for zero
///   seconds (which would make the rate infinite just after it).
/// - Never slower than `min_batch / interval` (1 / interval without adaptive): an idle room or
///   one held back by `max_active` still promises progress. Before any admission nothing is
///   measured and the batch in force per interval is the best guess.
pub fn measured_pace(
    batch_in_force: u64,
    interval: Duration,
    min_batch: u64,
    admitted_recently: u64,
    since_first: Option<Duration>,
) -> Pace {
    let floor = Rate { batch: min_batch.max(1), interval };
    let rate = match since_first {
        None => Rate { batch: batch_in_force.max(1), interval },
        Some(elapsed) => {
            let window = elapsed.saturating_add(interval).min(MEASURE_WINDOW);
            let measured = Rate { batch: admitted_recently, interval: window };
            if at_least_as_fast(measured, floor) { measured } else { floor }
        }
    };
    Pace { first_batch: batch_in_force, rate }
}

/// Whether `a` admits at least as many users per second as `b` (exact, no floats).
fn at_least_as_fast(a: Rate, b: Rate) -> bool {
    a.batch as u128 * b.interval.as_nanos() >= b.batch as u128 * a.interval.as_nanos()
}

impl Rate {
    /// Users per second, for gauges.
    pub fn per_second(self) -> f64 {
        if self.interval.is_zero() {
            return 0.0;
        }
        self.batch as f64 / self.interval.as_secs_f64()
    }
}

/// Buckets of the upstream latency histogram the proxies report to the room.
pub const LATENCY_BUCKETS: usize = 128;
/// Buckets per doubling: bucket bounds grow by 2^(1/8), about 9 %.
const BUCKETS_PER_DOUBLING: f64 = 8.0;

/// The histogram bucket a latency falls in: bucket 0 holds up to 1 ms, bucket `i` the latencies in
/// `(2^((i-1)/8), 2^(i/8)]` ms, the last one everything from about 55 s up. Fixed bounds, so
/// any number of proxies can add their counts bucket by bucket in Redis, and fine enough that a
/// p95 read from it is within a few per cent of the true one.
pub fn latency_bucket(latency: Duration) -> usize {
    let ms = latency.as_secs_f64() * 1000.0;
    if ms <= 1.0 {
        return 0;
    }
    let i = (ms.log2() * BUCKETS_PER_DOUBLING).ceil();
    (i as usize).clamp(1, LATENCY_BUCKETS - 1)
}

/// `(lower, upper)` bound of a bucket, in milliseconds.
fn latency_bucket_bounds_ms(i: usize) -> (f64, f64) {
    if i == 0 {
        return (0.0, 1.0);
    }
    let bound = |k: usize| 2f64.powf(k as f64 / BUCKETS_PER_DOUBLING);
    (bound(i - 1), bound(i))
}

/// The `q` quantile (0..=1) of a bucket histogram given as `(bucket, count)` pairs (any order,
/// repeats add up), interpolated linearly inside its bucket; `None` without samples.
pub fn latency_quantile(counts: &[(usize, u64)], q: f64) -> Option<Duration> {
    let mut per_bucket = [0u64; LATENCY_BUCKETS];
    for &(i, n) in counts {
        per_bucket[i.min(LATENCY_BUCKETS - 1)] += n;
    }
    let total: u64 = per_bucket.iter().sum();
    if total == 0 {
        return None;
    }
    // The rank of the sample that is the quantile, 1-based.
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).clamp(1, total);
    let mut below = 0u64;
    for (i, &n) in per_bucket.iter().enumerate() {
        if n > 0 && below + n >= rank {
            let (lo, hi) = latency_bucket_bounds_ms(i);
            let ms = lo + (hi - lo) * (rank - below) as f64 / n as f64;
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
        below += n;
    }
    None
}

/// The adaptive controller's settings (`admission.adaptive`, with `batch_size` as the ceiling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controller {
    pub target_p95: Duration,
    pub min_batch: u32,
    pub max_batch: u32,
    /// `admission.interval`: turns the backend's responses per second into users per interval.
    pub interval: Duration,
}

/// The room's controller state, kept in Redis between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ControlState {
    /// The batch in force.
    pub batch: u32,
    /// Steps left during which a p95 above the target does not cut again.
    pub settle: u32,
    /// Protected responses in the second of the last cut: what the backend could serve when it
    /// was last overloaded (`None` before any cut).
    pub served_at_cut: Option<u32>,
    /// Steps spent below the target without climbing, while probing near that capacity.
    pub probe_wait: u32,
}

impl Controller {
    /// The state of a room that has not adapted yet: it starts at the ceiling.
    pub fn initial(self) -> ControlState {
        ControlState { batch: self.max_batch, ..ControlState::default() }
    }

    /// Users per interval that `per_second` protected responses a second stand for.
    fn per_interval(self, per_second: u32) -> f64 {
        per_second as f64 * self.interval.as_secs_f64()
    }
}

/// A cut takes at least this share off the batch (and at least one user)...
const LEAST_CUT: f64 = 0.9;
/// ... and at most this: halving is the deepest single step.
const DEEPEST_CUT: f64 = 0.5;
/// ... but never below this share of what the backend served in the second that showed the
/// overload: it was saturated, so that is its capacity, and admitting much less only starves it.
const KEEP_SERVED: f64 = 0.9;
/// Steps after a cut during which it is not repeated: the users a cut keeps out would have
/// reached the backend only seconds later (they poll, then order), so the latency keeps rising
/// for a while after any cut, and cutting again on that would sink the batch far too low.
const SETTLE_STEPS: u32 = 2;
/// Near the capacity the backend showed at its last overload, and with the p95 past half the
/// target, the batch climbs one every this many steps instead of every step...
const PROBE_EVERY: u32 = 3;
/// ... "past half the target": a p95 far under the target means the backend has room (it got
/// faster, say), and the batch climbs at full speed.
const NEAR_TARGET: f64 = 0.5;

/// One step of the room's controller, once a second, from the p95 of the protected upstream
/// latencies the room's proxies reported since the previous step and how many there were
/// (`p95: None`: no protected responses, nothing changes):
///
/// - p95 at or below the target: one more user per interval, up to `max_batch`. Only while the
///   batch is at or above what the backend served at its last overload *and* the p95 is past half
///   the target does it climb one every [`PROBE_EVERY`] steps: the latency answers an increase
///   only after the new users poll and order, and probing a saturated backend at full speed
///   overshoots its capacity by those seconds' worth of increases.
/// - p95 above it: a multiplicative cut by `target / p95`, bounded to between 10 % (and at least
///   one user) and 50 %, down to `min_batch`, but not below 90 % of the responses the backend
///   served in that second; then [`SETTLE_STEPS`] steps without another cut.
///
/// Against the crowd (20 slots x 200 ms, batches every 100 ms, users ordering up to 2 s
/// after admission) the batch settles between 8 and 11 (the backend takes 10) where plain AIMD
/// swings between 1 and 13: see `under_a_steady_crowd_the_batch_settles_near_the_backend_capacity`.
pub fn control_step(
    c: Controller,
    state: ControlState,
    p95: Option<Duration>,
    responses: u64,
) -> ControlState {
    let (min, max) = (c.min_batch.max(1), c.max_batch.max(c.min_batch.max(1)));
    let batch = state.batch.clamp(min, max);
    let Some(p95) = p95 else {
        return ControlState { batch, ..state };
    };
    let target = c.target_p95.as_secs_f64();
    let p95 = p95.as_secs_f64();
    if p95 <= target {
        let near_capacity = state
            .served_at_cut
            .is_some_and(|served| batch as f64 >= c.per_interval(served) && p95 >= target * NEAR_TARGET);
        if near_capacity && state.probe_wait + 1 < PROBE_EVERY {
            return ControlState { batch, settle: 0, probe_wait: state.probe_wait + 1, ..state };
        }
        return ControlState { batch: (batch + 1).min(max), settle: 0, probe_wait: 0, ..state };
    }
    if state.settle > 0 {
        return ControlState { batch, settle: state.settle - 1, ..state };
    }
    let served = responses.min(u32::MAX as u64) as u32;
    let factor = (target / p95).clamp(DEEPEST_CUT, LEAST_CUT);
    let by_latency = (batch as f64 * factor).floor() as u32;
    let by_throughput = (c.per_interval(served) * KEEP_SERVED).floor() as u32;
    let cut = by_latency.max(by_throughput).min(batch.saturating_sub(1));
    ControlState {
        batch: cut.max(min),
        settle: SETTLE_STEPS,
        served_at_cut: Some(served),
        probe_wait: 0,
    }
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

    // ---- admission that listens ----------------------------------------------------------------

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn latency_buckets_are_ordered_and_fine() {
        assert_eq!(latency_bucket(Duration::ZERO), 0);
        assert_eq!(latency_bucket(ms(1)), 0);
        let mut last = 0;
        for m in 1..70_000u64 {
            let b = latency_bucket(ms(m));
            assert!(b >= last, "{m} ms");
            last = b;
            // The bucket holds the latency, and is at most 2^(1/8) wide.
            let (lo, hi) = latency_bucket_bounds_ms(b);
            if b < LATENCY_BUCKETS - 1 {
                assert!(lo < m as f64 && m as f64 <= hi + 1e-9, "{m} ms in ({lo}, {hi}]");
                assert!(hi / lo.max(1.0) <= 1.0906, "bucket {b}");
            }
        }
        assert_eq!(latency_bucket(Duration::from_secs(3600)), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn p95_from_a_bucket_histogram() {
        assert_eq!(latency_quantile(&[], 0.95), None);
        assert_eq!(latency_quantile(&[(3, 0)], 0.95), None);
        // 100 samples: 95 at 100 ms, 5 at 2 s: the p95 is the last 100 ms sample, read as its
        // bucket's upper bound (within 9 %).
        let hist = [(latency_bucket(ms(100)), 95), (latency_bucket(ms(2000)), 5)];
        let p95 = latency_quantile(&hist, 0.95).unwrap();
        assert!(p95 >= ms(100) && p95 <= ms(109), "{p95:?}");
        // One more slow sample and the p95 is a slow one.
        let hist = [(latency_bucket(ms(100)), 94), (latency_bucket(ms(2000)), 6)];
        let p95 = latency_quantile(&hist, 0.95).unwrap();
        assert!(p95 > ms(1830) && p95 <= ms(2000), "{p95:?}");
        // Reports of several proxies add up whatever their order.
        let (fast, slow) = (latency_bucket(ms(100)), latency_bucket(ms(2000)));
        let split = [(slow, 3), (fast, 50), (fast, 44), (slow, 3)];
        assert_eq!(latency_quantile(&split, 0.95), Some(p95));
        // Within a few per cent of the true value on a spread of latencies.
        let samples: Vec<u64> = (1..=1000).map(|i| 50 + i * 3 / 4).collect(); // 50..800 ms
        let mut hist = Vec::new();
        for m in &samples {
            hist.push((latency_bucket(ms(*m)), 1));
        }
        let truth = samples[949] as f64;
        let got = latency_quantile(&hist, 0.95).unwrap().as_secs_f64() * 1000.0;
        assert!((got - truth).abs() / truth < 0.05, "p95 {got} vs {truth}");
    }

    fn controller() -> Controller {
        Controller { target_p95: ms(300), min_batch: 2, max_batch: 10, interval: ms(100) }
    }

    fn batch(batch: u32) -> ControlState {
        ControlState { batch, ..ControlState::default() }
    }

    #[test]
    fn the_controller_climbs_by_one_while_under_the_target() {
        let c = controller();
        assert_eq!(c.initial(), batch(10));
        assert_eq!(control_step(c, batch(4), Some(ms(120)), 40), batch(5));
        assert_eq!(control_step(c, batch(4), Some(ms(300)), 40), batch(5), "at the target is fine");
        assert_eq!(control_step(c, batch(10), Some(ms(10)), 100), batch(10), "never above batch_size");
        // A settle left from a cut ends once the p95 is back under the target.
        let settling = ControlState { settle: 2, ..batch(4) };
        assert_eq!(control_step(c, settling, Some(ms(100)), 40), batch(5));
    }

    #[test]
    fn the_controller_cuts_multiplicatively_while_over_the_target() {
        let c = controller();
        let cut = |b: u32, served: u32| ControlState {
            batch: b,
            settle: 2,
            served_at_cut: Some(served),
            probe_wait: 0,
        };
        // A small overshoot: at least one user, at least 10 %.
        assert_eq!(control_step(c, batch(10), Some(ms(310)), 0), cut(9, 0));
        assert_eq!(control_step(c, batch(3), Some(ms(310)), 0), cut(2, 0));
        // Twice the target: halved; far above it: still only halved in one step.
        assert_eq!(control_step(c, batch(10), Some(ms(600)), 0), cut(5, 0));
        assert_eq!(control_step(c, batch(10), Some(ms(5000)), 0), cut(5, 0));
        // In between: by target / p95.
        assert_eq!(control_step(c, batch(10), Some(ms(400)), 0), cut(7, 0));
        // Never below min_batch.
        assert_eq!(control_step(c, batch(2), Some(ms(5000)), 0), cut(2, 0));
        // Not below 90 % of what the backend served (80/s = 8 per 100 ms -> 7), nor by less
        // than one user.
        assert_eq!(control_step(c, batch(10), Some(ms(5000)), 80), cut(7, 80));
        assert_eq!(control_step(c, batch(10), Some(ms(5000)), 500), cut(9, 500));
    }

    #[test]
    fn the_controller_lets_a_cut_settle_before_the_next() {
        let c = controller();
        let after_cut = control_step(c, batch(10), Some(ms(600)), 0);
        assert_eq!((after_cut.batch, after_cut.settle), (5, 2));
        // The latency keeps rising for a while: two steps hold, the third cuts again.
        let s1 = control_step(c, after_cut, Some(ms(800)), 0);
        assert_eq!((s1.batch, s1.settle), (5, 1));
        let s2 = control_step(c, s1, Some(ms(900)), 0);
        assert_eq!((s2.batch, s2.settle), (5, 0));
        let s3 = control_step(c, s2, Some(ms(900)), 0);
        assert_eq!((s3.batch, s3.settle), (2, 2));
    }

    #[test]
    fn the_controller_probes_slowly_near_the_capacity_it_saw() {
        let c = controller();
        // The last cut saw the backend serve 60/s: 6 per interval.
        let s = ControlState { batch: 5, settle: 0, served_at_cut: Some(60), probe_wait: 0 };
        // Below that: one a step.
        let s = control_step(c, s, Some(ms(250)), 50);
        assert_eq!(s.batch, 6);
        // At it, with the p95 past half the target: one every third step.
        let s = control_step(c, s, Some(ms(250)), 60);
        assert_eq!((s.batch, s.probe_wait), (6, 1));
        let s = control_step(c, s, Some(ms(250)), 60);
        assert_eq!((s.batch, s.probe_wait), (6, 2));
        let s = control_step(c, s, Some(ms(250)), 60);
        assert_eq!((s.batch, s.probe_wait), (7, 0));
        // A p95 far under the target (the backend got faster): full speed again.
        let s = control_step(c, s, Some(ms(60)), 70);
        assert_eq!(s.batch, 8);
    }

    #[test]
    fn the_controller_leaves_the_batch_without_protected_responses() {
        let c = controller();
        let s = ControlState { batch: 4, settle: 1, served_at_cut: Some(30), probe_wait: 1 };
        assert_eq!(control_step(c, s, None, 0), s);
        // A reload that moved the bounds clamps the stored batch.
        assert_eq!(control_step(c, batch(40), None, 0), batch(10));
        assert_eq!(control_step(c, batch(1), None, 0), batch(2));
    }

    #[test]
    fn the_measured_pace() {
        let interval = ms(100);
        // Before any admission: the batch in force per interval.
        assert_eq!(
            measured_pace(10, interval, 1, 0, None),
            Pace { first_batch: 10, rate: Rate { batch: 10, interval } }
        );
        // 10 s of 100/s.
        let p = measured_pace(10, interval, 1, 1000, Some(Duration::from_secs(60)));
        assert_eq!(p.rate, Rate { batch: 1000, interval: MEASURE_WINDOW });
        assert_eq!(wait_secs(342, p), 4, "the contract's example at the measured 100/s");
        // A young room: the window is its age plus one interval. 3 batches of 10 at 0, 100 and
        // 200 ms, read at 250 ms: 30 users in 350 ms.
        let p = measured_pace(10, interval, 1, 30, Some(ms(250)));
        assert_eq!(p.rate, Rate { batch: 30, interval: ms(350) });
        // A room held back: never slower than min_batch / interval.
        let p = measured_pace(4, interval, 1, 2, Some(Duration::from_secs(30)));
        assert_eq!(p, Pace { first_batch: 4, rate: Rate { batch: 1, interval } });
        assert_eq!(wait_secs(60, p), 6);
        assert_eq!(wait_secs(4, p), 0, "the first batch is the batch in force");
        assert_eq!(wait_secs(5, p), 1);
        let p = measured_pace(4, interval, 3, 2, Some(Duration::from_secs(30)));
        assert_eq!(p.rate, Rate { batch: 3, interval });
    }

    #[test]
    fn pace_thresholds_agree_with_the_measured_arithmetic() {
        let tiers = default_tiers();
        for pace in [
            measured_pace(10, ms(100), 1, 333, Some(Duration::from_secs(20))),
            measured_pace(3, ms(100), 1, 0, Some(Duration::from_secs(20))),
            measured_pace(7, ms(250), 2, 41, Some(ms(1200))),
        ] {
            let thresholds = pace_thresholds(pace, &tiers);
            for position in 1..5_000u64 {
                let by_rules = poll_after_secs(wait_secs(position, pace), &tiers);
                let by_thresholds = thresholds
                    .iter()
                    .find(|(first, _)| position >= *first)
                    .map(|(_, d)| d.as_secs())
                    .unwrap();
                assert_eq!(by_rules, by_thresholds, "{pace:?} position {position}");
            }
        }
    }

    /// What the controller does with a crowd: a deterministic model of the benchmark (a
    /// line that never empties; a backend of 20 slots x 200 ms, 100 orders/s; batches every
    /// 100 ms up to 20, i.e. up to twice the backend; each admitted user orders 0.2 to 2.2 s later,
    /// when a poll finds the token). Returns the batch each second, the backend's completions per
    /// second and the p95 of all order latencies, over the last `measure` seconds.
    fn crowd(
        step: impl Fn(ControlState, Option<Duration>, u64) -> ControlState,
        secs: usize,
        measure: usize,
    ) -> (Vec<u32>, f64, Duration) {
        const DT: u64 = 10; // ms
        let (slots, service) = (20usize, 200u64);
        let mut state = ControlState { batch: 20, ..ControlState::default() };
        let mut arrivals: Vec<(u64, u64)> = Vec::new(); // (arrival at the backend, admitted at)
        let mut waiting: std::collections::VecDeque<u64> = Default::default();
        let mut busy: Vec<(u64, u64)> = Vec::new(); // (done at, arrived at)
        let (mut second, mut all, mut batches) = (Vec::new(), Vec::new(), Vec::new());
        let mut completed = 0u64;
        let mut admitted = 0u64;
        for t in (0..secs as u64 * 1000).step_by(DT as usize) {
            if t % 100 == 0 {
                for _ in 0..state.batch {
                    // Golden-ratio spread: deterministic, evenly mixed delays.
                    let frac = (admitted as f64 * 0.618_033_988_75).fract();
                    arrivals.push((t + 200 + (frac * 2000.0) as u64, t));
                    admitted += 1;
                }
            }
            arrivals.retain(|&(at, _)| {
                if at <= t {
                    waiting.push_back(at);
                    false
                } else {
                    true
                }
            });
            busy.retain(|&(done, arrived)| {
                if done <= t {
                    let latency = ms(done - arrived);
                    second.push((latency_bucket(latency), 1));
                    if t >= (secs - measure) as u64 * 1000 {
                        all.push((latency_bucket(latency), 1));
                        completed += 1;
                    }
                    false
                } else {
                    true
                }
            });
            while busy.len() < slots {
                let Some(arrived) = waiting.pop_front() else { break };
                busy.push((t + service, arrived));
            }
            if t % 1000 == 0 && t > 0 {
                // The step acts on the second before (as reports arrive once a second).
                state = step(state, latency_quantile(&second, 0.95), second.len() as u64);
                second.clear();
                if t >= (secs - measure) as u64 * 1000 {
                    batches.push(state.batch);
                }
            }
        }
        (batches, completed as f64 / measure as f64, latency_quantile(&all, 0.95).unwrap())
    }

    #[test]
    fn under_a_steady_crowd_the_batch_settles_near_the_backend_capacity() {
        let c = Controller { target_p95: ms(300), min_batch: 1, max_batch: 20, interval: ms(100) };
        let (batches, per_sec, p95) = crowd(|s, p, n| control_step(c, s, p, n), 240, 180);
        let (lo, hi) = (*batches.iter().min().unwrap(), *batches.iter().max().unwrap());
        // The backend takes 10 per 100 ms: the batch stays around it, far from both extremes.
        assert!(lo >= 7 && hi <= 12, "batch between {lo} and {hi}: {batches:?}");
        assert!(per_sec >= 90.0, "backend at {per_sec}/s of 100/s");
        assert!(p95 <= ms(500), "order p95 {p95:?}");

        // Plain AIMD (halve while above, +1 while below) on the same crowd swings between the
        // extremes and keeps the backend's latency far higher.
        let plain = |s: ControlState, p: Option<Duration>, _| match p {
            None => s,
            Some(p) if p <= c.target_p95 => ControlState { batch: (s.batch + 1).min(20), ..s },
            Some(_) => ControlState { batch: (s.batch / 2).max(1), ..s },
        };
        let (plain_batches, plain_per_sec, plain_p95) = crowd(plain, 240, 180);
        let plain_lo = *plain_batches.iter().min().unwrap();
        println!(
            "controller: batch {lo}..{hi}, backend {per_sec:.1}/s, order p95 {p95:?}; \
             plain AIMD: batch {plain_lo}..{}, backend {plain_per_sec:.1}/s, order p95 {plain_p95:?}",
            plain_batches.iter().max().unwrap()
        );
        assert!(plain_lo <= 2, "{plain_batches:?}");
        assert!(plain_per_sec < per_sec && plain_p95 > p95, "plain {plain_per_sec}/s p95 {plain_p95:?}");
    }
}
