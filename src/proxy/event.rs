//! A scheduled event at the edge (contract section 14): what enter and status answer outside the
//! open phase, and the two public endpoints, `GET {prefix}/event` and `GET {prefix}/event/draw`.
//! The phase rules and the seed are in [`crate::event`]; the Redis side in `lua/event.lua`.

use serde::Serialize;

use super::Answer;
use crate::config::{format_time, EventConfig, Phase};
use crate::room::event::{self, Seed, Snapshot};
use crate::room::Room;
use crate::metrics;
use crate::policy::Settings;
use crate::store::{Entering, EventEnter, EventTimes, Standing, StoreError, DRAW_PAGE};

/// Enter while an event is configured: `None` when the event is open (enter the line as section 3
/// says), else the answer. Redis's clock decides, except far from every boundary.
pub async fn enter(
    room: &Room,
    settings: &Settings,
    sender: &super::sender::Sender<'_>,
    user: &str,
) -> Option<Answer> {
    let config = &settings.config;
    let event = config.event.as_ref()?;
    let events = room.event();
    if let Some(snapshot) = events.snapshot() {
        if snapshot.settled(event) && snapshot.phase(event) == Phase::Open {
            return None;
        }
    }
    let limit = config.abuse.identities_per_address;
    let address = (limit > 0).then(|| super::sender::client_address(config, sender));
    let entering = Entering {
        user,
        capacity: config.queue.capacity.get(),
        per_address: address.as_deref().map(|a| (a, limit)),
    };
    let (label, answer) = match prequeue_enter(room, event, &entering).await {
        Ok(EventEnter::Open) => return None,
        Ok(EventEnter::NotOpen { opens_in_ms }) => {
            ("not_open", Answer::not_open(event::opens_in_secs(opens_in_ms), config))
        }
        Ok(EventEnter::Prequeued { opens_in_ms, already }) => (
            if already { "already_waiting" } else { "prequeued" },
            Answer::prequeued(event::opens_in_secs(opens_in_ms), config),
        ),
        Ok(EventEnter::Full) => ("full", Answer::full(config)),
        Ok(EventEnter::Limited { retry_secs }) => ("limited", Answer::limited(retry_secs)),
        Ok(EventEnter::Closed) => ("closed", Answer::closed()),
        Ok(EventEnter::Ready { token, remaining_ms }) => ("ready", Answer::ready(&token, remaining_ms)),
        // Twice another seed: the room's seed is being replaced under us (by hand); no place.
        Ok(EventEnter::OtherSeed(_)) | Err(_) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!("enter: the event could not be read");
            ("error", Answer::unavailable(config))
        }
    };
    room.metrics().enter.with(label, |count| count.inc());
    Some(answer)
}

/// The event script's enter, with the seed this proxy knows (a fresh candidate if it knows none:
/// the script keeps it only if the room has no seed yet), retried once with the room's own.
async fn prequeue_enter(
    room: &Room,
    event: &EventConfig,
    entering: &Entering<'_>,
) -> Result<EventEnter, StoreError> {
    let mut seed = room.event().snapshot().and_then(|s| s.seed.clone()).unwrap_or_else(Seed::fresh);
    let mut outcome = enter_with(room, event, entering, &seed).await?;
    if let EventEnter::OtherSeed(bytes) = outcome {
        seed = Seed::from_bytes(bytes);
        room.event().learn_seed(seed.clone());
        outcome = enter_with(room, event, entering, &seed).await?;
    }
    Ok(outcome)
}

/// One call of the event script's enter, the user's place drawn with `seed`.
async fn enter_with(room: &Room, event: &EventConfig, entering: &Entering<'_>, seed: &Seed) -> Result<EventEnter, StoreError> {
    room.store().event_enter(EventTimes::of(event), entering, seed.sent(), &seed.draw_key(entering.user)).await
}

/// Whether a status call is the line's to answer, as far as this proxy can tell without Redis:
/// no event, or one whose phase, as last read, leaves status to the line (not yet open, or
/// open). False when only Redis can tell.
pub fn leaves_status_to_the_line(room: &Room, settings: &Settings) -> bool {
    let Some(event) = settings.config.event.as_ref() else { return true };
    room.event().snapshot().is_some_and(|snapshot| matches!(snapshot.phase(event), Phase::Before | Phase::Open))
}

/// Status while an event is configured: `None` when it is open or not yet in its pre-queue
/// (section 3's answers), else the pre-queue's or the close's answer. The phase is Redis's clock
/// as this proxy last read it (at most a quarter of a second old).
pub async fn status(room: &Room, settings: &Settings, user: &str) -> Option<Answer> {
    let config = &settings.config;
    let event = config.event.as_ref()?;
    let snapshot = match room.event().snapshot() {
        Some(snapshot) => snapshot,
        None => match room.event().current(room.store(), event).await {
            Ok(snapshot) => snapshot,
            Err(error) => return Some(unavailable(room, settings, "status", &error)),
        },
    };
    let now = snapshot.redis_now_ms();
    let phase = snapshot.phase(event);
    if matches!(phase, Phase::Before | Phase::Open) {
        return None;
    }
    let (label, answer) = match (phase, room.store().standing(user).await) {
        (_, Err(error)) => return Some(unavailable(room, settings, "status", &error)),
        (_, Ok(Standing::Ready { token, remaining_ms })) => ("READY", Answer::ready(&token, remaining_ms)),
        (Phase::Prequeue, Ok(Standing::Queued)) => {
            ("PREQUEUED", Answer::prequeued(event::opens_in_secs(event.opens_ms() - now).max(1), config))
        }
        (Phase::Prequeue, Ok(Standing::Neither)) => ("NOT_IN_QUEUE", Answer::not_in_queue()),
        // The close ended the line: whoever is not holding a token is told so.
        (_, Ok(_)) => ("CLOSED", Answer::closed()),
    };
    room.metrics().status.with(label, |count| count.inc());
    Some(answer)
}

