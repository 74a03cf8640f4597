//! The admission ticker: a background service on every proxy that calls the room's admit script
//! when the room's schedule (kept in Redis, timed by Redis's clock) says a batch is due.
//!
//! Every proxy runs one; the script lets exactly one call per interval admit and tells the others
//! how long to sleep. So the rate is the room's, whatever the number of proxies, and admission
//! carries on as long as any proxy is alive.

use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::live::LiveConfig;
use crate::metrics;
use crate::store::Room;

pub struct Admitter {
    config: LiveConfig,
    room: Room,
}

impl Admitter {
    pub fn new(config: LiveConfig, room: Room) -> Admitter {
        Admitter { config, room }
    }

    /// One tick; returns how long to sleep before the next.
    async fn tick(&self) -> Duration {
        let config = self.config.load();
        let interval = config.admission.interval;
        let batch = config.admission.batch_size.get();
        metrics::ADMISSION_BATCH.set(batch as i64);
        match self.room.admit(interval, batch, config.token.ttl).await {
            Ok(outcome) => {
                let label = match (outcome.was_due, outcome.admitted) {
                    (false, _) => "early",
                    (true, 0) => "idle",
                    (true, _) => "admitted",
                };
                metrics::ADMISSION_TICKS_TOTAL.with_label_values(&[label]).inc();
                metrics::ADMITTED_TOTAL.inc_by(outcome.admitted);
                if outcome.admitted > 0 {
                    tracing::debug!(admitted = outcome.admitted, "admitted a batch");
                }
                // Never sleep past one interval, so a reload that shortens it applies at once.
                outcome.next_due.clamp(Duration::from_micros(500), interval)
            }
            Err(error) => {
                metrics::REDIS_ERRORS_TOTAL.inc();
                tracing::warn!(%error, "admission tick failed; retrying");
                interval.min(Duration::from_millis(100))
            }
        }
    }
}

#[async_trait]
impl BackgroundService for Admitter {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let pause = self.tick().await;
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => {
                    tracing::info!("admission ticker stopped");
                    return;
                }
            }
        }
    }
}
