//! The pingora glue: one `ProxyHttp` that sorts each request into an endpoint kind, lets the
//! endpoint's module decide (`enter`, `status`, `protected`), and otherwise forwards untouched.
//!
//! Phases used, in request order:
//! - `request_filter`: answer enter/status ourselves; check a protected request's token;
//! - `upstream_peer`: the one upstream, a prebuilt peer;
//! - `upstream_response_filter`: spend the token on a 2xx before the client sees the response;
//! - `fail_to_proxy`: a JSON 502 when the upstream cannot be reached;
//! - `logging`: metrics and the access log, once the response is done.

mod answer;
mod enter;
mod protected;
mod status;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};

pub use answer::Answer;

use crate::config::{Config, IdentityConfig};
use crate::live::LiveConfig;
use crate::metrics;
use crate::rules::{self, IdentityProblem};
use crate::store::{PollClock, Room};

/// Requests being handled right now; graceful shutdown waits for this to reach zero.
pub static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// What kind of request this is, decided once from method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Enter,
    Status,
    Page,
    Protected,
    Passthrough,
}

impl Endpoint {
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Enter => "enter",
            Endpoint::Status => "status",
            Endpoint::Page => "page",
            Endpoint::Protected => "protected",
            Endpoint::Passthrough => "passthrough",
        }
    }

    /// Sorts a request; the path is compared without its query string.
    pub fn classify(config: &Config, method: &http::Method, path: &str) -> Endpoint {
        if let Some(rest) = path.strip_prefix(config.endpoints.prefix.as_str()) {
            match rest {
                "/enter" => return Endpoint::Enter,
                "/status" => return Endpoint::Status,
                "/" if config.page.enabled && method == http::Method::GET => return Endpoint::Page,
                _ => {}
            }
        }
        if config.protected.iter().any(|r| r.method == method && r.path == path) {
            Endpoint::Protected
        } else {
            Endpoint::Passthrough
        }
    }
}

/// Per-request state shared across phases.
pub struct Ctx {
    endpoint: Endpoint,
    started: Instant,
    user: Option<String>,
    /// The token a protected request presented, to spend if the upstream answers 2xx.
    spend: Option<String>,
    upstream_started: Option<Instant>,
    upstream_status: Option<u16>,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The proxy service: the live configuration, this service's handle on the room, the upstream.
pub struct Waitroom {
    config: LiveConfig,
    room: Room,
    upstream: Box<HttpPeer>,
}

impl Waitroom {
    pub fn new(config: LiveConfig, room: Room, upstream: SocketAddr) -> Waitroom {
        let mut peer = HttpPeer::new(upstream, false, String::new());
        // A backend that does not accept within this is as good as down: answer 502 rather than
        // hold the user's connection.
        peer.options.connection_timeout = Some(Duration::from_secs(3));
        Waitroom { config, room, upstream: Box::new(peer) }
    }
}

/// The user named by the request, checked by the identity rules.
fn identity(config: &Config, session: &Session) -> Result<String, IdentityProblem> {
    match &config.identity {
        IdentityConfig::Header(name) => {
            let raw = session.req_header().headers.get(name).map(|v| v.as_bytes());
            rules::check_identity(raw).map(str::to_owned)
        }
        // The configuration refuses jwt until it is implemented.
        IdentityConfig::Jwt(_) => Err(IdentityProblem::Missing),
    }
}

/// The poll clock the scripts enforce, from the configuration in force.
fn poll_clock(config: &Config) -> PollClock<'_> {
    if !config.polling.enforce {
        return PollClock::OFF;
    }
    PollClock { on_time_factor: Some(1.0 - config.polling.grace), thresholds: &config.poll_thresholds }
}

/// Writes an answer of the proxy's own: JSON, never cached.
async fn write_answer(session: &mut Session, answer: Answer) -> Result<()> {
    let mut header = ResponseHeader::build(answer.status, Some(5))?;
    header.insert_header("Content-Type", "application/json")?;
    header.insert_header("Cache-Control", "no-store")?;
    header.insert_header("Content-Length", answer.body.len())?;
    if let Some(allow) = answer.allow {
        header.insert_header("Allow", allow)?;
    }
    if let Some(secs) = answer.retry_after {
        header.insert_header("Retry-After", secs)?;
    }
    session.write_response_header(Box::new(header), false).await?;
    session.write_response_body(Some(Bytes::from(answer.body)), true).await
}

