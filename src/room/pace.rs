//! What a proxy knows about its room's pace: the protected latencies it has seen since its last
//! report (the adaptive controller's input) and the pace estimates are given at (the measured
//! one the room watcher publishes when the room listens, else the configured one). See
//! `crate::services::admission` for the services that feed and read them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::policy::Policy;
use crate::rules::{self, Pace};
use crate::store::PollClock;

/// Protected upstream latencies seen by this proxy since its last report to the room.
pub struct LatencyHistogram {
    buckets: [AtomicU64; rules::LATENCY_BUCKETS],
    /// Latencies recorded with the room's target at hand, and of them those above it: see
    /// [`rules::Latencies::p95`].
    judged: AtomicU64,
    over_target: AtomicU64,
}

impl LatencyHistogram {
    pub const fn new() -> LatencyHistogram {
        LatencyHistogram {
            buckets: [const { AtomicU64::new(0) }; rules::LATENCY_BUCKETS],
            judged: AtomicU64::new(0),
            over_target: AtomicU64::new(0),
        }
    }

    /// `target`: the room's `target_p95`, when it adapts.
    pub fn record(&self, latency: Duration, target: Option<Duration>) {
        self.buckets[rules::latency_bucket(latency)].fetch_add(1, Ordering::Relaxed);
        if let Some(target) = target {
            self.judged.fetch_add(1, Ordering::Relaxed);
            if latency > target {
                self.over_target.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Takes everything recorded so far (the non-empty buckets only).
    pub fn drain(&self) -> rules::Latencies {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| match b.swap(0, Ordering::Relaxed) {
                0 => None,
                n => Some((i, n)),
            })
            .collect();
        rules::Latencies {
            buckets,
            judged: self.judged.swap(0, Ordering::Relaxed),
            over_target: self.over_target.swap(0, Ordering::Relaxed),
        }
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

/// The room's pace as the watcher last read it, for rules that listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomView {
    pub pace: Pace,
    /// `poll_after` as position thresholds at that pace, for enforced polling.
    pub poll_thresholds: Vec<(u64, Duration)>,
}

/// The pace estimates are given at, and the thresholds enforced polling uses: the room's
/// measured view when there is one (see [`crate::room::Room::pacing`]), else the policy's
/// configured pace.
pub struct Pacing<'a> {
    policy: &'a Policy,
    view: Option<Arc<RoomView>>,
}

impl<'a> Pacing<'a> {
    pub fn new(policy: &'a Policy, view: Option<Arc<RoomView>>) -> Pacing<'a> {
        Pacing { policy, view }
    }

    pub fn pace(&self) -> Pace {
        self.view.as_ref().map_or(self.policy.configured_pace, |v| v.pace)
    }

    /// The poll clock the scripts enforce: thresholds from the same pace the answers use.
    pub fn poll_clock(&self) -> PollClock<'_> {
        let Some(factor) = self.policy.on_time_factor else {
            return PollClock::OFF;
        };
        let thresholds = self.view.as_ref().map_or(&self.policy.poll_thresholds, |v| &v.poll_thresholds);
        PollClock { on_time_factor: Some(factor), thresholds }
    }

    /// The poll clock for an answer that says `pollAfter: 0` whatever the position (the end of
    /// a held poll): the next call is on time at once.
    pub fn poll_clock_at_once(&self) -> PollClock<'static> {
        const AT_ONCE: &[(u64, Duration)] = &[(1, Duration::ZERO)];
        match self.policy.on_time_factor {
            Some(factor) => PollClock { on_time_factor: Some(factor), thresholds: AT_ONCE },
            None => PollClock::OFF,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_drains_what_it_recorded() {
        let h = LatencyHistogram::new();
        let target = Some(Duration::from_millis(150));
        h.record(Duration::from_millis(200), target);
        h.record(Duration::from_millis(200), None);
        h.record(Duration::from_micros(10), target);
        let drained = h.drain();
        assert_eq!(drained.buckets, vec![(0, 1), (rules::latency_bucket(Duration::from_millis(200)), 2)]);
        assert_eq!((drained.judged, drained.over_target), (2, 1));
        assert_eq!(h.drain(), rules::Latencies::default(), "drained counts start again from zero");
    }
}
