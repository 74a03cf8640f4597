//! The room's state and the operator's view of it: `lua/room.lua` (look, or change the state and
//! look, in one step) and a plain read of the state for every proxy's watcher.


use super::{RoomStore, StoreError};

script! {
    static SCRIPT = [ROOM_STATE] "lua/room.lua";
    keys [room, queue, heard, tokens, adaptive, admitted_minute]
    args RoomArgs<'a> {
        command: &'a str,
        by: &'a str,
        read_batch: bool,
    }
    reply RoomReply {
        state: String,
        before: String,
        refused: String,
        since_ms: i64,
        waiting: u64,
        live_tokens: u64,
        stored_batch: i64,
        admitted_last_minute: u64,
    }
}

/// The room as one call of `lua/room.lua` left it. States are the script's words (`open`,
/// `paused`, `closed`); `crate::control` gives them a type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomReport {
    pub state: String,
    /// The state before this call (the same as `state` when nothing changed).
    pub before: String,
    /// Why the command was refused, if it was (pause or resume of a closed room).
    pub refused: Option<String>,
    /// When the state last changed, in Redis's clock (ms since the Unix epoch).
    pub since_ms: Option<u64>,
    pub waiting: u64,
    pub live_tokens: u64,
    /// The adaptive controller's stored batch (not clamped); `None` without adaptive or before
    /// its first step.
    pub stored_batch: Option<u32>,
    pub admitted_last_minute: u64,
}

/// The state every proxy follows, as the watcher reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomStateReading {
    /// `None`: the room never had a state (open).
    pub state: Option<String>,
    pub since_ms: Option<u64>,
}

impl RoomStore {
    /// Applies `command` (`""`: none, only look) for `by`, and reports the room as it left it.
    pub async fn room_command(&self, command: &str, by: &str, read_batch: bool) -> Result<RoomReport, StoreError> {
        let reply = RoomReply::decode(self.run(&invoke(&self.keys, RoomArgs { command, by, read_batch })).await?)?;
        Ok(RoomReport {
            state: reply.state,
            before: reply.before,
            refused: Some(reply.refused).filter(|r| !r.is_empty()),
            since_ms: u64::try_from(reply.since_ms).ok(),
            waiting: reply.waiting,
            live_tokens: reply.live_tokens,
            stored_batch: u32::try_from(reply.stored_batch).ok(),
            admitted_last_minute: reply.admitted_last_minute,
        })
    }

    /// The room's state and when it changed: one HMGET, for a status that must know the state
    /// now (every proxy follows it with the room watcher's reading, `lua/stats.lua`).
    pub async fn read_room_state(&self) -> Result<RoomStateReading, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let (state, since): (Option<String>, Option<u64>) =
                redis::cmd("HMGET").arg(&self.keys.room).arg("state").arg("since").query_async(&mut conn).await?;
            Ok(RoomStateReading { state, since_ms: since })
        })
        .await
    }
}

