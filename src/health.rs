//! The operator's side: `/metrics`, `/healthz` and `/readyz` on `metrics_listen` (and the admin
//! API of [`crate::admin`] beside them, unless `admin.listen` gives it its own address).
//! Readiness is the room watcher's probe (`crate::services::watch`), not request traffic.

use std::sync::Arc;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::metrics;
use crate::process::Process;
use crate::store::Redis;

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
    process: Arc<Process>,
    /// This service's connection to Redis (for the admin API's commands).
    redis: Redis,
    part: OpsPart,
}

impl OpsEndpoints {
    pub fn new(process: Arc<Process>, redis: Redis, part: OpsPart) -> OpsEndpoints {
        OpsEndpoints { process, redis, part }
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
            (true, OpsPart::Both | OpsPart::Admin) => return crate::admin::serve(&self.process, &self.redis, session).await,
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
            "/readyz" if self.process.redis_ready() => plain(StatusCode::OK, text, b"ready\n".to_vec()),
            "/readyz" => plain(StatusCode::SERVICE_UNAVAILABLE, text, b"redis unavailable\n".to_vec()),
            _ => plain(StatusCode::NOT_FOUND, text, b"not found\n".to_vec()),
        }
    }
}
