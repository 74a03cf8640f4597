//! The admission tick: `lua/admit.lua`, which sweeps abandoned places and admits the batch in
//! force when the room's schedule (in Redis, on Redis's clock) says one is due.

use std::time::Duration;

use super::{RoomStore, RoomRules, StoreError};

script! {
    static SCRIPT = [ADMISSION, ROOM_STATE, ROOM_CLOCK] "lua/admit.lua";
    keys [queue, next_admission, tokens, adaptive, admission_spent, admissions, heard, room, admitted_minute, room_clock]
    args AdmitArgs<'a> {
        interval_us: u64,
        batch_size: u32,
        ttl_ms: u64,
        token_prefix: &'a str,
        max_active: u64,
        min_batch: u32,
        instant: bool,
        abandon_ms: u64,
        listens: bool,
        opens_us: u64,
        closes_us: u64,
        keeps_time: bool,
    }
    reply AdmitReply {
        admitted: u64,
        wait_us: u64,
        was_due: bool,
        abandoned: u64,
        batch: u32,
        passed: Option<f64>,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmitOutcome {
    pub admitted: u64,
    /// How long until the room's next admission is due.
    pub next_due: Duration,
    /// Whether this call was the one the schedule was waiting for (false: another proxy's was).
    pub was_due: bool,
    /// Places of users who stopped polling, removed by this tick.
    pub abandoned: u64,
    /// The batch this tick admitted with (0 when it was not due).
    pub batch: u32,
    /// The score of the last place this tick took from the front (admitted, or dropped as
    /// abandoned): everyone up to it has left the line.
    pub passed: Option<f64>,
}

impl RoomStore {
    /// One admission tick under `rules`: sweeps abandoned places, then admits the batch in
    /// force (less what max_active leaves no room for) if the room's schedule says one is due,
    /// admitting nobody before `opens_at_ms` of Redis's clock (a scheduled event's opening: its
    /// pre-queue waits for the draw) nor from `closes_at_ms` (its close). `None`: no such bound.
    pub async fn admit_within(
        &self,
        rules: &RoomRules,
        opens_at_ms: Option<i64>,
        closes_at_ms: Option<i64>,
    ) -> Result<AdmitOutcome, StoreError> {
        let args = AdmitArgs {
            interval_us: rules.interval_us(),
            batch_size: rules.batch_size,
            ttl_ms: rules.ttl_ms(),
            token_prefix: &self.keys.token_prefix,
            max_active: rules.max_active,
            min_batch: rules.min_batch.unwrap_or(0),
            instant: rules.instant,
            abandon_ms: rules.abandon_ms(),
            listens: rules.listens(),
            opens_us: opens_at_ms.map_or(0, |ms| ms.max(0) as u64 * 1000),
            closes_us: closes_at_ms.map_or(0, |ms| ms.max(1) as u64 * 1000),
            keeps_time: rules.keeps_time(),
        };
        let mut call = invoke(&self.keys, args);
        // Lua has no secure randomness: one fresh token per place the batch may fill.
        for _ in 0..rules.batch_size {
            call.arg(uuid::Uuid::new_v4().to_string());
        }
        let reply = AdmitReply::decode(self.run(&call).await?)?;
        Ok(AdmitOutcome {
            admitted: reply.admitted,
            next_due: Duration::from_micros(reply.wait_us),
            was_due: reply.was_due,
            abandoned: reply.abandoned,
            batch: reply.batch,
            passed: reply.passed,
        })
    }
}
