//! `POST {prefix}/enter`: join the line, or learn where you already stand.
//! Parse (method, identity) -> apply (this proxy's view of the line for a user it knows is
//! waiting, else one script in Redis) -> render (the answer).

use pingora::proxy::Session;

use super::{identity, Answer, Ctx};
use crate::admission::Pacing;
use crate::config::Config;
use crate::line::LocalLine;
use crate::metrics;
use crate::rules;
use crate::store::{EnterOutcome, EnterRequest, Room, RoomRules};

pub async fn handle(
    config: &Config,
    room: &Room,
    local: &LocalLine,
    session: &Session,
    ctx: &mut Ctx,
) -> Answer {
    if session.req_header().method != http::Method::POST {
        return Answer::method_not_allowed("POST");
    }
    let user = match identity(config, session) {
        Ok(user) => ctx.user.insert(user),
        Err(problem) => return Answer::identity(problem),
    };
    let address = (config.abuse.identities_per_address > 0).then(|| client_address(config, session));
    let pacing = Pacing::new(config);
    // Entering again while waiting changes nothing (same place, no new number, no limit spent)
    // unless Redis must hear of it: then it is the status answer.
    if let Some(position) = local.position_under(config, user) {
        metrics::ENTER_TOTAL.with_label_values(&["already_waiting"]).inc();
        return Answer::waiting(position, pacing.pace(), config);
    }
    let request = EnterRequest {
        user,
        capacity: config.queue.capacity.get(),
        per_address: address.as_deref().map(|a| (a, config.abuse.identities_per_address)),
        poll: pacing.poll_clock(config),
    };
    let (result, answer) = match room.enter(request, &RoomRules::from_config(config)).await {
        Ok(entered) => {
            metrics::ABANDONED_TOTAL.inc_by(entered.abandoned);
            local.learn_under(config, user, entered.arrival.as_ref());
            match entered.outcome {
                EnterOutcome::Waiting { position, already } => (
                    if already { "already_waiting" } else { "queued" },
                    Answer::waiting(position, pacing.pace(), config),
                ),
                EnterOutcome::Ready { token, remaining_ms } => {
                    ("ready", Answer::ready(&token, remaining_ms))
                }
                EnterOutcome::Instant { token, remaining_ms } => {
                    metrics::ADMITTED_TOTAL.inc();
                    ("instant", Answer::ready(&token, remaining_ms))
                }
                EnterOutcome::Full => ("full", Answer::full(config)),
                EnterOutcome::Limited { retry_secs } => ("limited", Answer::limited(retry_secs)),
            }
        }
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
