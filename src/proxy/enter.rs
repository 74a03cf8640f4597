//! `POST {prefix}/enter`: join the line, or learn where you already stand.
//! Parse (method, identity: done by the proxy's `caller`, or by the connection loop for the calls
//! it answers itself, see [`super::early`]) -> apply (this proxy's view of the line for a user it
//! knows is waiting, else one script in Redis) -> render (the answer).

use super::sender::{client_address, Sender};
use super::Answer;
use crate::metrics;
use crate::policy::Settings;
use crate::room::Room;
use crate::store::{EnterOutcome, EnterRequest};

pub async fn handle(room: &Room, settings: &Settings, sender: &Sender<'_>, user: &str) -> Answer {
    if let Some(answer) = super::event::enter(room, settings, sender, user).await {
        return answer;
    }
    let (config, policy) = (&settings.config, &settings.policy);
    let address = (config.abuse.identities_per_address > 0).then(|| client_address(config, sender));
    let pacing = room.pacing(settings);
    // Entering again while waiting changes nothing (same place, no new number, no limit spent)
    // unless Redis must hear of it: then it is the status answer.
    // As for status: a closed room's line was emptied in Redis, whatever this proxy read of it
    // a moment before.
    let local = (policy.local_answers && room.mode() != crate::room::mode::Mode::Closed).then_some(room.line());
    if let Some(position) = local.and_then(|line| line.position(user)) {
        room.metrics().enter.with("already_waiting", |count| count.inc());
        return Answer::waiting(position, pacing.pace(), config, room.paused());
    }
    let request = EnterRequest {
        user,
        capacity: config.queue.capacity.get(),
        per_address: address.as_deref().map(|a| (a, config.abuse.identities_per_address)),
        poll: pacing.poll_clock(),
    };
    let ticket = room.line().ticket();
    let (result, answer) = match room.store().enter_grouped(request, &policy.rules).await {
        Ok(entered) => {
            room.metrics().abandoned.inc_by(entered.abandoned);
            if let Some(line) = local {
                let position = match entered.outcome {
                    EnterOutcome::Waiting { position, .. } => Some(position),
                    _ => None,
                };
                line.learn_arrival(user, entered.arrival.as_ref(), position, ticket);
            }
            match entered.outcome {
                EnterOutcome::Waiting { position, already } => (
                    if already { "already_waiting" } else { "queued" },
                    Answer::waiting(position, pacing.pace(), config, room.paused()),
                ),
                EnterOutcome::Ready { token, remaining_ms } => {
                    ("ready", Answer::ready(&token, remaining_ms))
                }
                EnterOutcome::Instant { token, remaining_ms } => {
                    room.metrics().admitted.inc();
                    ("instant", Answer::ready(&token, remaining_ms))
                }
                EnterOutcome::Full => ("full", Answer::full(config)),
                EnterOutcome::Limited { retry_secs } => ("limited", Answer::limited(retry_secs)),
                EnterOutcome::Closed => ("closed", Answer::closed()),
            }
        }
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            if let Some(held_back) = crate::logging::Warning::EnterFailed.pass() {
                tracing::warn!(%error, also_failed = held_back, "enter: redis unavailable");
            }
            ("error", Answer::unavailable(config))
        }
    };
    room.metrics().enter.with(result, |count| count.inc());
    answer
}
