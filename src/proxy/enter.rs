//! `POST {prefix}/enter`: join the line, or learn where you already stand.
//! Parse (method, identity) -> apply (one script in Redis) -> render (the answer).

use pingora::proxy::Session;

use super::{identity, Answer, Ctx};
use crate::config::Config;
use crate::metrics;
use crate::store::{EnterOutcome, Room};

pub async fn handle(config: &Config, room: &Room, session: &Session, ctx: &mut Ctx) -> Answer {
    if session.req_header().method != http::Method::POST {
        return Answer::method_not_allowed("POST");
    }
    let user = match identity(config, session) {
        Ok(user) => ctx.user.insert(user),
        Err(problem) => return Answer::identity(problem),
    };
    let (result, answer) = match room.enter(user, config.queue.capacity.get()).await {
        Ok(EnterOutcome::Waiting { position, already }) => (
            if already { "already_waiting" } else { "queued" },
            Answer::waiting(position, config),
        ),
        Ok(EnterOutcome::Ready { token, remaining_ms }) => {
            ("ready", Answer::ready(&token, remaining_ms, config))
        }
        Ok(EnterOutcome::Full) => ("full", Answer::full(config)),
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, "enter: redis unavailable");
            ("error", Answer::unavailable(config))
        }
    };
    metrics::ENTER_TOTAL.with_label_values(&[result]).inc();
    answer
}
