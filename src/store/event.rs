//! A scheduled event in Redis (contract section 14): `lua/event.lua` (the phase by Redis's
//! clock, the pre-queue, and the seed, draw and close that happen once), the standing of a user
//! outside the open phase, and the public draw list, read in pages.
//!
//! It takes the event and its seed as plain values ([`EventTimes`], [`SeedRef`]):
//! `crate::room::event` owns the seed and reads and writes the event through this module.

use super::{RoomStore, StoreError};
use crate::config::EventConfig;

script! {
    static SCRIPT = [] "lua/event.lua";
    keys [event, event_draw, queue, seq] and EventKeys { user_token, address_counter }
    args EventArgs<'a> {
        op: &'a str,
        user: &'a str,
        opens_ms: u64,
        prequeue_ms: u64,
        closes_ms: u64,
        capacity: u64,
        shuffle: bool,
        seed: &'a str,
        seed_sha: &'a str,
        hmac: &'a str,
        per_address: u32,
    }
    reply EventReply {
        "TICK" => Tick {
            now_ms: i64,
            seed: Option<String>,
            drawn: Option<i64>,
            prequeued: i64,
            did_draw: bool,
            did_close: bool,
            closed: bool,
        },
        "NOT_OPEN" => NotOpen { opens_in_ms: i64 },
        "PREQUEUED" => Prequeued { opens_in_ms: i64, already: bool },
        "FULL" => Full {},
        "LIMITED" => Limited { retry_secs: i64 },
        "CLOSED" => Closed {},
        "READY" => Ready { token: String, remaining_ms: i64 },
        "OPEN" => Open {},
        "SEED" => Seed { seed: Option<String> },
    }
}

/// What the script needs of the configured event: its times by Redis's clock (Unix ms) and
/// whether the pre-queue is drawn in HMAC order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTimes {
    pub opens_ms: i64,
    /// When the pre-queue opens.
    pub prequeue_ms: i64,
    pub closes_ms: Option<i64>,
    pub shuffle: bool,
}

impl EventTimes {
    pub fn of(event: &EventConfig) -> EventTimes {
        EventTimes {
            opens_ms: event.opens_ms(),
            prequeue_ms: event.prequeue_ms(),
            closes_ms: event.closes_ms(),
            shuffle: event.shuffle,
        }
    }
}

/// A seed as the script takes it: its 32 bytes and their SHA-256 (hex), the commitment.
#[derive(Debug, Clone, Copy)]
pub struct SeedRef<'a> {
    pub bytes: &'a [u8; 32],
    pub sha256: &'a str,
}

/// What a tick read (and did) in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTick {
    /// Redis's clock, Unix ms.
    pub now_ms: i64,
    /// The room's seed (hex), once chosen.
    pub seed: Option<String>,
    /// Users drawn, once the draw happened.
    pub drawn: Option<u64>,
    /// Users in the pre-queue (fixed from the draw on).
    pub prequeued: u64,
    /// This call did the draw (one call in the whole room does).
    pub did_draw: bool,
    /// This call closed the line (one call in the whole room does).
    pub did_close: bool,
    /// The line was closed (by this call or before it).
    pub closed: bool,
}

/// An enter's outcome outside the open phase, or `Open` (enter the line as usual).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventEnter {
    NotOpen { opens_in_ms: i64 },
    Prequeued { opens_in_ms: i64, already: bool },
    Full,
    Limited { retry_secs: u64 },
    Closed,
    Ready { token: String, remaining_ms: u64 },
    Open,
    /// The room's seed (its bytes) is not the one the HMAC was computed with.
    OtherSeed([u8; 32]),
}

/// Who enters an event's pre-queue, under which limits (as [`super::EnterRequest`]).
#[derive(Debug, Clone, Copy)]
pub struct Entering<'a> {
    pub user: &'a str,
    pub capacity: u64,
    /// `(client address, identities allowed per address per minute)`; `None` when unlimited.
    pub per_address: Option<(&'a str, u32)>,
}

/// Where a user stands, read without writing: their place and their token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    Queued,
    Ready { token: String, remaining_ms: u64 },
    Neither,
}

/// Members read per call when publishing the draw list: about 70 KB of reply, well under a
/// millisecond of Redis's time each (BENCHMARKS.md), so a 100,000-user list never blocks other
/// rooms' calls for long.
pub const DRAW_PAGE: u64 = 1000;

