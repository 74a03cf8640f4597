//! `GET {prefix}/status`: where a user stands, and when to ask again.
//! Parse (method, identity) -> apply (one script in Redis) -> render (the answer).

use pingora::proxy::Session;

use super::{identity, poll_clock, Answer, Ctx};
use crate::config::Config;
use crate::metrics;
use crate::store::{Room, StatusOutcome};

pub async fn handle(config: &Config, room: &Room, session: &Session, ctx: &mut Ctx) -> Answer {
    if session.req_header().method != http::Method::GET {
        return Answer::method_not_allowed("GET");
    }
    let user = match identity(config, session) {
        Ok(user) => ctx.user.insert(user),
        Err(problem) => return Answer::identity(problem),
    };
    let (label, answer) = match room.status(user, poll_clock(config)).await {
        Ok(StatusOutcome::Waiting { position }) => ("WAITING", Answer::waiting(position, config)),
        Ok(StatusOutcome::Ready { token, remaining_ms }) => {
            ("READY", Answer::ready(&token, remaining_ms))
        }
        Ok(StatusOutcome::NotInQueue) => ("NOT_IN_QUEUE", Answer::not_in_queue()),
        Ok(StatusOutcome::TooEarly { retry_secs }) => ("TOO_EARLY", Answer::too_early(retry_secs)),
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, "status: redis unavailable");
            ("error", Answer::unavailable(config))
        }
    };
    metrics::STATUS_TOTAL.with_label_values(&[label]).inc();
    answer
}