/// Writes the waiting page: the one answer of ours that is HTML.
async fn write_page(session: &mut Session, page: Vec<u8>) -> Result<()> {
    let mut header = ResponseHeader::build(200, Some(4))?;
    header.insert_header("Content-Type", "text/html; charset=utf-8")?;
    header.insert_header("Cache-Control", "no-store")?;
    header.insert_header("Content-Length", page.len())?;
    header.insert_header("Vary", "Accept-Language")?;
    session.write_response_header(Box::new(header), false).await?;
    session.write_response_body(Some(Bytes::from(page)), true).await
}

#[async_trait]
impl ProxyHttp for Waitroom {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        Ctx {
            endpoint: Endpoint::Passthrough,
            started: Instant::now(),
            user: None,
            spend: None,
            upstream_started: None,
            upstream_status: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let config = self.config.load();
        let header = session.req_header();
        ctx.endpoint = Endpoint::classify(&config, &header.method, header.uri.path());
        let answer = match ctx.endpoint {
            Endpoint::Passthrough => return Ok(false),
            Endpoint::Page => {
                let accept_language = header.headers.get(http::header::ACCEPT_LANGUAGE);
                let page = crate::page::render(&config, accept_language.map(|v| v.as_bytes()));
                write_page(session, page).await?;
                return Ok(true);
            }
            Endpoint::Enter => enter::handle(&config, &self.room, session, ctx).await,
            Endpoint::Status => status::handle(&config, &self.room, session, ctx).await,
            Endpoint::Protected => match protected::check(&config, &self.room, session, ctx).await {
                None => return Ok(false),
                Some(refusal) => refusal,
            },
        };
        write_answer(session, answer).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        ctx.upstream_started = Some(Instant::now());
        Ok(self.upstream.clone())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let status = upstream_response.status.as_u16();
        if status < 200 {
            // Informational (100 Continue): the real answer is still to come.
            return Ok(());
        }
        ctx.upstream_status = Some(status);
        if let Some(started) = ctx.upstream_started {
            metrics::UPSTREAM_DURATION
                .with_label_values(&[ctx.endpoint.label()])
                .observe(started.elapsed().as_secs_f64());
        }
        if let (Some(token), Some(user)) = (ctx.spend.take(), ctx.user.as_deref()) {
            protected::settle(&self.room, user, &token, status).await;
        }
        Ok(())
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, _ctx: &mut Ctx) -> FailToProxy
    where
        Ctx: Send + Sync,
    {
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            _ => match e.esource() {
                ErrorSource::Upstream => 502,
                ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        // Only a response not yet started can be replaced by ours.
        if code > 0 && session.response_written().is_none() {
            let answer = match code {
                502 => Answer::error(502, "the upstream could not be reached"),
                400 => Answer::error(400, "bad request"),
                other => Answer::error(other, "the request could not be proxied"),
            };
            if let Err(err) = write_answer(session, answer).await {
                tracing::debug!(error = %err, "could not send the error response");
            }
        }
        FailToProxy { error_code: code, can_reuse_downstream: false }
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut Ctx) {
        let elapsed = ctx.started.elapsed();
        let endpoint = ctx.endpoint.label();
        metrics::REQUEST_DURATION.with_label_values(&[endpoint]).observe(elapsed.as_secs_f64());
        // A request that went upstream has an upstream outcome: a status class, or "error".
        if ctx.upstream_started.is_some() {
            metrics::UPSTREAM_RESPONSES_TOTAL
                .with_label_values(&[rules::status_class(ctx.upstream_status)])
                .inc();
        }
        let status = session.response_written().map(|r| r.status.as_u16()).unwrap_or(0);
        let header = session.req_header();
        tracing::info!(
            target: "waitroom::access",
            method = %header.method,
            path = header.uri.path(),
            status,
            endpoint,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            user = ctx.user.as_deref().unwrap_or("-"),
            error = error.map(|e| e.to_string()),
        );
    }
}