impl RoomStore {
    /// One call of the script; a tick reads no user, capacity or address, but the layout is one.
    fn event_call(&self, op: &str, event: EventTimes, entering: &Entering<'_>, seed: SeedRef<'_>, hmac: &str) -> redis::ScriptInvocation<'static> {
        let user = entering.user;
        let (address, per_address) = entering.per_address.unwrap_or(("-", 0));
        let (seed_hex, user_token, address_counter) =
            (hex::encode(seed.bytes), self.keys.token(user), self.keys.abuse_counter(address));
        let args = EventArgs {
            op,
            user,
            // Times before 1970 are refused by nobody but mean nothing here: as 0 they are past.
            opens_ms: event.opens_ms.max(0) as u64,
            prequeue_ms: event.prequeue_ms.max(0) as u64,
            closes_ms: event.closes_ms.map_or(0, |c| c.max(1) as u64),
            shuffle: event.shuffle,
            seed: &seed_hex,
            seed_sha: seed.sha256,
            hmac,
            per_address,
            capacity: entering.capacity,
        };
        invoke(&self.keys, EventKeys { user_token: &user_token, address_counter: &address_counter }, args)
    }

    /// Reads the event, choosing the seed (`candidate`, if the room has none and the pre-queue
    /// is open), drawing or closing when their time has come.
    pub async fn event_tick(&self, event: EventTimes, candidate: SeedRef<'_>) -> Result<EventTick, StoreError> {
        let nobody = Entering { user: "", capacity: 0, per_address: None };
        let call = self.event_call("tick", event, &nobody, candidate, "");
        match EventReply::decode(self.run(&call).await?)? {
            EventReply::Tick { now_ms, seed, drawn, prequeued, did_draw, did_close, closed } => Ok(EventTick {
                now_ms,
                seed,
                drawn: drawn.map(|n| n.max(0) as u64),
                prequeued: prequeued.max(0) as u64,
                did_draw,
                did_close,
                closed,
            }),
            _ => Err(StoreError::Reply(format!("{FILE}: a tick answered another tag"))),
        }
    }

    /// Enters `user` while an event is configured: refused before the pre-queue and after the
    /// close, into the pre-queue (its place `hmac`, the user's draw key under `seed`) before the
    /// opening, else `Open`.
    pub async fn event_enter(
        &self,
        event: EventTimes,
        entering: &Entering<'_>,
        seed: SeedRef<'_>,
        hmac: &str,
    ) -> Result<EventEnter, StoreError> {
        let call = self.event_call("enter", event, entering, seed, hmac);
        Ok(match EventReply::decode(self.run(&call).await?)? {
            EventReply::NotOpen { opens_in_ms } => EventEnter::NotOpen { opens_in_ms },
            EventReply::Prequeued { opens_in_ms, already } => EventEnter::Prequeued { opens_in_ms, already },
            EventReply::Full {} => EventEnter::Full,
            EventReply::Limited { retry_secs } => EventEnter::Limited { retry_secs: retry_secs.max(1) as u64 },
            EventReply::Closed {} => EventEnter::Closed,
            EventReply::Ready { token, remaining_ms } => {
                EventEnter::Ready { token, remaining_ms: remaining_ms.max(0) as u64 }
            }
            EventReply::Open {} => EventEnter::Open,
            EventReply::Seed { seed } => match seed.as_deref().and_then(seed_bytes) {
                Some(bytes) => EventEnter::OtherSeed(bytes),
                None => return Err(StoreError::Reply(format!("{FILE}: the room's seed is not 32 bytes of hex"))),
            },
            EventReply::Tick { .. } => return Err(StoreError::Reply(format!("{FILE}: an enter answered TICK"))),
        })
    }

    /// Whether `user` has a place in the line or a live token: the reads of a status outside the
    /// open phase, as one MULTI/EXEC.
    pub async fn standing(&self, user: &str) -> Result<Standing, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let token_key = self.keys.token(user);
            let (score, token, pttl): (Option<f64>, Option<String>, i64) = redis::pipe()
                .atomic()
                .cmd("ZSCORE")
                .arg(&self.keys.queue)
                .arg(user)
                .cmd("GET")
                .arg(&token_key)
                .cmd("PTTL")
                .arg(&token_key)
                .query_async(&mut conn)
                .await?;
            Ok(match (score, token) {
                (Some(_), _) => Standing::Queued,
                (None, Some(token)) => Standing::Ready { token, remaining_ms: pttl.max(0) as u64 },
                (None, None) => Standing::Neither,
            })
        })
        .await
    }

    /// One page of the draw list (HMAC hex, in drawn order) from `start`.
    pub async fn draw_page(&self, start: u64) -> Result<Vec<String>, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let page: Vec<String> = redis::cmd("ZRANGE")
                .arg(&self.keys.event_draw)
                .arg(start)
                .arg(start + DRAW_PAGE - 1)
                .query_async(&mut conn)
                .await?;
            Ok(page)
        })
        .await
    }
}

/// A seed as Redis stores it (hex) as its bytes; `None` for anything that is not 32 bytes of hex.
pub fn seed_bytes(text: &str) -> Option<[u8; 32]> {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(text, &mut bytes).ok()?;
    Some(bytes)
}
