//! Admission: the ticker every proxy runs, the adaptive controller's reports, and what this proxy
//! knows about the room's pace (the estimates enter and status give).
//!
//! **The ticker.** A background service on every proxy calls the room's admit script when the
//! room's schedule (kept in Redis, timed by Redis's clock) says a batch is due. The script lets
//! exactly one call per interval admit and tells the others how long to sleep. So the rate is the
//! room's, whatever the number of proxies, and admission carries on as long as any proxy is
//! alive. The switches of contract section 11 are applied inside that one script: it sweeps the
//! places of users who stopped polling (`queue.abandon_after`) before it pops, takes the batch in
//! force (adaptive), at most `max_active - live tokens`, and records what the interval spent so
//! that instant passes (given by enter, see `lua/enter.lua`) share the same batch.
//!
//! **Adaptive.** Every protected response's upstream latency lands in the room state's
//! [`LatencyHistogram`], a fixed-bucket histogram of atomics (recording costs one relaxed add). Once a second each
//! proxy drains it into one script call (`lua/adapt.lua`) that adds the counts to the room's
//! pending histogram in Redis and, when the room's step is due by Redis TIME, hands that proxy
//! every report since the previous step. The proxy computes the next batch with the pure
//! [`rules::control_step`] and stores it (`lua/adapt_commit.lua`, refused if a later step was
//! claimed meanwhile). So the room steps once a second however many proxies run, every proxy's
//! latencies count, and admit reads one stored batch: all proxies admit alike. The calls align
//! with the room's schedule, so each step sees about one second of every proxy's responses.
//!
//! **The room's pace.** When any switch listens, estimates use the room's measured admission
//! rate and batch in force (contract section 11). The room watcher ([`crate::health`]) reads
//! both with the gauges, four times a second, and publishes a [`RoomView`] in the room state;
//! enter and status read it through [`Pacing`] without a Redis call of their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::metrics;
use crate::periodic::every_pause;
use crate::policy::Policy;
use crate::rules::{self, Pace};
use crate::state::RoomState;
use crate::store::{PollClock, Room};

/// Protected upstream latencies seen by this proxy since its last report to the room.
pub struct LatencyHistogram {
    buckets: [AtomicU64; rules::LATENCY_BUCKETS],
}

impl LatencyHistogram {
    pub const fn new() -> LatencyHistogram {
        LatencyHistogram { buckets: [const { AtomicU64::new(0) }; rules::LATENCY_BUCKETS] }
    }

    pub fn record(&self, latency: Duration) {
        self.buckets[rules::latency_bucket(latency)].fetch_add(1, Ordering::Relaxed);
    }

    /// Takes every count recorded so far, as `(bucket, count)` for the non-empty buckets.
    pub fn drain(&self) -> Vec<(usize, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| match b.swap(0, Ordering::Relaxed) {
                0 => None,
                n => Some((i, n)),
            })
            .collect()
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
/// measured view when there is one (see [`crate::state::RoomState::pacing`]), else the policy's
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

/// The longest the ticker sleeps between two looks at the room's schedule.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// ... and while the room keeps its clock (`lua/room_clock.lua`): well under the second of
/// silence that the clock takes for an outage.
const MAX_SLEEP_KEEPING_TIME: Duration = Duration::from_millis(250);

pub struct Admitter {
    state: Arc<RoomState>,
    room: Room,
}

impl Admitter {
    pub fn new(state: Arc<RoomState>, room: Room) -> Admitter {
        Admitter { state, room }
    }

