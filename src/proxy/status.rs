//! `GET {prefix}/status`: where a user stands, and when to ask again.
//! Parse (method, identity: done by the proxy's `caller`, or by the connection loop for the calls
//! it answers itself, see [`super::early`]) -> apply (this proxy's view of the line, else Redis;
//! near the front, held open until the user is admitted, contract section 13) -> render.

use std::future::Future;
use std::time::Duration;

use pingora::prelude::*;
use pingora::proxy::Session;

use super::Answer;
use crate::services::control::{self, Mode};
use crate::metrics;
use crate::room::line::LocalLine;
use crate::room::Room;
use crate::policy::Settings;
use crate::rules::{self, Pace};
use crate::store::StatusOutcome;

/// A held poll with abandonment on asks Redis at least this often, so that holding counts as
/// hearing from the user for the hold's whole length.
const TOUCH_PER_ABANDON: u32 = 3;

/// The answer to a status call, before it is counted.
struct Reply {
    /// The `waitroom_status_total` label; `None` when the event's answer has counted itself.
    label: Option<&'static str>,
    answer: Answer,
    /// Where a waiting user stands: the position, and the score their place has in the line
    /// (what a held poll waits for the front to pass), when the answer learned it.
    waiting: Option<(u64, Option<f64>)>,
    /// A READY answer's token time left.
    ready_ms: Option<u64>,
}

impl Reply {
    fn new(label: &'static str, answer: Answer) -> Reply {
        Reply { label: Some(label), answer, waiting: None, ready_ms: None }
    }

    fn count(self, room: &Room) -> Answer {
        if let Some(label) = self.label {
            room.metrics().status.with(label, |count| count.inc());
        }
        self.answer
    }
}

/// What a held poll watches of its client.
pub enum Watched {
    /// The client's side of the connection ended or failed: nobody to answer.
    Left,
    /// The client sent something before its answer (a pipelined request, a timer of pingora's):
    /// no end of the hold, and its end is still watched for by the deadline.
    Spoke,
}

/// The client of a status call, watched while its poll is held: pingora's session, or the
/// connection itself when the connection loop answers (see [`super::early`]).
pub trait Client: Send {
    fn watch(&mut self) -> impl Future<Output = Watched> + Send;
}

impl Client for Session {
    async fn watch(&mut self) -> Watched {
        match self.read_body_or_idle(true).await {
            Err(e) if matches!(e.etype(), ErrorType::ConnectionClosed | ErrorType::ReadError) => Watched::Left,
            _ => Watched::Spoke,
        }
    }
}

