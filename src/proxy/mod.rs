//! The pingora glue: one `ProxyHttp` that sorts each request into an endpoint kind, lets the
//! endpoint's module decide (`enter`, `status`, `protected`), and otherwise forwards untouched.
//!
//! Phases used, in request order:
//! - `request_filter`: answer enter/status ourselves; check a protected request's token;
//! - `upstream_peer`: the one upstream, a prebuilt peer;
//! - `upstream_request_filter`: the verified identity onto a protected request; from here on a
//!   protected request has reached the upstream, and its outcome is unknown until a status line;
//! - `upstream_response_filter`: the status line settles the token (spent on a 2xx, or released)
//!   before the client sees the response; `Waitroom-Command` never reaches a client;
//! - `fail_to_proxy`: a JSON 502 when the upstream cannot be reached, 504 when it does not answer
//!   within `limits.upstream_timeout`; for an order sent with no status line back, saying that
//!   its outcome is unknown;
//! - `logging`: metrics and the access log, once the response is done.

mod answer;
mod bypass;
pub mod early;
mod enter;
mod event;
pub mod headers;
mod protected;
mod route;
mod sender;
mod status;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::modules::http::HttpModules;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};

pub use answer::Answer;

use crate::config::{Config, IdentityConfig, RoomMode};
use crate::identity::Refusal;
use crate::http1::head::Body;
use crate::connection::{Delimited, WRITE_TIMEOUT};
use crate::logging;
use crate::metrics;
use crate::paths::{self, PathRefusal};
use crate::rules::{self, Outcome, TokenFate};
use crate::process::{InFlight, Process};
use crate::room::Room;

/// What kind of request this is, decided once from method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Enter,
    Status,
    Page,
    /// `{prefix}/event` and `{prefix}/event/draw`: the proxy's whether or not an event is
    /// configured (404 without one), so a reload that adds or removes the event never hands the
    /// path to the upstream, nor a spec's client two owners of one path.
    Event,
    EventDraw,
    Protected,
    Passthrough,
}

impl Endpoint {
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Enter => "enter",
            Endpoint::Status => "status",
            Endpoint::Page => "page",
            Endpoint::Event | Endpoint::EventDraw => "event",
            Endpoint::Protected => "protected",
            Endpoint::Passthrough => "passthrough",
        }
    }

    /// Sorts a request: the proxy's own endpoints by their exact path, then the `protected`
    /// rules on the canonical path (contract section 12, see [`crate::paths`]). A protected
    /// request whose target is not canonical comes with the target to forward instead, so the
    /// upstream routes what was checked; a target the proxy refuses to guess at is refused.
    pub fn classify(config: &Config, header: &RequestHeader) -> Result<(Endpoint, Option<Vec<u8>>), PathRefusal> {
        if let Some(endpoint) = Endpoint::own(config, header) {
            return Ok((endpoint, None));
        }
        let methods = paths::Methods::of(&header.method, &header.headers);
        Endpoint::by_rules(config, &methods, &paths::Target::read(header.raw_path()))
    }

    /// The proxy's own endpoint `header` asks for in the room of `config`, if any.
    fn own(config: &Config, header: &RequestHeader) -> Option<Endpoint> {
        let rest = header.uri.path().strip_prefix(config.endpoints.prefix.as_str())?;
        Endpoint::own_below(config, &header.method, rest)
    }

    /// The proxy's own endpoint at `rest`, the path after the room's prefix, if any.
    fn own_below(config: &Config, method: &http::Method, rest: &str) -> Option<Endpoint> {
        match rest {
            "/enter" => Some(Endpoint::Enter),
            "/status" => Some(Endpoint::Status),
            "/" if config.page.enabled && *method == http::Method::GET => Some(Endpoint::Page),
            "/event" => Some(Endpoint::Event),
            "/event/draw" => Some(Endpoint::EventDraw),
            _ => None,
        }
    }

    /// What the room's `protected` rules make of a request that is none of its own endpoints,
    /// its target read already (once, whatever the number of rooms).
    fn by_rules(
        config: &Config,
        methods: &paths::Methods<'_>,
        target: &paths::Target<'_>,
    ) -> Result<(Endpoint, Option<Vec<u8>>), PathRefusal> {
        if !target.check(&config.protected, methods)? {
            return Ok((Endpoint::Passthrough, None));
        }
        let canonical = target.canonical().expect("a protected target was read");
        Ok(match canonical.forward_target() {
            Cow::Borrowed(_) => (Endpoint::Protected, None),
            Cow::Owned(target) => (Endpoint::Protected, Some(target)),
        })
    }
}

