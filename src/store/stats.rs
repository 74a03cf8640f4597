//! The room's numbers (`lua/stats.lua`), read about four times a second by every proxy's room
//! watcher: for the gauges, the estimates, and what the admission switches need.

use std::time::Duration;

use super::{RoomStore, RoomRules, StoreError};

script! {
    static SCRIPT = [ROOM_STATE] "lua/stats.lua";
    keys [queue, tokens, adaptive, admissions, room]
    args StatsArgs {
        read_batch: bool,
        read_admissions: bool,
    }
    reply StatsReply {
        waiting: u64,
        live_tokens: u64,
        stored_batch: i64,
        admitted_recently: u64,
        since_first_ms: i64,
        state: String,
        state_since_ms: i64,
    }
}

/// What the room watcher reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomWatch {
    pub waiting: u64,
    pub live_tokens: u64,
    /// The batch the adaptive controller stored (not clamped to the configured bounds); `None`
    /// without adaptive or before its first step.
    pub stored_batch: Option<u32>,
    /// Users admitted in the last 10 s (only when the rules listen).
    pub admitted_recently: u64,
    /// Time since the room's first logged admission; `None` before it (or when not asked).
    pub since_first: Option<Duration>,
    /// The room's state (`open`, `paused`, `closed`), which every proxy follows.
    pub state: String,
    /// When the state last changed, in Redis's clock (ms since the Unix epoch).
    pub state_since_ms: Option<u64>,
}

impl RoomStore {
    /// The room's numbers, and under `rules` that listen, the batch in force and the measured
    /// admissions (nothing more is read under the fixed rate, nor under [`RoomRules::OFF`]).
    pub async fn watch(&self, rules: &RoomRules) -> Result<RoomWatch, StoreError> {
        let args = StatsArgs { read_batch: rules.min_batch.is_some(), read_admissions: rules.listens() };
        let reply = StatsReply::decode(self.run(&invoke(&self.keys, args)).await?)?;
        Ok(RoomWatch {
            waiting: reply.waiting,
            live_tokens: reply.live_tokens,
            stored_batch: u32::try_from(reply.stored_batch).ok(),
            admitted_recently: reply.admitted_recently,
            since_first: u64::try_from(reply.since_first_ms).ok().map(Duration::from_millis),
            state: reply.state,
            state_since_ms: u64::try_from(reply.state_since_ms).ok(),
        })
    }
}
