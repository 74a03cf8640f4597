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
//! [`Snapshot::settled`](crate::room::event::Snapshot::settled)), when it goes straight to the line; admission is held back in
//! `lua/admit.lua` until `opens_at` and from `closes_at`; status and
//! `{prefix}/event` use Redis's time as this proxy's [`EventWatcher`] last read it, four times a
//! second, which keeps every proxy within a few milliseconds of Redis.
//!
//! **The close** (`closes_at`) ends the line once, in Redis: the waiting users' places go, their
//! status answers CLOSED, tokens already issued live on until they expire.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::config::Phase;
use crate::metrics;
use crate::periodic::Watch;
use crate::room::Room;
use crate::store::RoomStore;

/// How often each proxy reads the event: the phase it shows is at most this old, plus a round
/// trip.
const REFRESH_EVERY: Duration = Duration::from_millis(250);

/// Reads the event every [`REFRESH_EVERY`] while one is configured: the clock the phase follows,
/// the seed, the draw, the close; and the gauges.
pub struct EventWatcher {
    room: Arc<Room>,
    store: RoomStore,
}

impl EventWatcher {
    pub fn new(room: Arc<Room>, store: RoomStore) -> EventWatcher {
        EventWatcher { room, store }
    }
}

#[async_trait]
impl Watch for EventWatcher {
    const EVERY: Duration = REFRESH_EVERY;

    async fn step(&self) {
        let event = self.room.settings().config.event.clone();
        let Some(event) = event else {
            // Zeros rather than nothing: a dashboard shows "no event", and a reload that removes
            // the event clears what it showed.
            let metrics = self.room.metrics();
            for phase in Phase::ALL {
                metrics.event_phase.with(phase.label(), |gauge| gauge.set(0));
            }
            metrics.event_prequeued.set(0);
            metrics.event_drawn.set(0);
            return;
        };
        match self.room.event().refresh(&self.store, &event).await {
            Ok(snapshot) => {
                let phase = snapshot.phase(&event);
                let metrics = self.room.metrics();
                for p in Phase::ALL {
                    metrics.event_phase.with(p.label(), |gauge| gauge.set(i64::from(p == phase)));
                }
                metrics.event_prequeued.set(snapshot.prequeued as i64);
                metrics.event_drawn.set(snapshot.drawn.unwrap_or(0) as i64);
            }
            Err(error) => {
                metrics::REDIS_ERRORS_TOTAL.inc();
                tracing::debug!(%error, "event: reading the event failed");
            }
        }
    }
}