/// Per-request state shared across phases.
pub struct Ctx {
    endpoint: Endpoint,
    started: Instant,
    user: Option<String>,
    /// The token a protected request claimed: spent if the upstream answers 2xx, else released.
    claimed: Option<protected::Claimed>,
    upstream_started: Option<Instant>,
    /// The request's head has gone to the upstream: from here on, no status line back means the
    /// upstream may have acted on it.
    sent: bool,
    upstream_status: Option<u16>,
    /// The room the request is to (none for a request no room serves).
    room: Option<Arc<Room>>,
    /// Counts the request for a graceful stop until the context is dropped.
    _in_flight: InFlight,
}

/// The proxy service: the process (its settings and rooms) and the upstream.
pub struct Waitroom {
    process: Arc<Process>,
    upstream: Box<HttpPeer>,
    /// The peers of rooms' own upstreams (section 17), by address as written, resolved on first
    /// use.
    room_upstreams: std::sync::Mutex<std::collections::HashMap<String, Box<HttpPeer>>>,
}

impl Waitroom {
    pub fn new(process: Arc<Process>, upstream: SocketAddr) -> Waitroom {
        Waitroom { process, upstream: peer_at(upstream), room_upstreams: Default::default() }
    }

    /// Where a request goes: a room's protected request to its room's `upstream` when it has one
    /// of its own, everything else to the proxy's.
    fn peer_for(&self, ctx: &Ctx) -> Result<Box<HttpPeer>> {
        let (Endpoint::Protected, Some(room)) = (ctx.endpoint, &ctx.room) else {
            return Ok(self.upstream.clone());
        };
        let wanted = room.settings().config.upstream.clone();
        if wanted == self.process.settings().config.upstream {
            return Ok(self.upstream.clone());
        }
        let peers = || self.room_upstreams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(peer) = peers().get(&wanted) {
            return Ok(peer.clone());
        }
        // Resolved without the lock: a slow lookup holds up this request, not every other room's.
        let address = std::net::ToSocketAddrs::to_socket_addrs(&wanted.as_str())
            .ok()
            .and_then(|mut addresses| addresses.next())
            .ok_or_else(|| Error::explain(ErrorType::ConnectError, format!("room upstream {wanted} does not resolve")))?;
        let peer = peer_at(address);
        peers().insert(wanted, peer.clone());
        Ok(peer)
    }
}

fn peer_at(address: SocketAddr) -> Box<HttpPeer> {
    let mut peer = HttpPeer::new(address, false, String::new());
    // A backend that does not accept within this is as good as down: answer 502 rather than
    // hold the user's connection.
    peer.options.connection_timeout = Some(Duration::from_secs(3));
    Box::new(peer)
}

