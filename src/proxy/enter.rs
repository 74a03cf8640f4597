//! `POST {prefix}/enter`: join the line, or learn where you already stand.
//! Parse (method, identity) -> apply (one script in Redis) -> render (the answer).

use pingora::proxy::Session;

use super::{identity, poll_clock, Answer, Ctx};
use crate::config::Config;
use crate::metrics;
use crate::rules;
use crate::store::{EnterOutcome, EnterRequest, Room};

pub async fn handle(config: &Config, room: &Room, session: &Session, ctx: &mut Ctx) -> Answer {
    if session.req_header().method != http::Method::POST {
        return Answer::method_not_allowed("POST");
    }
    let user = match identity(config, session) {
        Ok(user) => ctx.user.insert(user),
        Err(problem) => return Answer::identity(problem),
    };
    let address = (config.abuse.identities_per_address > 0).then(|| client_address(config, session));
    let request = EnterRequest {
        user,
        capacity: config.queue.capacity.get(),
        per_address: address.as_deref().map(|a| (a, config.abuse.identities_per_address)),
        poll: poll_clock(config),
    };
    let (result, answer) = match room.enter(request).await {
        Ok(EnterOutcome::Waiting { position, already }) => (
            if already { "already_waiting" } else { "queued" },
            Answer::waiting(position, config),
        ),
        Ok(EnterOutcome::Ready { token, remaining_ms }) => {
            ("ready", Answer::ready(&token, remaining_ms))
        }
        Ok(EnterOutcome::Full) => ("full", Answer::full(config)),
        Ok(EnterOutcome::Limited { retry_secs }) => ("limited", Answer::limited(retry_secs)),
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, "enter: redis unavailable");
            ("error", Answer::unavailable(config))
        }
    };
    metrics::ENTER_TOTAL.with_label_values(&[result]).inc();
    answer
}

/// The address the per-address identity limit counts (see [`rules::client_address`]).
fn client_address(config: &Config, session: &Session) -> String {
    let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip());
    let Some(peer) = peer else { return "unknown".to_string() };
    let forwarded = session
        .req_header()
        .headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok());
    rules::client_address(peer, forwarded, &config.abuse.trusted_proxies).to_string()
}