/// Answers a status call; `None` when the client went away while its poll was held. A held poll
/// keeps no snapshot of the settings while it waits: one held up to `endpoints.hold` would keep a
/// configuration a reload replaced, and each reading after a wake takes the running one.
pub async fn answer(room: &Room, client: &mut impl Client, user: &str) -> Option<Answer> {
    let snapshot = room.snapshot();
    let settings = &*snapshot;
    let now = read_small(room, settings, user, false).await;
    let pace = room.pacing(settings).pace();
    let (position, score) = match to_hold(&now, room, settings) {
        None => return Some(now.count(room)),
        Some((position, Some(score))) => (position, score),
        // Within the hold, with no score to hold for (a reading without one): answered now,
        // and, for a user whose poll is held on another connection, not with `pollAfter: 0`,
        // or that client would ask in a loop.
        Some((position, None)) if room.held().holds(user) => {
            return Some(Reply { answer: Answer::waiting_unheld(position, pace, &settings.config, room.paused()), ..now }.count(room));
        }
        Some(_) => return Some(now.count(room)),
    };
    let limit = usize::try_from(settings.config.queue.capacity.get()).unwrap_or(usize::MAX);
    let Some(mut hold) = room.held().hold(user, score, limit) else {
        if room.held().stopping() {
            return Some(now.count(room));
        }
        // Held polls at their limit, or this user's poll held already on another connection:
        // told to come back later (the tier's pollAfter, at least 1), not at once, or a client
        // that keeps a poll held would be answered in a loop.
        return Some(Reply { answer: Answer::waiting_unheld(position, pace, &settings.config, room.paused()), ..now }.count(room));
    };
    // Its rendered answer is not sent: its body would be held for the hold's whole length.
    drop(now);
    let deadline = tokio::time::Instant::now() + settings.config.endpoints.hold;
    let abandon = settings.config.queue.abandon_after;
    let touch = (!abandon.is_zero()).then(|| abandon / TOUCH_PER_ABANDON);
    let mut watch_client = true;
    // From here each reading takes the settings running when it is made.
    drop(snapshot);
    let read_now = || async { read_small(room, &room.snapshot(), user, true).await };
    let reading = loop {
        // One timer for the hold's end and the next touch: a held poll waits with this future
        // inside its own, and a timer is over a hundred bytes of it.
        let touch_at = touch.map(|touch| tokio::time::Instant::now() + touch);
        let wake = tokio::select! {
            _ = hold.woken() => Wake::Front,
            _ = tokio::time::sleep_until(touch_at.map_or(deadline, |at| at.min(deadline))) => {
                if tokio::time::Instant::now() >= deadline { Wake::Over } else { Wake::Front }
            }
            watched = client.watch(), if watch_client => Wake::Client(watched),
        };
        match wake {
            Wake::Over => break read_now().await,
            Wake::Client(Watched::Left) => {
                tracing::debug!("status: the client went away while its poll was held");
                return None;
            }
            Wake::Client(Watched::Spoke) => watch_client = false,
            Wake::Front if room.held().stopping() => break read_now().await,
            Wake::Front => {
                let exact = read_now().await;
                match exact.waiting {
                    // Still waiting (woken for the whole room, or entered again behind a place
                    // that was removed): hold on, for the score the place has now.
                    Some((_, score)) => hold.rearm(score.unwrap_or(0.0)),
                    None => break exact,
                }
            }
        }
    };
    drop(hold);
    if let Some(remaining_ms) = reading.ready_ms {
        let issued_ago = room.settings().config.token.ttl.saturating_sub(Duration::from_millis(remaining_ms));
        room.metrics().held_ready_delay.observe(issued_ago.as_secs_f64());
    }
    Some(reading.count(room))
}

/// The place and score a WAITING answer's poll would be held for (contract section 13), if it
/// is one to hold.
fn to_hold(now: &Reply, room: &Room, settings: &Settings) -> Option<(u64, Option<f64>)> {
    let pace = room.pacing(settings).pace();
    match now.waiting {
        Some((position, score)) if rules::within_hold(rules::wait_secs(position, pace), settings.policy.hold_secs) => {
            Some((position, score))
        }
        _ => None,
    }
}

enum Wake {
    /// The line's front passed the user's place, or every held poll was woken.
    Front,
    /// `endpoints.hold` has passed.
    Over,
    Client(Watched),
}

/// [`read`], with what needs Redis on the heap: a held poll waits with this future inside its own,
/// and a Redis call's state would be most of a held poll's memory.
async fn read_small(room: &Room, settings: &Settings, user: &str, after_hold: bool) -> Reply {
    if super::event::leaves_status_to_the_line(room, settings) {
        if let Some(reading) = read_local(room, settings, user, after_hold) {
            return reading;
        }
    }
    Box::pin(read(room, settings, user, after_hold)).await
}