impl Waitroom {
    /// Whether a protected request skips the room (see [`bypass`]). The bypass header leaves the
    /// request here either way. In JWT mode a bypassing request that carries a valid token keeps
    /// its verified identity for the upstream; one without gets no identity header at all (see
    /// `upstream_request_filter`).
    fn bypasses(&self, config: &Config, session: &mut Session, ctx: &mut Ctx) -> bool {
        let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip());
        let header = session.req_header();
        let found = bypass::applies(&config.bypass, &config.abuse.trusted_proxies, peer, &header.headers);
        if found.skips && matches!(config.identity, IdentityConfig::Jwt(_)) {
            ctx.user = identity(config, session).ok();
        }
        if let (true, Some(rule)) = (found.carries_header, &config.bypass.header) {
            session.req_header_mut().remove_header(&rule.name);
        }
        found.skips
    }

    /// Settles a claim that no status line settled: an order that reached the upstream and failed
    /// there (`error` from upstream) has an unknown outcome (spent unless
    /// `token.unknown_outcome: release`). Any other is released, so the user may retry: one that
    /// never left, one a filter of ours failed before it was sent, and one whose client stopped
    /// sending its body, which leaves the upstream an unfinished request it cannot take for an
    /// order (a client that leaves once its body is whole is kept from pingora until the answer,
    /// see [`crate::connection::hold_client`]). Returns whether the outcome was unknown, and the fate
    /// it gave the token, if the request held a claim.
    async fn settle_unanswered(&self, ctx: &mut Ctx, error: Option<&Error>) -> Option<(Outcome, TokenFate)> {
        let (Some(claimed), Some(user), Some(room)) = (ctx.claimed.take(), ctx.user.as_deref(), ctx.room.as_deref()) else {
            return None;
        };
        let upstream_failed = error.is_none_or(|e| matches!(e.esource(), ErrorSource::Upstream));
        let outcome = if ctx.sent && upstream_failed { Outcome::Unknown } else { Outcome::NotSent };
        if outcome == Outcome::Unknown {
            room.metrics().requests.protected.with("unknown", |count| count.inc());
            tracing::warn!(user, "an order reached the upstream and no status line came back: its outcome is unknown");
        }
        // Cloned, not borrowed: a settings guard must not be held across an await.
        let lifetimes = room.settings().config.token.clone();
        let fate = protected::settle(room, user, claimed, outcome, &lifetimes).await;
        Some((outcome, fate))
    }
}

/// [`crate::services::control::ORIGIN_HEADER`], parsed once.
const ORIGIN_NAME: http::HeaderName = http::HeaderName::from_static(crate::services::control::ORIGIN_HEADER);

/// `Upgrade` and `HTTP2-Settings`: what a request that asks to switch protocols carries.
const HTTP2_SETTINGS: &str = "http2-settings";

/// Whether a request that asks to switch protocols is forwarded without asking (contract
/// section 12): a protected one always, any other unless it asks for WebSocket alone. A tunnel
/// carries bytes no rule looks at, and `h2c` would carry requests the room never classifies.
fn drops_switch(endpoint: Endpoint, upgrade: &http::HeaderValue, headers: &http::HeaderMap) -> bool {
    let websocket = headers.get_all(http::header::UPGRADE).iter().count() == 1
        && upgrade.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket");
    endpoint == Endpoint::Protected || !websocket
}

/// Keeps the identity header (trusted-header mode) and the token header out of `Connection`'s
/// reach, so they travel to the upstream as the client sent them (see [`headers`]).
fn shield_room_headers(config: &Config, session: &mut Session) -> Result<()> {
    let headers = &session.req_header().headers;
    if !headers.contains_key(http::header::CONNECTION) {
        return Ok(());
    }
    let lines = match &config.identity {
        IdentityConfig::Header(identity) => headers::shielded_connection(headers, &[identity, &config.token.header]),
        IdentityConfig::Jwt(_) => headers::shielded_connection(headers, &[&config.token.header]),
    };
    if let Some(lines) = lines {
        let request = session.req_header_mut();
        request.remove_header(&http::header::CONNECTION);
        for line in lines {
            request.append_header(http::header::CONNECTION, line)?;
        }
    }
    Ok(())
}

/// The parse step enter and status share: the one method the endpoint serves (any other gets its
/// 405 first, whatever it carries), then who is asking.
fn caller<'c>(
    config: &Config,
    session: &Session,
    ctx: &'c mut Ctx,
    served: http::Method,
    allow: &'static str,
) -> std::result::Result<&'c str, Answer> {
    if session.req_header().method != served {
        return Err(Answer::method_not_allowed(allow));
    }
    match identity(config, session) {
        Ok(user) => Ok(ctx.user.insert(user)),
        Err(problem) => Err(Answer::identity(problem)),
    }
}

/// The user named by the request (trusted header or verified JWT, see [`crate::identity`]),
/// checked by the identity rules.
fn identity(config: &Config, session: &Session) -> Result<String, Refusal> {
    identity_in(config, &session.req_header().headers)
}

fn identity_in(config: &Config, headers: &http::HeaderMap) -> Result<String, Refusal> {
    crate::identity::identify(&config.identity, headers).inspect_err(|refusal| {
        // The reason, never the token or the JWT itself.
        tracing::debug!(reason = refusal.message(), status = refusal.status(), "identity refused");
    })
}

