//! Scheduled events (contract section 14): a pre-queue before a known opening, a draw anybody can
//! check, and a close.
//!
//! **Why the draw costs Redis nothing at the opening.** The seed is fixed when the pre-queue
//! opens (32 random bytes, stored once in Redis by whichever proxy gets there first, its SHA-256
//! public from then on). So each user's draw key, HMAC-SHA256(seed, identity), is known the
//! moment they enter the pre-queue, and `lua/event.lua` puts them straight into the line with a
//! score taken from it: the first 52 bits of the HMAC as a fraction in `[0, 1)`, below every
//! arrival number (those start at 1). The line is then already in drawn order, in front of
//! anybody who arrives later, and the draw itself is one O(1) step: admission, held back by
//! Redis's clock until `opens_at`, starts popping. Nothing is re-scored or moved, so 100,000
//! pre-queued users draw as fast as 10 (BENCHMARKS.md has the numbers). With `shuffle: false` the
//! score is the arrival number, as in an ordinary line.
//!
//! Two users whose HMACs share their first 52 bits would be ordered by identity instead of by
//! the rest of the HMAC; with 100,000 users that happens with a probability of about 1 in 10^6.
//! The public list (`{prefix}/event/draw`) is the exact HMAC order.
//!
//! **The phase** follows Redis's clock, like admission. Enter asks Redis (`lua/event.lua` decides
//! by its `TIME`) except while the event is open and more than a second from any boundary (see
//! [`Snapshot::settled`]), when it goes straight to the line; admission is held back in
//! `lua/admit.lua` until `opens_at` and from `closes_at`; status and
//! `{prefix}/event` use Redis's time as this proxy's [`EventWatcher`] last read it, four times a
//! second, which keeps every proxy within a few milliseconds of Redis.
//!
//! **The close** (`closes_at`) ends the line once, in Redis: the waiting users' places go, their
//! status answers CLOSED, tokens already issued live on until they expire.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::metrics;
use crate::periodic::Watch;
use crate::rules::{self, PollTier};
use crate::state::RoomState;
use crate::store::{EventTick, EventTimes, Room, SeedRef, StoreError};

/// `event` in the configuration, validated: times are instants, `closes_at` is after
/// `opens_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventConfig {
    pub opens_at: DateTime<Utc>,
    /// Enter is accepted from `opens_at - prequeue`.
    pub prequeue: Duration,
    pub closes_at: Option<DateTime<Utc>>,
    /// `false`: the pre-queue keeps arrival order.
    pub shuffle: bool,
}

/// An RFC 3339 time, any offset, as an instant.
pub fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim()).map(|t| t.with_timezone(&Utc)).map_err(|e| e.to_string())
}

/// A time as the public JSON shows it: UTC, fractions of a second only when there are some.
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

impl EventConfig {
    pub fn opens_ms(&self) -> i64 {
        self.opens_at.timestamp_millis()
    }

    /// When the pre-queue opens.
    pub fn prequeue_ms(&self) -> i64 {
        self.opens_ms().saturating_sub(self.prequeue.as_millis().min(i64::MAX as u128) as i64)
    }

    pub fn closes_ms(&self) -> Option<i64> {
        self.closes_at.map(|t| t.timestamp_millis())
    }

    /// The event as the script takes it.
    pub fn times(&self) -> EventTimes {
        EventTimes {
            opens_ms: self.opens_ms(),
            prequeue_ms: self.prequeue_ms(),
            closes_ms: self.closes_ms(),
            shuffle: self.shuffle,
        }
    }

    /// The phase at `now_ms` of Redis's clock.
    pub fn phase_at(&self, now_ms: i64) -> Phase {
        if self.closes_ms().is_some_and(|c| now_ms >= c) {
            Phase::Closed
        } else if now_ms >= self.opens_ms() {
            Phase::Open
        } else if now_ms >= self.prequeue_ms() {
            Phase::Prequeue
        } else {
            Phase::Before
        }
    }

