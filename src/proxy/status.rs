//! `GET {prefix}/status`: where a user stands, and when to ask again.
//! Parse (method, identity: done for both endpoints by the proxy's `caller`) -> apply (this proxy's view of the line, else Redis) -> render.

use super::Answer;
use crate::control::{self, Mode};
use crate::metrics;
use crate::policy::Settings;
use crate::state::RoomState;
use crate::store::{Room, StatusOutcome};

pub async fn handle(
    state: &RoomState,
    settings: &Settings,
    room: &Room,
    user: &str,
) -> Answer {
    if let Some(answer) = super::event::status(state, settings, room, user).await {
        return answer;
    }
    let (config, policy) = (&settings.config, &settings.policy);
    let pacing = state.pacing(settings);
    // A closed room's line is empty: only Redis can tell its READY users from the rest.
    let local = (policy.local_answers && state.mode() != Mode::Closed).then_some(state.line());
    if let Some(position) = local.and_then(|line| line.position(user)) {
        metrics::STATUS_TOTAL.with_label_values(&["WAITING"]).inc();
        return Answer::waiting(position, pacing.pace(), config);
    }
    let ticket = state.line().ticket();
    let (label, answer) = match room.status(user, pacing.poll_clock(), &policy.rules).await {
        Ok(status) => {
            metrics::ABANDONED_TOTAL.inc_by(status.abandoned);
            if let Some(line) = local {
                line.learn_arrival(user, status.arrival.as_ref(), ticket);
            }
            match status.outcome {
                StatusOutcome::Waiting { position } => {
                    ("WAITING", Answer::waiting(position, pacing.pace(), config))
                }
                StatusOutcome::Ready { token, remaining_ms } => {
                    ("READY", Answer::ready(&token, remaining_ms))
                }
                StatusOutcome::NotInQueue if control::closed_now(state, room).await => ("CLOSED", Answer::closed()),
                StatusOutcome::NotInQueue => ("NOT_IN_QUEUE", Answer::not_in_queue()),
                StatusOutcome::TooEarly { retry_secs } => ("TOO_EARLY", Answer::too_early(retry_secs)),
            }
        }
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, "status: redis unavailable");
            ("error", Answer::unavailable(config))
        }
    };
    metrics::STATUS_TOTAL.with_label_values(&[label]).inc();
    answer
}
