//! The adaptive controller (contract section 11): the latency histogram every proxy reports to
//! the room, its p95, and the controller's once-a-second step from it to the next batch.

use std::time::Duration;


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

/// The 1-based rank of the sample that is the `q` quantile of `total` samples.
fn quantile_rank(q: f64, total: u64) -> u64 {
    ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).clamp(1, total)
}

/// Protected upstream latencies: what one proxy reports once a second, and what a controller
/// step adds up from every proxy of the room.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Latencies {
    /// The histogram, as `(bucket, count)` pairs (any order, repeats add up).
    pub buckets: Vec<(usize, u64)>,
    /// How many of them were judged against the room's `target_p95` when they were recorded...
    pub judged: u64,
    /// ... and how many of those were above it.
    pub over_target: u64,
}

impl Latencies {
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|(_, n)| n).sum()
    }

    /// The p95 the controller steps on. The histogram's is interpolated inside a bucket about
    /// 25 ms wide at 300 ms, and the target sits inside such a bucket: a second whose slowest
    /// twentieth waited 300-304 ms read as 290 and was not cut, and a room whose backend runs at
    /// its capacity spends seconds there (issue 38's `drop-b`). Whether the p95 is above the
    /// target is therefore decided by the exact count of samples above it, whenever every sample
    /// was judged (a proxy of an older version, which judges none, leaves the histogram alone to
    /// decide); the histogram still says by how much. A reload that changes `target_p95` has the
    /// proxies judge against the old target until each has reloaded: the steps of those seconds
    /// count against it.
    pub fn p95(&self, target: Duration) -> Option<Duration> {
        let p95 = latency_quantile(&self.buckets, 0.95)?;
        let total = self.count();
        if self.judged != total {
            return Some(p95);
        }
        let above = self.over_target > total - quantile_rank(0.95, total);
        Some(match (above, p95 > target) {
            (true, false) => target + Duration::from_micros(1),
            (false, true) => target,
            _ => p95,
        })
    }
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
    let rank = quantile_rank(q, total);
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A second as a room's proxies report it, each latency judged against `target`.
    fn second(samples: &[u64], target: u64) -> Latencies {
        Latencies {
            buckets: samples.iter().map(|m| (latency_bucket(ms(*m)), 1)).collect(),
            judged: samples.len() as u64,
            over_target: samples.iter().filter(|m| **m > target).count() as u64,
        }
    }

    #[test]
    fn the_count_above_the_target_decides_whether_the_p95_is_above_it() {
        // 90 orders at 210 ms and 10 that waited for a slot, at 301-303 ms: the true p95 is
        // 302 ms, the histogram reads it inside its 279-304 ms bucket as about 291.
        let mut slow: Vec<u64> = vec![210; 90];
        slow.extend([301, 302, 303].iter().cycle().take(10));
        let read = latency_quantile(&second(&slow, 300).buckets, 0.95).unwrap();
        assert!(read < ms(300), "the histogram alone misses it: {read:?}");
        let p95 = second(&slow, 300).p95(ms(300)).unwrap();
        assert!(p95 > ms(300) && p95 < ms(301), "{p95:?}");
        // Exactly five of a hundred above the target: the p95 is the 95th, at the target or below.
        let mut five: Vec<u64> = vec![210; 90];
        five.extend([295; 5]);
        five.extend([303; 5]);
        assert!(second(&five, 300).p95(ms(300)).unwrap() <= ms(300));
        let mut six = five.clone();
        six[0] = 303;
        assert!(second(&six, 300).p95(ms(300)).unwrap() > ms(300));
        // The other way: the histogram reads above the target, the count says it is not.
        let mut under: Vec<u64> = vec![210; 60];
        under.extend([299; 40]);
        assert!(latency_quantile(&second(&under, 300).buckets, 0.95).unwrap() > ms(300));
        assert_eq!(second(&under, 300).p95(ms(300)), Some(ms(300)));
        // Far from the target the histogram's value stands.
        let far = second(&[100, 2000], 300);
        assert_eq!(far.p95(ms(300)), latency_quantile(&far.buckets, 0.95));
        // A report that did not judge every sample (an older proxy's) leaves the histogram alone.
        let partly = Latencies { judged: 50, ..second(&slow, 300) };
        assert_eq!(partly.p95(ms(300)), Some(read));
        assert_eq!(Latencies::default().p95(ms(300)), None);
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

    /// The states the controller goes through from `start`, one step per `(p95 ms, served)`.
    fn walk(c: Controller, start: ControlState, readings: &[(u64, u64)]) -> Vec<ControlState> {
        let mut s = start;
        readings
            .iter()
            .map(|&(p95, served)| {
                s = control_step(c, s, Some(ms(p95)), served);
                s
            })
            .collect()
    }

    #[test]
    fn the_controller_lets_a_cut_settle_before_the_next() {
        // Halved at 600 ms; the latency keeps rising for a while: two steps hold, the third cuts
        // again.
        let states = walk(controller(), batch(10), &[(600, 0), (800, 0), (900, 0), (900, 0)]);
        let seen: Vec<(u32, u32)> = states.iter().map(|s| (s.batch, s.settle)).collect();
        assert_eq!(seen, [(5, 2), (5, 1), (5, 0), (2, 2)]);
    }

    #[test]
    fn the_controller_probes_slowly_near_the_capacity_it_saw() {
        // The last cut saw the backend serve 60/s: 6 per interval. Below that: one a step (50/s);
        // at it, with the p95 past half the target: one every third step; a p95 far under the
        // target (the backend got faster, 70/s): full speed again.
        let start = ControlState { batch: 5, settle: 0, served_at_cut: Some(60), probe_wait: 0 };
        let readings = [(250, 50), (250, 60), (250, 60), (250, 60), (60, 70)];
        let states = walk(controller(), start, &readings);
        let seen: Vec<(u32, u32)> = states.iter().map(|s| (s.batch, s.probe_wait)).collect();
        assert_eq!(seen, [(6, 0), (6, 1), (6, 2), (7, 0), (8, 0)]);
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