    /// What `--check` says about the event.
    pub fn describe(&self) -> String {
        let ms = |d: i64| DateTime::<Utc>::from_timestamp_millis(d).map(format_time).unwrap_or_default();
        format!(
            "event: pre-queue from {}, opens at {}, {}, {}",
            ms(self.prequeue_ms()),
            format_time(self.opens_at),
            match self.closes_at {
                Some(t) => format!("closes at {}", format_time(t)),
                None => "no close".to_string(),
            },
            if self.shuffle { "pre-queue drawn in HMAC order" } else { "pre-queue kept in arrival order" },
        )
    }
}

/// Where an event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Before,
    Prequeue,
    Open,
    Closed,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::Prequeue => "prequeue",
            Phase::Open => "open",
            Phase::Closed => "closed",
        }
    }

    pub const ALL: [Phase; 4] = [Phase::Before, Phase::Prequeue, Phase::Open, Phase::Closed];
}

/// `opensIn`: whole seconds until the opening, rounded up.
pub fn opens_in_secs(opens_in_ms: i64) -> u64 {
    (opens_in_ms.max(0) as u64).div_ceil(1000)
}

/// `pollAfter` before the opening: the tier for `opens_in` as if it were the wait, never past
/// the opening, at least 1.
pub fn poll_after_before_opening(opens_in: u64, tiers: &[PollTier]) -> u64 {
    rules::poll_after_secs(opens_in, tiers).min(opens_in).max(1)
}

/// The room's seed: fixed when the pre-queue opens, public (its hex) after the draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    pub bytes: [u8; 32],
    /// SHA-256 of the bytes, lower-case hex: the commitment shown from the pre-queue on.
    pub sha256: String,
}

impl Seed {
    /// 32 bytes from the operating system's generator: a candidate, kept only if the room has
    /// no seed yet.
    pub fn fresh() -> Seed {
        let mut bytes = [0u8; 32];
        // The OS generator failing is a broken machine; fall back to two v4 UUIDs' worth of
        // randomness rather than stop the pre-queue.
        if getrandom::fill(&mut bytes).is_err() {
            bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
            bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        }
        Seed::from_bytes(bytes)
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Seed {
        Seed { sha256: hex::encode(Sha256::digest(bytes)), bytes }
    }

    /// The seed as Redis stores it (hex); `None` for anything that is not 32 bytes of hex.
    pub fn from_hex(text: &str) -> Option<Seed> {
        crate::store::seed_bytes(text).map(Seed::from_bytes)
    }

    pub fn hex(&self) -> String {
        hex::encode(self.bytes)
    }

    /// The seed as the script takes it.
    pub fn sent(&self) -> SeedRef<'_> {
        SeedRef { bytes: &self.bytes, sha256: &self.sha256 }
    }

    /// A user's draw key: HMAC-SHA256(key = the seed's bytes, message = the identity), hex.
    pub fn draw_key(&self, user: &str) -> String {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.bytes).expect("HMAC accepts any key length");
        mac.update(user.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

/// What this proxy last read of the event in Redis.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Redis's clock at `read_at` (the middle of the round trip).
    redis_ms: i64,
    read_at: Instant,
    pub seed: Option<Seed>,
    /// Set once the draw happened: the number of users drawn.
    pub drawn: Option<u64>,
    pub prequeued: u64,
    /// Whether the event's close has happened.
    pub closed: bool,
}

impl Snapshot {
    /// Redis's clock now, as far as this proxy can tell.
    pub fn redis_now_ms(&self) -> i64 {
        self.redis_ms + self.read_at.elapsed().as_millis() as i64
    }

