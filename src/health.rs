//! The operator's side: `/metrics`, `/healthz` and `/readyz` on `metrics_listen`, and the room
//! watcher that keeps readiness and the room-wide gauges fresh.
//!
//! Readiness and the gauges come from one probe a few times a second rather than from request
//! traffic, so an idle proxy still notices a dead Redis within a second and every proxy of a room
//! reports the same queue length, live tokens and batch in force.
//!
//! When an admission switch listens (contract section 11) the same probe also reads the batch in
//! force and the room's admissions of the last 10 s; the watcher turns them into the pace enter
//! and status estimate with (and its poll thresholds) and publishes it to
//! [`crate::admission`]. So the measured rate costs no Redis call on the request path, and is
//! at most a quarter of a second old.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::admission::{self, RoomView};
use crate::live::LiveConfig;
use crate::metrics;
use crate::rules;
use crate::store::{Room, RoomRules};

/// Whether the last probe reached Redis.
static REDIS_READY: AtomicBool = AtomicBool::new(false);

const PROBE_EVERY: Duration = Duration::from_millis(250);
/// Short enough that probe + wait stays under the one second the contract allows.
const PROBE_TIMEOUT: Duration = Duration::from_millis(600);

pub struct RoomWatcher {
    config: LiveConfig,
    room: Room,
}

impl RoomWatcher {
    pub fn new(config: LiveConfig, room: Room) -> RoomWatcher {
        let timeout = room.timeout().min(PROBE_TIMEOUT);
        RoomWatcher { config, room: room.with_timeout(timeout) }
    }

    async fn probe(&self) {
        let config = self.config.load();
        let room_rules = RoomRules::from_config(&config);
        let listens = room_rules.listens();
        match self.room.watch(&room_rules).await {
            Ok(stats) => {
                let batch_size = config.admission.batch_size.get();
                // The batch in force: the controller's, within the bounds configured now (as the
                // admit script clamps it), or batch_size when nothing adapts.
                let batch = match (&config.admission.adaptive, stats.stored_batch) {
                    (Some(adaptive), Some(stored)) => stored.clamp(adaptive.min_batch.get(), batch_size),
                    _ => batch_size,
                };
                let pace = if listens {
                    let min_batch = config.admission.adaptive.as_ref().map_or(1, |a| a.min_batch.get());
                    let pace = rules::measured_pace(
                        batch as u64,
                        config.admission.interval,
                        min_batch as u64,
                        stats.admitted_recently,
                        stats.since_first,
                    );
                    admission::publish(RoomView {
                        pace,
                        poll_thresholds: rules::pace_thresholds(pace, &config.poll_after),
                    });
                    pace
                } else {
                    admission::configured_pace(&config)
                };
                metrics::QUEUE_LENGTH.set(stats.waiting as i64);
                metrics::ACTIVE_TOKENS.set(stats.live_tokens as i64);
                metrics::QUEUE_TAIL_WAIT.set(rules::wait_secs(stats.waiting, pace) as i64);
                metrics::ADMISSION_BATCH.set(batch as i64);
                metrics::ESTIMATE_RATE.set(pace.rate.per_second());
                if !REDIS_READY.swap(true, Ordering::AcqRel) {
                    tracing::info!("redis answers: ready");
                }
                metrics::REDIS_UP.set(1);
            }
            Err(error) => {
                if REDIS_READY.swap(false, Ordering::AcqRel) {
                    tracing::warn!(%error, "redis does not answer: not ready");
                }
                metrics::REDIS_UP.set(0);
            }
        }
    }
}

#[async_trait]
impl BackgroundService for RoomWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut every = tokio::time::interval(PROBE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.probe().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Serves the operator endpoints.
pub struct OpsEndpoints;

fn plain(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_LENGTH, body.len())
        .header(http::header::CACHE_CONTROL, "no-store")
        .body(body)
        .unwrap_or_default()
}

#[async_trait]
impl ServeHttp for OpsEndpoints {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let text = "text/plain; charset=utf-8";
        if session.req_header().method != http::Method::GET {
            return plain(StatusCode::METHOD_NOT_ALLOWED, text, b"method not allowed\n".to_vec());
        }
        match session.req_header().uri.path() {
            "/metrics" => plain(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", metrics::render()),
            "/healthz" => plain(StatusCode::OK, text, b"ok\n".to_vec()),
            "/readyz" if REDIS_READY.load(Ordering::Acquire) => plain(StatusCode::OK, text, b"ready\n".to_vec()),
            "/readyz" => plain(StatusCode::SERVICE_UNAVAILABLE, text, b"redis unavailable\n".to_vec()),
            _ => plain(StatusCode::NOT_FOUND, text, b"not found\n".to_vec()),
        }
    }
}
