//! A scheduled event as this proxy knows it (contract section 14): the last reading of the event
//! in Redis (its clock, the seed, the draw, the close), the public draw list once built, and the
//! seed's draw keys. Why the draw costs nothing at the opening is told in
//! `crate::services::event`, which keeps this fresh.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::config::{EventConfig, Phase};
use crate::rules::{self, PollTier};
use crate::store::{EventTick, EventTimes, RoomStore, SeedRef, StoreError};

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
    pub async fn refresh(&self, store: &RoomStore, event: &EventConfig) -> Result<Arc<Snapshot>, StoreError> {
        let candidate = Seed::fresh();
        let sent = Instant::now();
        let tick = store.event_tick(EventTimes::of(event), candidate.sent()).await?;
        let rtt = sent.elapsed();
        let snapshot = Arc::new(snapshot_of(&tick, sent + rtt / 2));
        if tick.did_draw {
            tracing::info!(drawn = tick.drawn.unwrap_or(0), "event: the pre-queue was drawn into the line");
        }
        if tick.did_close {
            // An audit line like an operator's close (crate::services::control), so one log query shows
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
    pub async fn current(&self, store: &RoomStore, event: &EventConfig) -> Result<Arc<Snapshot>, StoreError> {
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
        self.refresh(store, event).await
    }

    /// Learns the room's seed from an enter that found another one stored.
    pub fn learn_seed(&self, seed: Seed) {
        if let Some(old) = self.snapshot() {
            self.snapshot.store(Some(Arc::new(Snapshot { seed: Some(seed), ..(*old).clone() })));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_snapshot_of_absurd_times_is_settled_not_panicked_on() {
        let e = Config::parse("upstream: 127.0.0.1:1\nevent: {opens_at: \"9999-12-31T23:59:59Z\", prequeue: 10000000000000h}")
            .unwrap()
            .event
            .unwrap();
        let snapshot = Snapshot { redis_ms: i64::MAX / 2, read_at: Instant::now(), seed: None, drawn: None, prequeued: 0, closed: false };
        assert!(snapshot.settled(&e));
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

