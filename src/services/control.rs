//! Operator control (contract section 15): the room is open, paused or closed, and the operator
//! (admin API), the order API (origin commands) or a scheduled event changes that without a
//! deploy.
//!
//! **Where the state lives.** One hash in Redis (`Keys::room`), so it survives restarts and is
//! the same for every proxy. What must hold at once is enforced inside the scripts that act:
//! `lua/admit.lua` admits nobody unless the room is open, `lua/enter.lua` queues nobody in a
//! closed room and gives no instant pass unless it is open, and `lua/room.lua` changes the state
//! and empties the line in the same step. So a pause holds from the next admission tick of any
//! proxy, and no enter can slip into a line that was just closed, whatever a proxy has heard.
//!
//! **What each proxy follows.** The room watcher (`crate::services::watch`) reads the state with
//! the room's numbers, four times a second (once every 350 ms while the room is quiet), and
//! [`follow`]s it into the room state, for the gauge and for status: a waiting user of a closed
//! room hears CLOSED. Status does not trust that copy
//! alone: a NOT_IN_QUEUE from Redis is checked against Redis's state ([`closed_now`]), because
//! the line it found empty may have been emptied by a close a moment ago.
//!
//! **Who changed it.** Every change is logged once, by the proxy that made it, under the target
//! `waitroom::audit`, with who (admin, origin, event), the state before and after, and when (by
//! Redis's clock, the same for every proxy).


use pingora::http::ResponseHeader;

use crate::config::Phase;
use crate::metrics;
use crate::policy::Settings;
pub use crate::room::mode::Mode;
use crate::room::Room;
use crate::store::{RoomReport, RoomStore, StoreError};

/// The response header an origin steers the room with.
pub const ORIGIN_HEADER: &str = "waitroom-command";

/// What an operator, the origin or an event may ask of the room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Pause,
    Resume,
    Close,
    Open,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Close => "close",
            Command::Open => "open",
        }
    }

    pub fn parse(text: &str) -> Option<Command> {
        match text {
            "pause" => Some(Command::Pause),
            "resume" => Some(Command::Resume),
            "close" => Some(Command::Close),
            "open" => Some(Command::Open),
            _ => None,
        }
    }

    /// The state this command leads to when it is obeyed.
    pub fn target(self) -> Mode {
        match self {
            Command::Pause => Mode::Paused,
            Command::Close => Mode::Closed,
            Command::Resume | Command::Open => Mode::Open,
        }
    }
}

/// Who changed the room's state, for the audit log and the stored `by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    Admin,
    Origin,
    /// A scheduled event (contract section 14) closing the room at `closes_at`.
    Event,
}

impl Actor {
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::Admin => "admin",
            Actor::Origin => "origin",
            Actor::Event => "event",
        }
    }
}

/// What `GET /admin/room` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub mode: Mode,
    pub queue_length: u64,
    /// The batch in force (the adaptive controller's within the configured bounds, else
    /// `batch_size`).
    pub batch: u32,
    pub active_tokens: u64,
    pub admitted_last_minute: u64,
    /// The scheduled event's phase (contract section 14), `None` when no event is configured.
    pub event: Option<String>,
    /// `mode` (section 18): whether the room refuses, or only counts what it would refuse.
    pub run_mode: crate::config::RoomMode,
}

/// A command's result: the room as it left it, and why it was refused, if it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub view: View,
    pub refused: Option<String>,
    pub changed: bool,
}

/// The scheduled event's phase for the admin view (`before`, `prequeue`, `open`, `closed`, by
/// Redis's clock as this proxy last read it); `None` without an `event`.
pub fn event_phase(room: &Room) -> Option<String> {
    room.event_phase().map(|phase| phase.label().to_owned())
}

/// Looks at the room (`command: None`) or applies `command` for `actor`; `detail` says more
/// about who (an address, a user) in the audit line.
pub async fn apply(
    room: &Room,
    store: &RoomStore,
    command: Option<Command>,
    actor: Actor,
    detail: &str,
) -> Result<Applied, StoreError> {
    let read_batch = room.settings().policy.rules.min_batch.is_some();
    let report = store.room_command(command.map_or("", Command::as_str), actor.as_str(), read_batch).await?;
    let (before, after) = (Mode::parse(Some(&report.before)), Mode::parse(Some(&report.state)));
    let changed = before != after;
    if changed {
        tracing::info!(
            target: "waitroom::audit",
            by = actor.as_str(),
            detail,
            command = command.map_or("", Command::as_str),
            from = before.as_str(),
            to = after.as_str(),
            at_ms = report.since_ms,
            "room state changed"
        );
    }
    publish(room, after, report.since_ms);
    let settings = room.settings();
    Ok(Applied { view: view(room, &settings, after, &report), refused: report.refused, changed })
}

