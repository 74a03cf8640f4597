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
//! [`LatencyHistogram`](crate::room::pace::LatencyHistogram), a fixed-bucket histogram of atomics (recording costs one relaxed add). Once a second each
//! proxy drains it into one script call (`lua/adapt.lua`) that adds the counts to the room's
//! pending histogram in Redis and, when the room's step is due by Redis TIME, hands that proxy
//! every report since the previous step. The proxy computes the next batch with the pure
//! [`rules::control_step`] and stores it (`lua/adapt_commit.lua`, refused if a later step was
//! claimed meanwhile). So the room steps once a second however many proxies run, every proxy's
//! latencies count, and admit reads one stored batch: all proxies admit alike. The calls align
//! with the room's schedule, so each step sees about one second of every proxy's responses.
//!
//! **The room's pace.** When any switch listens, estimates use the room's measured admission
//! rate and batch in force (contract section 11). The room watcher ([`crate::services::watch`]) reads
//! both with the gauges, four times a second, and publishes a [`RoomView`](crate::room::pace::RoomView) in the room;
//! enter and status read it through [`Pacing`](crate::room::pace::Pacing) without a Redis call of their own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::metrics;
use crate::periodic::every_pause;
use crate::room::Room;
use crate::rules;
use crate::store::RoomStore;

/// The longest the ticker sleeps between two looks at the room's schedule.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// ... and while the room keeps its clock (`lua/room_clock.lua`): well under the second of
/// silence that the clock takes for an outage.
const MAX_SLEEP_KEEPING_TIME: Duration = Duration::from_millis(250);

pub struct Admitter {
    room: Arc<Room>,
    store: RoomStore,
}

impl Admitter {
    pub fn new(room: Arc<Room>, store: RoomStore) -> Admitter {
        Admitter { room, store }
    }

    /// `run`'s pause, or while the room is quiet, no call and a quiet look's wait.
    async fn unless_quiet<F: std::future::Future<Output = Duration>>(&self, run: impl FnOnce() -> F) -> Duration {
        if self.room.is_quiet() {
            self.room.pause(Duration::ZERO, crate::room::quiet::QUIET_EVERY).await;
            return Duration::ZERO;
        }
        run().await
    }

    /// One tick; returns how long to sleep before the next.
    async fn tick(&self) -> Duration {
        let settings = self.room.snapshot();
        let rules = &settings.policy.rules;
        let interval = rules.interval;
        let event = settings.config.event.as_ref();
        let (mut opens_at, mut closes_at) = (event.map(|e| e.opens_ms()), event.and_then(|e| e.closes_ms()));
        // The draw and the close are facts in Redis: times moved after them change nothing.
        if let (Some(_), Some(seen)) = (event, self.room.event().snapshot()) {
            if seen.drawn.is_some() {
                opens_at = None;
            }
            if seen.closed {
                closes_at = Some(0);
            }
        }
        let ticket = self.room.line().ticket();
        match self.store.admit_within(rules, opens_at, closes_at).await {
            Ok(outcome) => {
                // Before the tick is counted: whoever sees it counted is told READY.
                if let Some(passed) = outcome.passed {
                    self.room.line().learn_popped(passed, ticket);
                }
                let label = match (outcome.was_due, outcome.admitted) {
                    (false, _) => "early",
                    (true, 0) => "idle",
                    (true, _) => "admitted",
                };
                let metrics = self.room.metrics();
                metrics.ticks.with(label, |count| count.inc());
                metrics.admitted.inc_by(outcome.admitted);
                metrics.abandoned.inc_by(outcome.abandoned);
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
        let report = self.room.latencies().drain();
        let Some(controller) = self.room.settings().policy.controller else {
            // Nothing adapts: the latencies are dropped, so switching adaptive on later does
            // not feed the controller a backlog of old ones.
            return crate::store::ADAPT_PERIOD;
        };
        match self.store.adapt(&report).await {
            Ok(outcome) => {
                if let Some(step) = outcome.step {
                    let before = step.state.unwrap_or(controller.initial());
                    let p95 = step.latencies.p95(controller.target_p95);
                    let responses = step.latencies.count();
                    let after = rules::control_step(controller, before, p95, responses);
                    tracing::debug!(
                        responses,
                        p95_ms = p95.map(|d| d.as_secs_f64() * 1000.0),
                        from = before.batch,
                        to = after.batch,
                        "adaptive step"
                    );
                    if after != before || step.state.is_none() {
                        if let Err(error) = self.store.adapt_commit(&step.id, after).await {
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
        // A quiet room (see crate::room::quiet) calls nothing until it wakes: an empty line has
        // nobody to admit and no latencies to report.
        let ticker = every_pause(shutdown.clone(), || self.unless_quiet(|| self.tick()));
        let reporter = every_pause(shutdown.clone(), || self.unless_quiet(|| self.adapt()));
        tokio::join!(ticker, reporter);
        tracing::info!("admission ticker stopped");
    }
}
