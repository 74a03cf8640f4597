//! The room watcher: one probe a few times a second keeps readiness and the room-wide gauges
//! fresh, rather than request traffic, so an idle proxy still notices a dead Redis within a
//! second and every proxy of a room reports the same queue length, live tokens and batch in
//! force.
//!
//! When an admission switch listens (contract section 11) the same probe also reads the batch in
//! force and the room's admissions of the last 10 s; the watcher turns them into the pace enter
//! and status estimate with (and its poll thresholds) and publishes it in the room
//! ([`Room::publish_view`]). So the measured rate costs no Redis call on the request path, and is
//! at most a quarter of a second old.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::metrics;
use crate::periodic::Watch;
use crate::process::Process;
use crate::room::pace::RoomView;
use crate::room::Room;
use crate::rules;
use crate::store::RoomStore;

const PROBE_EVERY: Duration = Duration::from_millis(250);
/// Short enough that probe + wait stays under the one second the contract allows.
const PROBE_TIMEOUT: Duration = Duration::from_millis(600);
/// A quiet room's probes: a wait that leaves the probe's timeout, and a little scheduling, in a
/// second (350 + 600 ms): 2.9 calls a second, which read the room's state too (and, with an
/// event, the event watcher's one a second).
const QUIET_PROBE_EVERY: Duration = Duration::from_millis(350);

pub struct RoomWatcher {
    process: Arc<Process>,
    room: Arc<Room>,
    store: RoomStore,
}

impl RoomWatcher {
    pub fn new(process: Arc<Process>, room: Arc<Room>, store: RoomStore) -> RoomWatcher {
        let timeout = store.timeout().min(PROBE_TIMEOUT);
        RoomWatcher { process, room, store: store.with_timeout(timeout) }
    }
}

#[async_trait]
impl Watch for RoomWatcher {
    const EVERY: Duration = PROBE_EVERY;
    /// Readiness is this watcher's too: a probe and its wait stay under the second the contract
    /// gives /readyz to notice Redis gone, even while the room is quiet.
    const QUIET_EVERY: Duration = QUIET_PROBE_EVERY;

    async fn step(&self) {
        let settings = self.room.snapshot();
        let (config, policy) = (&settings.config, &settings.policy);
        match self.store.watch(&policy.rules).await {
            Ok(stats) => {
                let batch = policy.batch_in_force(stats.stored_batch);
                let pace = if policy.listens {
                    let pace = rules::measured_pace(
                        batch as u64,
                        config.admission.interval,
                        policy.min_batch as u64,
                        stats.admitted_recently,
                        stats.since_first,
                    );
                    self.room.publish_view(RoomView {
                        pace,
                        poll_thresholds: rules::pace_thresholds(pace, &config.poll_after, policy.hold_secs),
                    });
                    pace
                } else {
                    policy.configured_pace
                };
                super::control::follow(&self.room, &stats.state, stats.state_since_ms);
                let metrics = self.room.metrics();
                self.room.activity().line_read(stats.waiting);
                metrics.queue_length.set(stats.waiting as i64);
                metrics.active_tokens.set(stats.live_tokens as i64);
                metrics.queue_tail_wait.set(rules::wait_secs(stats.waiting, pace) as i64);
                metrics.admission_batch.set(batch as i64);
                metrics.estimate_rate.set(pace.rate.per_second());
                if !self.process.set_redis_ready(true) {
                    tracing::info!("redis answers: ready");
                }
                metrics::REDIS_UP.set(1);
            }
            Err(error) => {
                if self.process.set_redis_ready(false) {
                    tracing::warn!(%error, "redis does not answer: not ready");
                }
                metrics::REDIS_UP.set(0);
            }
        }
    }
}