fn view(room: &Room, settings: &Settings, mode: Mode, report: &RoomReport) -> View {
    let phase = room.event_phase();
    // An event past its close takes nobody new, whatever the stored state says: describing the
    // room as open then would tell an operator that a finished drop still admits.
    let mode = if phase == Some(Phase::Closed) { Mode::Closed } else { mode };
    View {
        mode,
        queue_length: report.waiting,
        batch: settings.policy.batch_in_force(report.stored_batch),
        active_tokens: report.live_tokens,
        admitted_last_minute: report.admitted_last_minute,
        event: phase.map(|p| p.label().to_owned()),
        run_mode: settings.config.mode,
    }
}

/// Takes a state read from Redis into this proxy's room state and the gauges.
fn publish(room: &Room, mode: Mode, since_ms: Option<u64>) -> Mode {
    let before = room.set_mode(mode);
    if mode == Mode::Closed && before != Mode::Closed {
        // The close reaches held polls at once: each asks Redis, and hears CLOSED.
        room.held().wake_all();
    }
    for m in Mode::ALL {
        room.metrics().room_state.with(m.as_str(), |gauge| gauge.set(i64::from(m == mode)));
    }
    if let Some(since) = since_ms {
        room.metrics().room_state_changed.set(since as f64 / 1000.0);
    }
    before
}

/// Whether the room is closed now: this proxy's copy when it says so, else Redis's own word.
/// For answers that a close a moment ago would change (a NOT_IN_QUEUE found in an emptied line);
/// a Redis that does not answer leaves the answer as it was.
pub async fn closed_now(room: &Room) -> bool {
    if room.mode() == Mode::Closed {
        return true;
    }
    match room.store().read_room_state().await {
        Ok(reading) => {
            let mode = Mode::parse(reading.state.as_deref());
            publish(room, mode, reading.since_ms);
            mode == Mode::Closed
        }
        Err(_) => false,
    }
}

/// The command an origin's `Waitroom-Command` value asks for: `close` or `pause` (any case,
/// surrounding spaces ignored); nothing else may be asked from the origin.
pub fn origin_command(value: &[u8]) -> Option<Command> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.eq_ignore_ascii_case("close") {
        Some(Command::Close)
    } else if text.eq_ignore_ascii_case("pause") {
        Some(Command::Pause)
    } else {
        None
    }
}

/// A protected response's `Waitroom-Command`: removed before the client sees the response,
/// whether or not it is obeyed, and obeyed when `admin.origin_commands` is on. Awaited before
/// the response goes on, so whoever the order API answered next already meets the new state.
pub async fn from_origin(room: &Room, response: &mut ResponseHeader, user: Option<&str>) {
    let values: Vec<_> = response.headers.get_all(ORIGIN_HEADER).iter().cloned().collect();
    if values.is_empty() {
        return;
    }
    response.remove_header(ORIGIN_HEADER);
    if !room.settings().config.admin.origin_commands {
        tracing::debug!("origin command ignored (admin.origin_commands is off)");
        return;
    }
    // Several copies: the strongest wins (close over pause); unknown words are not obeyed.
    let commands: Vec<Command> = values.iter().filter_map(|v| origin_command(v.as_bytes())).collect();
    let command = if commands.contains(&Command::Close) { Some(Command::Close) } else { commands.first().copied() };
    let Some(command) = command else {
        let shown: Vec<String> = values.iter().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).collect();
        tracing::warn!(values = ?shown, "origin sent an unknown Waitroom-Command; ignored (close and pause are obeyed)");
        return;
    };
    // An order API that says "sold out" on every response after the last item must not cost a
    // Redis call per response once the room is in that state.
    if room.mode() == command.target() {
        return;
    }
    let detail = format!("protected response to user {}", user.unwrap_or("-"));
    match apply(room, room.store(), Some(command), Actor::Origin, &detail).await {
        Ok(applied) => {
            if let Some(reason) = applied.refused {
                tracing::info!(command = command.as_str(), reason, "origin command not applied");
            }
        }
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, command = command.as_str(), "origin command could not reach redis");
        }
    }
}

/// Follows the room's state as the room watcher read it (`state`, changed at `since_ms`): the
/// reading rides on the watcher's own call, so following it costs no Redis call of its own.
pub fn follow(room: &Room, state: &str, since_ms: Option<u64>) {
    let mode = Mode::parse(Some(state));
    let before = publish(room, mode, since_ms);
    if before != mode {
        tracing::info!(from = before.as_str(), to = mode.as_str(), "room state followed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_close_and_pause_come_from_the_origin() {
        assert_eq!(origin_command(b"close"), Some(Command::Close));
        assert_eq!(origin_command(b" Pause "), Some(Command::Pause));
        assert_eq!(origin_command(b"open"), None);
        assert_eq!(origin_command(b"resume"), None);
        assert_eq!(origin_command(b"\xff"), None);
        assert_eq!(origin_command(b""), None);
    }

    #[test]
    fn commands_name_their_target() {
        for (word, target) in
            [("pause", Mode::Paused), ("resume", Mode::Open), ("close", Mode::Closed), ("open", Mode::Open)]
        {
            let command = Command::parse(word).unwrap();
            assert_eq!((command.as_str(), command.target()), (word, target));
        }
        assert_eq!(Command::parse("PAUSE"), None);
    }
}