    /// One tick; returns how long to sleep before the next.
    async fn tick(&self) -> Duration {
        let settings = self.state.snapshot();
        let rules = &settings.policy.rules;
        let interval = rules.interval;
        let event = settings.config.event.as_ref();
        let (mut opens_at, mut closes_at) = (event.map(|e| e.opens_ms()), event.and_then(|e| e.closes_ms()));
        // The draw and the close are facts in Redis: times moved after them change nothing.
        if let (Some(_), Some(seen)) = (event, self.state.event().snapshot()) {
            if seen.drawn.is_some() {
                opens_at = None;
            }
            if seen.closed {
                closes_at = Some(0);
            }
        }
        match self.room.admit_within(rules, opens_at, closes_at).await {
            Ok(outcome) => {
                let label = match (outcome.was_due, outcome.admitted) {
                    (false, _) => "early",
                    (true, 0) => "idle",
                    (true, _) => "admitted",
                };
                metrics::ADMISSION_TICKS_TOTAL.with_label_values(&[label]).inc();
                metrics::ADMITTED_TOTAL.inc_by(outcome.admitted);
                metrics::ABANDONED_TOTAL.inc_by(outcome.abandoned);
                if outcome.admitted > 0 || outcome.abandoned > 0 {
                    tracing::debug!(
                        admitted = outcome.admitted,
                        abandoned = outcome.abandoned,
                        batch = outcome.batch,
                        "admission tick"
                    );
                }
                // Never sleep past one interval (a reload that shortens it applies at once), nor
                // past a second (a schedule changed in Redis, by another proxy or by an operator,
                // is noticed soon even with hour-long intervals).
                let longest = if rules.keeps_time() { MAX_SLEEP_KEEPING_TIME } else { MAX_SLEEP };
                outcome.next_due.clamp(Duration::from_micros(500), interval.min(longest))
            }
            Err(error) => {
                metrics::REDIS_ERRORS_TOTAL.inc();
                tracing::warn!(%error, "admission tick failed; retrying");
                interval.min(Duration::from_millis(100))
            }
        }
    }

    /// One adaptive report (and controller step, when this call claims it); returns how long to
    /// sleep before the next.
    async fn adapt(&self) -> Duration {
        let report = self.state.latencies().drain();
        let Some(controller) = self.state.settings().policy.controller else {
            // Nothing adapts: the latencies are dropped, so switching adaptive on later does
            // not feed the controller a backlog of old ones.
            return crate::store::ADAPT_PERIOD;
        };
        match self.room.adapt(&report).await {
            Ok(outcome) => {
                if let Some(step) = outcome.step {
                    let before = step.state.unwrap_or(controller.initial());
                    let p95 = rules::latency_quantile(&step.latencies, 0.95);
                    let responses: u64 = step.latencies.iter().map(|(_, n)| n).sum();
                    let after = rules::control_step(controller, before, p95, responses);
                    tracing::debug!(
                        responses,
                        p95_ms = p95.map(|d| d.as_secs_f64() * 1000.0),
                        from = before.batch,
                        to = after.batch,
                        "adaptive step"
                    );
                    if after != before || step.state.is_none() {
                        if let Err(error) = self.room.adapt_commit(&step.id, after).await {
                            metrics::REDIS_ERRORS_TOTAL.inc();
                            tracing::warn!(%error, "storing the adaptive batch failed");
                        }
                    }
                }
                // Call again just after the room's next step is due: the first call then acts,
                // with its own latest second included.
                (outcome.next_due + Duration::from_millis(2))
                    .clamp(Duration::from_millis(10), crate::store::ADAPT_PERIOD)
            }
            Err(error) => {
                metrics::REDIS_ERRORS_TOTAL.inc();
                tracing::warn!(%error, "adaptive report failed; retrying");
                Duration::from_millis(250)
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Admitter {
    async fn start(&self, shutdown: ShutdownWatch) {
        let ticker = every_pause(shutdown.clone(), || self.tick());
        let reporter = every_pause(shutdown.clone(), || self.adapt());
        tokio::join!(ticker, reporter);
        tracing::info!("admission ticker stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_drains_what_it_recorded() {
        let h = LatencyHistogram::new();
        h.record(Duration::from_millis(200));
        h.record(Duration::from_millis(200));
        h.record(Duration::from_micros(10));
        let drained = h.drain();
        assert_eq!(drained, vec![(0, 1), (rules::latency_bucket(Duration::from_millis(200)), 2)]);
        assert!(h.drain().is_empty(), "drained counts start again from zero");
    }
}