/// Each read of a request body must bring bytes within this, or the request fails (400): a
/// client cannot hold a connection, or an upstream request, by trickling its body.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The proxy's own endpoints read no body; a larger one is refused (413) without reading it.
const OWN_BODY_LIMIT: u64 = 8 * 1024;

/// Where a request is counted: its room's series, or those of requests that belong to no room.
fn request_metrics(ctx: &Ctx) -> &metrics::RequestMetrics {
    ctx.room.as_ref().map_or(&*metrics::OUTSIDE_ROOMS, |room| &room.metrics().requests)
}

/// Timeouts for a slow client (docs/threat-model.md). pingora keeps its
/// own for the header and idle keep-alive (60 s a read) and its 1 MiB header cap.
fn limit_slow_clients(session: &mut Session) {
    session.set_read_timeout(Some(BODY_READ_TIMEOUT));
    session.set_write_timeout(Some(WRITE_TIMEOUT));
}

/// What a request to one of the proxy's own endpoints may not bring, with the method it serves
/// (any other method gets its 405 first, whatever it carries): more body than they accept (413;
/// a declared length decides without reading, a chunked body is read up to the limit), or a body
/// that is not all there within `limits.header_timeout` (408, and the connection is closed: what
/// is left of the body would be read as the next request).
async fn own_body_refusal(session: &mut Session, endpoint: Endpoint, deadline: Duration) -> Result<Option<Answer>> {
    let method = &session.req_header().method;
    let served = match endpoint {
        Endpoint::Enter => method == http::Method::POST,
        Endpoint::Status | Endpoint::Page | Endpoint::Event | Endpoint::EventDraw => method == http::Method::GET,
        Endpoint::Protected | Endpoint::Passthrough => false,
    };
    if !served {
        return Ok(None);
    }
    let too_large = || Ok(Some(Answer::error(413, "request body too large")));
    // The length the connection loop read from the head, not a second reading of it.
    if let Some(Body::Length(len)) = crate::connection::declared_body(session) {
        if len as u64 > OWN_BODY_LIMIT {
            return too_large();
        }
    }
    // Reading a small body (rather than leaving it) keeps the connection reusable.
    let read_all = async {
        let mut read = 0u64;
        while let Some(chunk) = session.read_request_body().await? {
            read += chunk.len() as u64;
            if read > OWN_BODY_LIMIT {
                return Ok(true);
            }
        }
        Ok::<bool, Box<Error>>(false)
    };
    let stalled = match tokio::time::timeout(deadline, read_all).await {
        Ok(Ok(true)) => return too_large(),
        Ok(Ok(false)) => false,
        // pingora's own timer on each read (BODY_READ_TIMEOUT) may be the shorter one.
        Ok(Err(e)) if matches!(e.etype(), ErrorType::ReadTimedout) => true,
        Ok(Err(e)) => return Err(e),
        Err(_elapsed) => true,
    };
    if stalled {
        session.set_keepalive(None);
        return Ok(Some(Answer::error(408, "the request body did not arrive in time")));
    }
    Ok(None)
}

/// Whether `e` is the upstream not answering within `limits.upstream_timeout` (a connect that
/// times out is an unreachable upstream: 502).
fn upstream_timed_out(e: &Error) -> bool {
    matches!(e.esource(), ErrorSource::Upstream) && matches!(e.etype(), ErrorType::ReadTimedout | ErrorType::WriteTimedout)
}

