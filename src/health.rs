//! The operator's side: `/metrics`, `/healthz` and `/readyz` on `metrics_listen` (and the admin
//! API of [`crate::admin`] beside them, unless `admin.listen` gives it its own address), and the
//! room watcher that keeps readiness and the
//! room-wide gauges fresh.
//!
//! Readiness and the gauges come from one probe a few times a second rather than from request
//! traffic, so an idle proxy still notices a dead Redis within a second and every proxy of a room
//! reports the same queue length, live tokens and batch in force.
//!
//! When an admission switch listens (contract section 11) the same probe also reads the batch in
//! force and the room's admissions of the last 10 s; the watcher turns them into the pace enter
//! and status estimate with (and its poll thresholds) and publishes it in the room state
//! ([`RoomState::publish_view`]). So the measured rate costs no Redis call on the request path, and is
//! at most a quarter of a second old.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::admission::RoomView;
use crate::metrics;
use crate::periodic::Watch;
use crate::rules;
use crate::state::RoomState;
use crate::store::Room;

const PROBE_EVERY: Duration = Duration::from_millis(250);
/// Short enough that probe + wait stays under the one second the contract allows.
const PROBE_TIMEOUT: Duration = Duration::from_millis(600);

pub struct RoomWatcher {
    state: Arc<RoomState>,
    room: Room,
}

impl RoomWatcher {
    pub fn new(state: Arc<RoomState>, room: Room) -> RoomWatcher {
        let timeout = room.timeout().min(PROBE_TIMEOUT);
        RoomWatcher { state, room: room.with_timeout(timeout) }
    }
}

#[async_trait]
impl Watch for RoomWatcher {
    const EVERY: Duration = PROBE_EVERY;

    async fn step(&self) {
        let settings = self.state.snapshot();
        let (config, policy) = (&settings.config, &settings.policy);
        match self.room.watch(&policy.rules).await {
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
                    self.state.publish_view(RoomView {
                        pace,
                        poll_thresholds: rules::pace_thresholds(pace, &config.poll_after, policy.hold_secs),
                    });
                    pace
                } else {
                    policy.configured_pace
                };
                metrics::QUEUE_LENGTH.set(stats.waiting as i64);
                metrics::ACTIVE_TOKENS.set(stats.live_tokens as i64);
                metrics::QUEUE_TAIL_WAIT.set(rules::wait_secs(stats.waiting, pace) as i64);
                metrics::ADMISSION_BATCH.set(batch as i64);
                metrics::ESTIMATE_RATE.set(pace.rate.per_second());
                if !self.state.set_redis_ready(true) {
                    tracing::info!("redis answers: ready");
                }
                metrics::REDIS_UP.set(1);
            }
            Err(error) => {
                if self.state.set_redis_ready(false) {
                    tracing::warn!(%error, "redis does not answer: not ready");
                }
                metrics::REDIS_UP.set(0);
            }
        }
    }
}

/// What one operator listener serves: `metrics_listen` serves both unless `admin.listen` gives
/// the admin API an address of its own, so that a port opened to Prometheus and to health probes
/// need not expose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsPart {
    Both,
    /// `/metrics`, `/healthz`, `/readyz`: `/admin` is not found here.
    Probes,
    /// The admin API alone: every other path is not found.
    Admin,
}

/// Serves the operator endpoints, and the admin API under `/admin` ([`crate::admin`]).
pub struct OpsEndpoints {
    state: Arc<RoomState>,
    room: Room,
    part: OpsPart,
}

impl OpsEndpoints {
    pub fn new(state: Arc<RoomState>, room: Room, part: OpsPart) -> OpsEndpoints {
        OpsEndpoints { state, room, part }
    }
}

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
        let path = session.req_header().uri.path();
        let admin = path.strip_prefix(crate::admin::PREFIX).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        match (admin, self.part) {
            (true, OpsPart::Both | OpsPart::Admin) => return crate::admin::serve(&self.state, &self.room, session).await,
            (true, OpsPart::Probes) | (false, OpsPart::Admin) => {
                return plain(StatusCode::NOT_FOUND, text, b"not found\n".to_vec())
            }
            (false, _) => {}
        }
        if session.req_header().method != http::Method::GET {
            // RFC 9110 makes `Allow` part of every 405: without it a client cannot tell what
            // the path serves (schemathesis's unsupported-method check found it missing).
            let mut refused = plain(StatusCode::METHOD_NOT_ALLOWED, text, b"method not allowed\n".to_vec());
            refused.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static("GET"));
            return refused;
        }
        match session.req_header().uri.path() {
            "/metrics" => plain(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", metrics::render()),
            "/healthz" => plain(StatusCode::OK, text, b"ok\n".to_vec()),
            "/readyz" if self.state.redis_ready() => plain(StatusCode::OK, text, b"ready\n".to_vec()),
            "/readyz" => plain(StatusCode::SERVICE_UNAVAILABLE, text, b"redis unavailable\n".to_vec()),
            _ => plain(StatusCode::NOT_FOUND, text, b"not found\n".to_vec()),
        }
    }
}