fn unavailable(room: &Room, settings: &Settings, endpoint: &str, error: &StoreError) -> Answer {
    metrics::REDIS_ERRORS_TOTAL.inc();
    if let Some(held_back) = crate::logging::Warning::EventFailed.pass() {
        tracing::warn!(%error, endpoint, also_failed = held_back, "event: redis unavailable");
    }
    if endpoint == "status" {
        room.metrics().status.with("error", |count| count.inc());
    }
    Answer::unavailable(&settings.config)
}

/// `GET {prefix}/event`'s body: the key order of the contract; `seed` and `drawn` only after the
/// draw.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EventBody {
    phase: &'static str,
    opens_at: String,
    closes_at: Option<String>,
    seed_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    drawn: Option<u64>,
}

/// The event as every user may see it.
pub async fn public(room: &Room, settings: &Settings, method: &http::Method) -> Answer {
    let (event, snapshot) = match public_snapshot(room, settings, method).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let phase = snapshot.phase(event);
    let drawn = drawn(phase, &snapshot);
    let seed = snapshot.seed.as_ref().filter(|_| phase != Phase::Before);
    let body = EventBody {
        phase: phase.label(),
        opens_at: format_time(event.opens_at),
        closes_at: event.closes_at.map(format_time),
        seed_sha256: seed.map(|s| s.sha256.clone()),
        seed: drawn.and(seed).map(Seed::hex),
        drawn,
    };
    Answer::json_body(200, serde_json::to_vec(&body).unwrap_or_default())
}

/// The draw's HMACs in drawn order, once the draw happened.
pub async fn draw(room: &Room, settings: &Settings, method: &http::Method) -> Answer {
    let (_, snapshot) = match public_snapshot(room, settings, method).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let Some(event) = settings.config.event.as_ref() else { return not_scheduled() };
    let Some(n) = drawn(snapshot.phase(event), &snapshot) else {
        return Answer::error(404, "the draw has not happened yet");
    };
    match draw_list(room, n).await {
        Ok(body) => Answer::json_body(200, body.to_vec()),
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, "event: reading the draw failed");
            Answer::unavailable(&settings.config)
        }
    }
}

/// The number drawn, once the draw happened (the open phase reached, and Redis says so).
fn drawn(phase: Phase, snapshot: &Snapshot) -> Option<u64> {
    matches!(phase, Phase::Open | Phase::Closed).then_some(snapshot.drawn).flatten()
}

fn not_scheduled() -> Answer {
    Answer::error(404, "this room has no scheduled event")
}

async fn public_snapshot<'s>(
    room: &Room,
    settings: &'s Settings,
    method: &http::Method,
) -> Result<(&'s EventConfig, std::sync::Arc<Snapshot>), Answer> {
    if method != http::Method::GET {
        return Err(Answer::method_not_allowed("GET"));
    }
    let event = settings.config.event.as_ref().ok_or_else(not_scheduled)?;
    match room.event().current(room.store(), event).await {
        Ok(snapshot) => Ok((event, snapshot)),
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            if let Some(held_back) = crate::logging::Warning::EventStateFailed.pass() {
                tracing::warn!(%error, also_failed = held_back, "event: redis unavailable");
            }
            Err(Answer::unavailable(&settings.config))
        }
    }
}

#[derive(Serialize)]
struct DrawBody {
    drawn: u64,
    hmacs: Vec<String>,
}

/// The draw list never changes after the draw: read once per proxy, in pages (no single Redis
/// call long enough to hold up other rooms), and kept. Concurrent first readers wait for the one
/// read rather than each reading 100,000 members.
async fn draw_list(room: &Room, drawn: u64) -> Result<std::sync::Arc<Vec<u8>>, StoreError> {
    let events = room.event();
    if let Some(body) = events.draw_list(drawn) {
        return Ok(body);
    }
    let _building = events.building().lock().await;
    if let Some(body) = events.draw_list(drawn) {
        return Ok(body);
    }
    let mut hmacs = Vec::with_capacity(drawn as usize);
    let mut start = 0;
    while start < drawn {
        let page = room.store().draw_page(start).await?;
        if page.is_empty() {
            break;
        }
        start += DRAW_PAGE;
        hmacs.extend(page);
    }
    hmacs.truncate(drawn as usize);
    let body = std::sync::Arc::new(serde_json::to_vec(&DrawBody { drawn, hmacs }).unwrap_or_default());
    events.keep_draw_list(drawn, body.clone());
    Ok(body)
}