    /// The phase now: the configured times' by Redis's clock, but never before what Redis has
    /// recorded. Once the draw (or the close) has happened, a reload or a restart with other
    /// times cannot undo it (contract section 14: a reload may change the times before the draw).
    pub fn phase(&self, event: &EventConfig) -> Phase {
        if self.closed {
            return Phase::Closed;
        }
        match event.phase_at(self.redis_now_ms()) {
            Phase::Before | Phase::Prequeue if self.drawn.is_some() => Phase::Open,
            phase => phase,
        }
    }

    /// Whether a phase read from this snapshot cannot change within the next second: then enter
    /// need not ask Redis about the phase first.
    pub fn settled(&self, event: &EventConfig) -> bool {
        let now = self.redis_now_ms();
        let margin = 1000u64;
        // abs_diff: a huge `prequeue` puts the pre-queue's start at i64::MIN.
        let far_from = |t: i64| now.abs_diff(t) > margin;
        self.read_at.elapsed() < Duration::from_secs(2)
            && far_from(event.prequeue_ms())
            && far_from(event.opens_ms())
            && event.closes_ms().is_none_or(far_from)
    }
}

/// The event as this proxy knows it: the last snapshot, and the public draw list once built.
#[derive(Default)]
pub struct EventState {
    snapshot: ArcSwapOption<Snapshot>,
    /// `{prefix}/event/draw`'s body: it never changes after the draw, so it is read from Redis
    /// once (in pages) and kept. The key is the drawn count it was built for.
    draw_list: Mutex<Option<(u64, Arc<Vec<u8>>)>>,
    /// Held while one request reads the draw list for everyone.
    building: tokio::sync::Mutex<()>,
}

impl EventState {
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.snapshot.load_full()
    }

    pub fn draw_list(&self, drawn: u64) -> Option<Arc<Vec<u8>>> {
        let list = self.draw_list.lock().unwrap_or_else(|e| e.into_inner());
        list.as_ref().filter(|(n, _)| *n == drawn).map(|(_, body)| body.clone())
    }

    pub fn building(&self) -> &tokio::sync::Mutex<()> {
        &self.building
    }

    pub fn keep_draw_list(&self, drawn: u64, body: Arc<Vec<u8>>) {
        *self.draw_list.lock().unwrap_or_else(|e| e.into_inner()) = Some((drawn, body));
    }

    /// Reads the event in Redis (choosing the seed, drawing or closing when their time has
    /// come: whichever proxy's call is first does it, once) and keeps what it read.
    pub async fn refresh(&self, room: &Room, event: &EventConfig) -> Result<Arc<Snapshot>, StoreError> {
        let candidate = Seed::fresh();
        let sent = Instant::now();
        let tick = room.event_tick(event.times(), candidate.sent()).await?;
        let rtt = sent.elapsed();
        let snapshot = Arc::new(snapshot_of(&tick, sent + rtt / 2));
        if tick.did_draw {
            tracing::info!(drawn = tick.drawn.unwrap_or(0), "event: the pre-queue was drawn into the line");
        }
        if tick.did_close {
            // An audit line like an operator's close (crate::control), so one log query shows
            // every way the line ended.
            tracing::info!(
                target: "waitroom::audit",
                by = "event",
                detail = "closes_at",
                command = "close",
                at_ms = tick.now_ms,
                "event: closed; the line has ended"
            );
        }
        self.snapshot.store(Some(snapshot.clone()));
        Ok(snapshot)
    }

    /// The snapshot, read now if this proxy has none yet or it lacks what `phase` shows (the
    /// seed's hash from the pre-queue on, the draw once open).
    pub async fn current(&self, room: &Room, event: &EventConfig) -> Result<Arc<Snapshot>, StoreError> {
        if let Some(snapshot) = self.snapshot() {
            let phase = snapshot.phase(event);
            let complete = match phase {
                Phase::Before => true,
                Phase::Prequeue => snapshot.seed.is_some(),
                Phase::Open | Phase::Closed => snapshot.drawn.is_some(),
            };
            if complete && snapshot.read_at.elapsed() < Duration::from_secs(2) {
                return Ok(snapshot);
            }
        }
        self.refresh(room, event).await
    }