/// Where the user stands now: from this proxy's view of the line when it can tell, else from
/// Redis. `after_hold`: the answer ends a held poll (or re-checks one), so a WAITING answer
/// says "ask again at once", and enforced polling's clock agrees.
async fn read(room: &Room, settings: &Settings, user: &str, after_hold: bool) -> Reply {
    if let Some(answer) = super::event::status(room, settings, user).await {
        return Reply { label: None, answer, waiting: None, ready_ms: None };
    }
    if let Some(reading) = read_local(room, settings, user, after_hold) {
        return reading;
    }
    let (config, policy) = (&settings.config, &settings.policy);
    let pacing = room.pacing(settings);
    let local = local_line(room, settings);
    let ticket = room.line().ticket();
    let clock = if after_hold { pacing.poll_clock_at_once() } else { pacing.poll_clock() };
    match room.store().status(user, clock, &policy.rules).await {
        Ok(status) => {
            room.metrics().abandoned.inc_by(status.abandoned);
            if let Some(line) = local {
                match &status.outcome {
                    StatusOutcome::Waiting { position } => {
                        line.learn_arrival(user, status.arrival.as_ref(), Some(*position), ticket)
                    }
                    StatusOutcome::Ready { .. } => line.learn_admitted(user, ticket),
                    _ => {}
                }
            }
            match status.outcome {
                StatusOutcome::Waiting { position } => waiting(room, settings, pacing.pace(), position, status.score, after_hold),
                StatusOutcome::Ready { token, remaining_ms } => Reply {
                    ready_ms: Some(remaining_ms),
                    ..Reply::new("READY", Answer::ready(&token, remaining_ms))
                },
                StatusOutcome::NotInQueue if control::closed_now(room).await => {
                    Reply::new("CLOSED", Answer::closed())
                }
                StatusOutcome::NotInQueue => Reply::new("NOT_IN_QUEUE", Answer::not_in_queue()),
                StatusOutcome::TooEarly { retry_secs } => Reply::new("TOO_EARLY", Answer::too_early(retry_secs)),
            }
        }
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            if let Some(held_back) = crate::logging::Warning::StatusFailed.pass() {
                tracing::warn!(%error, also_failed = held_back, "status: redis unavailable");
            }
            Reply::new("error", Answer::unavailable(config))
        }
    }
}

/// This proxy's view of the line, when it may answer from it. A closed room's line is empty: only
/// Redis can tell its READY users from the rest.
fn local_line<'s>(room: &'s Room, settings: &Settings) -> Option<&'s LocalLine> {
    (settings.policy.local_answers && room.mode() != Mode::Closed).then_some(room.line())
}

/// Where the user stands by this proxy's view of the line, if it knows.
fn read_local(room: &Room, settings: &Settings, user: &str, after_hold: bool) -> Option<Reply> {
    let (position, number) = local_line(room, settings)?.place(user)?;
    Some(waiting(room, settings, room.pacing(settings).pace(), position, Some(number as f64), after_hold))
}

fn waiting(room: &Room, settings: &Settings, pace: Pace, position: u64, score: Option<f64>, after_hold: bool) -> Reply {
    Reply {
        label: Some("WAITING"),
        answer: match after_hold {
            true => Answer::waiting_after_hold(position, pace, room.paused()),
            false => Answer::waiting(position, pace, &settings.config, room.paused()),
        },
        waiting: Some((position, score)),
        ready_ms: None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::store::Redis;

    /// A client that never speaks: only the held poll's own state is measured.
    struct Silent;

    impl Client for Silent {
        async fn watch(&mut self) -> Watched {
            std::future::pending().await
        }
    }

    /// A held poll waits inside this future (boxed by the connection loop's early answers) for
    /// as long as it is held: one timer for the hold's end and its touches, its Redis readings
    /// boxed, nothing of the first reading's answer. The bound is today's size in a debug build.
    #[test]
    fn a_held_polls_state_stays_small() {
        let config = Config::parse("upstream: 127.0.0.1:1").unwrap();
        let redis = Redis::new(&config.redis).unwrap();
        let room = Room::new("r", None, Arc::new(Settings::new(config)), redis.room(redis.default_keys()));
        let mut client = Silent;
        let held = answer(&room, &mut client, "u1");
        let size = std::mem::size_of_val(&held);
        assert!(size <= 544, "a held poll's state is {size} bytes");
    }
}
