//! How long a waiting user waits, and when they should ask again (contract sections 3 and 11):
//! the estimate from a position and a pace, the `poll_after` tiers, the thresholds the Redis
//! scripts enforce polling with, and the room's measured pace when admission listens.

use std::time::Duration;

use super::ceil_secs;

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

/// Whether a user with this estimate is near enough to the front for a held poll (contract
/// section 13): within `hold_secs`, `hold` rounded up to whole seconds; 0 never holds. Such a
/// user is told `pollAfter: 0`, so their next poll is a held one.
pub fn within_hold(estimated_wait_secs: u64, hold_secs: u64) -> bool {
    hold_secs > 0 && estimated_wait_secs <= hold_secs
}

/// What a waiting user is told to wait before polling again: 0 within the hold, else the tier's.
pub fn poll_after_held(estimated_wait_secs: u64, tiers: &[PollTier], hold_secs: u64) -> u64 {
    if within_hold(estimated_wait_secs, hold_secs) {
        return 0;
    }
    poll_after_secs(estimated_wait_secs, tiers)
}

/// The step function "position -> pollAfter" as thresholds a Redis script can apply without
/// knowing the arithmetic: `(first position of the tier, poll_after)`, in tier order. The
/// first entry whose position is reached applies, exactly as [`poll_after_secs`] of
/// [`estimated_wait_secs`] would decide (estimated wait never falls as the position grows).
pub fn poll_thresholds(rate: Rate, tiers: &[PollTier]) -> Vec<(u64, Duration)> {
    pace_thresholds(Pace::configured(rate), tiers, 0)
}

/// [`poll_thresholds`] for any pace and hold: what the scripts enforce when the estimate comes
/// from the room's measured rate, with pollAfter 0 for the positions within the hold (as
/// [`poll_after_held`] decides). A binary search per tier, cheap enough to redo whenever the
/// pace moves.
pub fn pace_thresholds(pace: Pace, tiers: &[PollTier], hold_secs: u64) -> Vec<(u64, Duration)> {
    let mut thresholds: Vec<(u64, Duration)> = tiers
        .iter()
        .map(|t| (first_position_waiting(pace, ceil_secs(t.min_wait)), Duration::from_secs(ceil_secs(t.poll_after).max(1))))
        .collect();
    if hold_secs > 0 {
        // Past the hold the tiers apply as without one; in front of it, nothing matches them, and
        // the last threshold (every position) says 0.
        let past_hold = first_position_waiting(pace, hold_secs.saturating_add(1));
        for (first, _) in &mut thresholds {
            *first = (*first).max(past_hold);
        }
        thresholds.push((1, Duration::ZERO));
    }
    thresholds
}

/// The smallest position whose estimated wait is at least `secs` at `pace` (`u64::MAX` if none).
fn first_position_waiting(pace: Pace, secs: u64) -> u64 {
    let (mut lo, mut hi) = (1u64, 1u64 << 53);
    if wait_secs(hi, pace) < secs {
        return u64::MAX;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if wait_secs(mid, pace) >= secs {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}


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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

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
            let thresholds = pace_thresholds(pace, &tiers, 0);
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

    #[test]
    fn within_the_hold_the_answer_is_poll_again_at_once() {
        let t = default_tiers();
        assert_eq!(poll_after_held(0, &t, 2), 0);
        assert_eq!(poll_after_held(2, &t, 2), 0, "the bound itself is within the hold");
        assert_eq!(poll_after_held(3, &t, 2), 2);
        assert_eq!(poll_after_held(0, &t, 0), 2, "hold 0 never holds");
        assert!(!within_hold(0, 0));
    }

    #[test]
    fn held_thresholds_agree_with_the_held_arithmetic() {
        let tiers = default_tiers();
        for hold in [0u64, 1, 2, 15, 90] {
            for pace in [
                Pace::configured(rate(10, 100)),
                measured_pace(7, ms(250), 2, 41, Some(ms(1200))),
                Pace::configured(rate(1, 1000)),
            ] {
                let thresholds = pace_thresholds(pace, &tiers, hold);
                for position in 1..12_000u64 {
                    let by_rules = poll_after_held(wait_secs(position, pace), &tiers, hold);
                    let by_thresholds = thresholds
                        .iter()
                        .find(|(first, _)| position >= *first)
                        .map(|(_, d)| d.as_secs())
                        .unwrap();
                    assert_eq!(by_rules, by_thresholds, "hold {hold} {pace:?} position {position}");
                }
            }
        }
    }
}