    /// Learns the room's seed from an enter that found another one stored.
    pub fn learn_seed(&self, seed: Seed) {
        if let Some(old) = self.snapshot() {
            self.snapshot.store(Some(Arc::new(Snapshot { seed: Some(seed), ..(*old).clone() })));
        }
    }
}

/// The configured event's phase now, by Redis's clock as this proxy last read it (this
/// machine's clock before the first reading); `None` without an event. For views of the room
/// (`GET /admin/room`'s `event`) that must not wait on Redis.
pub fn current_phase(state: &RoomState) -> Option<Phase> {
    let settings = state.settings();
    let event = settings.config.event.as_ref()?;
    if let Some(snapshot) = state.event().snapshot() {
        return Some(snapshot.phase(event));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Some(event.phase_at(now))
}

fn snapshot_of(tick: &EventTick, read_at: Instant) -> Snapshot {
    Snapshot {
        redis_ms: tick.now_ms,
        read_at,
        seed: tick.seed.as_deref().and_then(Seed::from_hex),
        drawn: tick.drawn,
        prequeued: tick.prequeued,
        closed: tick.closed,
    }
}

/// How often each proxy reads the event: the phase it shows is at most this old, plus a round
/// trip.
const REFRESH_EVERY: Duration = Duration::from_millis(250);

/// Reads the event every [`REFRESH_EVERY`] while one is configured: the clock the phase follows,
/// the seed, the draw, the close; and the gauges.
pub struct EventWatcher {
    state: Arc<RoomState>,
    room: Room,
}

impl EventWatcher {
    pub fn new(state: Arc<RoomState>, room: Room) -> EventWatcher {
        EventWatcher { state, room }
    }
}

#[async_trait]
impl Watch for EventWatcher {
    const EVERY: Duration = REFRESH_EVERY;

    async fn step(&self) {
        let event = self.state.settings().config.event.clone();
        let Some(event) = event else {
            // Zeros rather than nothing: a dashboard shows "no event", and a reload that removes
            // the event clears what it showed.
            for phase in Phase::ALL {
                metrics::EVENT_PHASE.with_label_values(&[phase.label()]).set(0);
            }
            metrics::EVENT_PREQUEUED.set(0);
            metrics::EVENT_DRAWN.set(0);
            return;
        };
        match self.state.event().refresh(&self.room, &event).await {
            Ok(snapshot) => {
                let phase = snapshot.phase(&event);
                for p in Phase::ALL {
                    metrics::EVENT_PHASE.with_label_values(&[p.label()]).set(i64::from(p == phase));
                }
                metrics::EVENT_PREQUEUED.set(snapshot.prequeued as i64);
                metrics::EVENT_DRAWN.set(snapshot.drawn.unwrap_or(0) as i64);
            }
            Err(error) => {
                metrics::REDIS_ERRORS_TOTAL.inc();
                tracing::debug!(%error, "event: reading the event failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn event(yaml: &str) -> Result<EventConfig, Vec<String>> {
        Config::parse(&format!("upstream: 127.0.0.1:1\nevent: {yaml}"))
            .map(|c| c.event.expect("event given"))
            .map_err(|e| e.problems.iter().map(|p| p.to_string()).collect())
    }

    #[test]
    fn the_event_is_validated_with_key_paths() {
        let e = event("{opens_at: \"2026-12-24T19:00:00+09:00\", closes_at: \"2026-12-24T12:00:00Z\"}").unwrap();
        assert_eq!(format_time(e.opens_at), "2026-12-24T10:00:00Z");
        assert_eq!(e.prequeue, Duration::from_secs(30 * 60), "the contract's example as default");
        assert!(e.shuffle);
        let problems = event("{opens_at: tomorrow, prequeue: -5m, closes_at: \"2026-12-24\"}").unwrap_err();
        assert!(problems[0].starts_with("event.opens_at: 'tomorrow' is not an RFC 3339 time"), "{problems:?}");
        assert!(problems[1].starts_with("event.prequeue: "), "{problems:?}");
        assert!(problems[2].starts_with("event.closes_at: "), "{problems:?}");
        let before = event("{opens_at: \"2026-12-24T10:00:00Z\", closes_at: \"2026-12-24T10:00:00Z\"}").unwrap_err();
        assert_eq!(before, vec!["event.closes_at: must be after event.opens_at"]);
        assert!(event("{opens_at: \"2026-12-24T10:00:00Z\", seed: 1}").is_err(), "unknown keys");
        assert!(event("{prequeue: 5m}").is_err(), "opens_at is required");
    }

    #[test]
    fn phases_follow_the_times() {
        let e = event("{opens_at: \"2026-12-24T10:00:00Z\", prequeue: 30m, closes_at: \"2026-12-24T12:00:00Z\"}")
            .unwrap();
        let at = |t: &str| e.phase_at(parse_time(t).unwrap().timestamp_millis());
        assert_eq!(at("2026-12-24T09:29:59.999Z"), Phase::Before);
        assert_eq!(at("2026-12-24T09:30:00Z"), Phase::Prequeue);
        assert_eq!(at("2026-12-24T09:59:59.999Z"), Phase::Prequeue);
        assert_eq!(at("2026-12-24T10:00:00Z"), Phase::Open);
        assert_eq!(at("2026-12-24T12:00:00Z"), Phase::Closed);
        assert!(e.describe().contains("pre-queue from 2026-12-24T09:30:00Z, opens at 2026-12-24T10:00:00Z"));
    }

    #[test]
    fn absurd_times_are_served_not_panicked_on() {
        let e = event("{opens_at: \"9999-12-31T23:59:59Z\", prequeue: 10000000000000h}").unwrap();
        assert_eq!(e.phase_at(0), Phase::Prequeue);
        let snapshot = Snapshot { redis_ms: i64::MAX / 2, read_at: Instant::now(), seed: None, drawn: None, prequeued: 0, closed: false };
        assert!(snapshot.settled(&e));
        assert!(!e.describe().is_empty());
    }

    #[test]
    fn poll_after_never_passes_the_opening() {
        let tiers = Config::parse("upstream: 127.0.0.1:1").unwrap().poll_after;
        // Whole seconds, rounded up.
        for (ms, secs) in [(1, 1), (1000, 1), (1001, 2), (-5, 0)] {
            assert_eq!(opens_in_secs(ms), secs, "{ms} ms");
        }
        // Tiers 60 s -> 10 s, 10 s -> 5 s, else 2 s; never past the opening, at least 1.
        for (opens_in, poll_after) in [(600, 10), (30, 5), (7, 2), (1, 1), (0, 1)] {
            assert_eq!(poll_after_before_opening(opens_in, &tiers), poll_after, "opens in {opens_in} s");
        }
    }

    #[test]
    fn the_draw_key_is_hmac_sha256_of_the_identity_under_the_seed() {
        // RFC 4231 test case 2 has a short key; HMAC pads any key the same way, so check the
        // construction on the seed's 32 bytes against a value computed independently
        // (python3: hmac.new(bytes(range(32)), b"alice", hashlib.sha256).hexdigest()).
        let seed = Seed::from_bytes(std::array::from_fn(|i| i as u8));
        assert_eq!(seed.draw_key("alice"), "6eefad2bed97b6d93ee663d67a44b46016b3d79dcad54ada39b61a1d14874d1b");
        assert_eq!(seed.sha256, "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd");
        assert_eq!(Seed::from_hex(&seed.hex()), Some(seed.clone()));
        assert_eq!(Seed::from_hex("abc"), None);
        assert_ne!(Seed::fresh(), Seed::fresh());
    }
}