/// A value in the head of an answer of ours.
enum Field {
    Text(&'static str),
    Number(u64),
}

/// The head of an answer of the proxy's own, in order: JSON, never cached. pingora adds `Date`
/// and `Connection` as it writes it; [`early`] writes the same bytes itself.
fn answer_fields(answer: &Answer) -> impl Iterator<Item = (&'static str, Field)> {
    [
        ("Content-Type", Some(Field::Text("application/json"))),
        ("Cache-Control", Some(Field::Text("no-store"))),
        ("Content-Length", Some(Field::Number(answer.body.len() as u64))),
        ("Allow", answer.allow.map(Field::Text)),
        ("Retry-After", answer.retry_after.map(Field::Number)),
    ]
    .into_iter()
    .filter_map(|(name, value)| Some((name, value?)))
}

/// What a client is told of an order that reached the upstream with no status line back, and of
/// what that did to its token.
fn unknown_outcome(code: u16, fate: TokenFate) -> String {
    let why = if code == 504 { "the upstream did not answer in time" } else { "the upstream's connection failed" };
    let token = match fate {
        TokenFate::Consume => "the entry token is spent",
        TokenFate::Keep => "the entry token may be used again",
    };
    format!("the order's outcome is unknown: {why}; {token}")
}

/// Writes an answer of the proxy's own.
async fn write_answer(session: &mut Session, answer: Answer) -> Result<()> {
    let mut header = ResponseHeader::build(answer.status, Some(5))?;
    for (name, value) in answer_fields(&answer) {
        match value {
            Field::Text(text) => header.insert_header(name, text)?,
            Field::Number(number) => header.insert_header(name, number)?,
        };
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

    /// None: pingora's default installs a response compression module with compression off on
    /// every request, which costs each forward its setup and a call per phase and changes no
    /// byte (the upstream's answer passes through unchanged, section 3).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    fn new_ctx(&self) -> Ctx {
        Ctx {
            endpoint: Endpoint::Passthrough,
            started: Instant::now(),
            user: None,
            claimed: None,
            upstream_started: None,
            sent: false,
            upstream_status: None,
            room: None,
            _in_flight: self.process.request_started(),
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let routed = route::route(self.process.rooms(), session.req_header());
        if let Some(room) = &routed.room {
            room.activity().request();
        }
        // An Arc, not a Guard: this request's snapshot waits with it on Redis and the body. A
        // request no room claims is served under the proxy's own settings.
        let settings = match &routed.room {
            Some(room) => room.snapshot(),
            None => self.process.settings_now(),
        };
        let config = &settings.config;
        limit_slow_clients(session);
        shield_room_headers(config, session)?;
        ctx.endpoint = match routed.found {
            Ok((endpoint, None)) => endpoint,
            Ok((endpoint, Some(canonical))) => {
                session.req_header_mut().set_raw_path(&canonical)?;
                endpoint
            }
            Err(refusal) => {
                tracing::debug!(reason = refusal.message(), "request target refused");
                write_answer(session, Answer::error(refusal.status(), refusal.message())).await?;
                return Ok(true);
            }
        };
        // The later phases count the request in its room, and for a protected one settle its
        // claim, listen to the origin and record the latency there.
        ctx.room = routed.room;
        let headers = &session.req_header().headers;
        let switch = headers.get(http::header::UPGRADE);
        let drop_switch = switch.is_some_and(|upgrade| drops_switch(ctx.endpoint, upgrade, headers));
        if drop_switch {
            let request = session.req_header_mut();
            request.remove_header(&http::header::UPGRADE);
            request.remove_header(HTTP2_SETTINGS);
        }
        let delimited = crate::connection::forwarding(session, drop_switch);
        if delimited.is_some_and(|d| d != Delimited::Yes) {
            // No answer may promise that the next request will be read: the connection cannot
            // tell where it starts.
            session.set_keepalive(None);
        }
        if let Some(refusal) = own_body_refusal(session, ctx.endpoint, config.limits.header_timeout).await? {
            write_answer(session, refusal).await?;
            return Ok(true);
        }
        let header = session.req_header();
        let Some(room) = ctx.room.clone() else {
            // A pass-through. The bypass secret is the proxy's, whatever the path: an upstream's
            // access log or a third-party service behind a pass-through path has no business
            // with it.
            if let Some(rule) = &config.bypass.header {
                if header.headers.contains_key(&rule.name) {
                    session.req_header_mut().remove_header(&rule.name);
                }
            }
            return Ok(false);
        };
        let answer = match ctx.endpoint {
            Endpoint::Passthrough => return Ok(false),
            Endpoint::Page => {
                let accept_language = header.headers.get(http::header::ACCEPT_LANGUAGE);
                let page = crate::page::render(crate::page::PageSettings::of(config), accept_language.map(|v| v.as_bytes()));
                write_page(session, page).await?;
                return Ok(true);
            }
            Endpoint::Event => event::public(&room, &settings, &header.method).await,
            Endpoint::EventDraw => event::draw(&room, &settings, &header.method).await,
            Endpoint::Enter => match caller(config, session, ctx, http::Method::POST, "POST") {
                Ok(user) => enter::handle(&room, &settings, &sender::Sender::of(config, session), user).await,
                Err(refusal) => refusal,
            },
            Endpoint::Status => match caller(config, session, ctx, http::Method::GET, "GET") {
                Ok(user) => {
                    // A held poll keeps no snapshot (see status::answer).
                    drop(settings);
                    match status::answer(&room, session, user).await {
                        Some(answer) => answer,
                        // Held, and the client went away: nobody to answer.
                        None => {
                            return Err(Error::explain(ErrorType::ConnectionClosed, "the client left a held poll").into_down())
                        }
                    }
                }
                Err(refusal) => refusal,
            },
            Endpoint::Protected => {
                if config.bypass.is_set() && self.bypasses(config, session, ctx) {
                    room.metrics().requests.protected.with("bypassed", |count| count.inc());
                    return Ok(false);
                }
                let refusal = if delimited == Some(Delimited::Not) {
                    // What follows a body the connection cannot delimit could reach pingora as
                    // more body or as an error after the order was sent, and the order's
                    // outcome would be lost: refused before the claim, not released after it.
                    let why = "the request's body framing is ambiguous: one Content-Length, or Transfer-Encoding: chunked alone";
                    Some(("forbidden", Answer::error(400, why)))
                } else {
                    protected::check(&room, config, session, ctx).await
                };
                match refusal {
                    None => {
                        // Claimed: the upstream's answer settles the token, so it must be heard.
                        crate::connection::hold_client(session);
                        return Ok(false);
                    }
                    // A rehearsal: the room has done all it would, and the request goes on.
                    Some((would, _)) if config.mode == RoomMode::Shadow => {
                        room.metrics().shadow_passed.with(would, |count| count.inc());
                        return Ok(false);
                    }
                    Some((result, answer)) => {
                        room.metrics().requests.protected.with(result, |count| count.inc());
                        answer
                    }
                }
            }
        };
        write_answer(session, answer).await?;
        Ok(true)
    }

    /// What pingora's own error lines say about a request: pingora's summary without the query
    /// string, so a token a client put in a URL (waitroom never does) stays out of the logs.
    fn request_summary(&self, session: &Session, _ctx: &Ctx) -> String {
        let header = session.req_header();
        let host = header.headers.get(http::header::HOST).map(|h| String::from_utf8_lossy(h.as_bytes()));
        format!("{} {}, Host: {}", header.method, header.uri.path(), host.as_deref().unwrap_or("-"))
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        ctx.upstream_started = Some(Instant::now());
        let mut peer = self.peer_for(ctx)?;
        // Without these pingora waits for a silent upstream forever (it sets only a connect
        // timeout). They bound each read and write, so a response that has started may take
        // longer in total as long as it keeps coming. Read per request: reloadable.
        let timeout = self.process.settings().config.limits.upstream_timeout;
        peer.options.read_timeout = Some(timeout);
        peer.options.write_timeout = Some(timeout);
        Ok(peer)
    }

    /// Runs after pingora has removed the hop-by-hop headers: what is set here reaches the
    /// upstream whatever the client's `Connection` said.
    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if ctx.endpoint != Endpoint::Protected {
            return Ok(());
        }
        ctx.sent = true;
        if let IdentityConfig::Jwt(verifier) = &self.process.settings().config.identity {
            match &ctx.user {
                // The verified identity replaces whatever the client sent under that name, so
                // the upstream can credit the order to the user the room admitted.
                Some(user) => upstream_request.insert_header(verifier.forward_header.clone(), user.as_str())?,
                // Forwarded with no verified user (a rehearsal's refusal, a bypass without a
                // JWT): the upstream trusts this header, so a client's own copy never reaches it.
                None => {
                    upstream_request.remove_header(&verifier.forward_header);
                }
            }
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let (Endpoint::Protected, Some(room)) = (ctx.endpoint, ctx.room.as_deref()) {
            crate::services::control::from_origin(room, upstream_response, ctx.user.as_deref()).await;
        } else {
            // Obeyed only on protected responses, and never shown to a client. Looked up by a
            // prebuilt name first: pingora's removal by text costs every response about 350
            // instructions, nearly all of it reading the name, even when the header is absent.
            if upstream_response.headers.contains_key(&ORIGIN_NAME) {
                upstream_response.remove_header(&ORIGIN_NAME);
            }
        }
        let status = upstream_response.status.as_u16();
        if status < 200 {
            // Informational (100 Continue): the real answer is still to come.
            return Ok(());
        }
        ctx.upstream_status = Some(status);
        if let Some(started) = ctx.upstream_started {
            let latency = started.elapsed();
            request_metrics(ctx)
                .upstream_duration
                .with(ctx.endpoint.label(), |duration| duration.observe(latency.as_secs_f64()));
            // What the adaptive controller listens to (see crate::admission).
            if let (Endpoint::Protected, Some(room)) = (ctx.endpoint, &ctx.room) {
                room.record_latency(latency);
            }
        }
        if let (Some(claimed), Some(user), Some(room)) = (ctx.claimed.take(), ctx.user.as_deref(), ctx.room.as_deref()) {
            let lifetimes = room.settings().config.token.clone();
            protected::settle(room, user, claimed, Outcome::Answered(status), &lifetimes).await;
        }
        Ok(())
    }

    /// A protected request is never sent twice: pingora retries a request whose reused upstream
    /// connection failed, and an order that reached the upstream before it failed may have been
    /// placed.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Ctx,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        if ctx.endpoint == Endpoint::Protected
            || !session.req_header().method.is_idempotent()
            || session.as_ref().retry_buffer_truncated()
        {
            e.set_retry(false);
        } else {
            e.retry.decide_reuse(client_reused);
        }
        e
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy
    where
        Ctx: Send + Sync,
    {
        let timed_out = upstream_timed_out(e);
        if timed_out && ctx.endpoint == Endpoint::Protected && ctx.upstream_status.is_none() {
            // The adaptive controller must hear of an upstream too slow to answer at all: the
            // wait, at least upstream_timeout, is its slowest sample. (A body that stalls after
            // the response header was already counted when the header came.)
            if let (Some(started), Some(room)) = (ctx.upstream_started, &ctx.room) {
                room.record_latency(started.elapsed());
            }
        }
        // Settled before the error answer leaves, so the user's immediate retry is not a 409.
        let unknown = match self.settle_unanswered(ctx, Some(e)).await {
            Some((Outcome::Unknown, fate)) => Some(fate),
            _ => None,
        };
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            _ if timed_out => 504,
            _ => match e.esource() {
                ErrorSource::Upstream => 502,
                ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    // A request body that stopped arriving (BODY_READ_TIMEOUT per read).
                    ErrorType::ReadTimedout => 408,
                    _ => 400,
                },
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        // Only a response not yet started can be replaced by ours.
        if code > 0 && session.response_written().is_none() {
            let answer = match code {
                502 | 504 if let Some(fate) = unknown => Answer::error(code, &unknown_outcome(code, fate)),
                502 => Answer::error(502, "the upstream could not be reached"),
                504 => Answer::error(504, "the upstream did not answer in time"),
                408 => Answer::error(408, "the request body did not arrive in time"),
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
        self.settle_unanswered(ctx, error).await;
        let elapsed = ctx.started.elapsed();
        let endpoint = ctx.endpoint.label();
        request_metrics(ctx).request_duration.with(endpoint, |duration| duration.observe(elapsed.as_secs_f64()));
        // A request that went upstream has an upstream outcome: a status class, or "error".
        if ctx.upstream_started.is_some() {
            request_metrics(ctx).upstream_responses.with(rules::status_class(ctx.upstream_status), |count| count.inc());
        }
        let status = session.response_written().map(|r| r.status.as_u16()).unwrap_or(0);
        let header = session.req_header();
        logging::access(&logging::Access {
            method: header.method.as_str(),
            path: header.uri.path(),
            status,
            endpoint,
            duration: elapsed,
            user: ctx.user.as_deref().unwrap_or("-"),
            error: error.map(|e| e.to_string()),
        });
    }
}
