//! The claims this proxy holds for orders in flight, kept alive in Redis for as long as their
//! request lasts (contract section 12: one admission, one order).
//!
//! A claim is written with `token.claim_timeout` to live, so that one left by a proxy that died
//! mid-request ends by itself. An order can outlast that by no fault of the room's: a client
//! that trickles its body, an order API that is slow to answer. Were the claim to expire then, a
//! second order with the same token would be claimed and forwarded beside the first. So every
//! claim this proxy holds is registered here while its request is in flight, and one keeper per
//! proxy renews them all a third of `claim_timeout` at a time: one Redis call per group of
//! claims and period, never a timer per request. A claim whose proxy died is renewed by nobody.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::metrics;
use crate::state::RoomState;
use crate::store::Room;

/// Claims sent to Redis in one call at most: a keeper's call stays short however many orders
/// are in flight.
const GROUP: usize = 256;

/// The shortest pause between two renewals, so a `claim_timeout` of a few milliseconds does not
/// turn the keeper into a busy loop (such a claim still holds while its request lasts: it is
/// renewed as often as this allows, and the check refuses a `claim_timeout` below the upstream's
/// timeout).
const MIN_PAUSE: Duration = Duration::from_millis(10);

type Held = Arc<Mutex<HashMap<u64, (String, String)>>>;

/// This proxy's claims in flight: user and claim id, by registration.
#[derive(Default)]
pub struct LiveClaims {
    held: Held,
    next: AtomicU64,
}

impl LiveClaims {
    /// Registers `user`'s claim `claim` until the returned [`Live`] is dropped.
    pub fn register(&self, user: &str, claim: &str) -> Live {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.held.lock().unwrap_or_else(|e| e.into_inner()).insert(id, (user.to_owned(), claim.to_owned()));
        Live { id, held: self.held.clone() }
    }

    fn snapshot(&self) -> Vec<(String, String)> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }
}

/// A claim in flight; dropping it (once its request is settled) stops its renewals.
pub struct Live {
    id: u64,
    held: Held,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

/// The background service that renews this proxy's claims in flight.
pub struct ClaimKeeper {
    state: Arc<RoomState>,
    room: Room,
}

impl ClaimKeeper {
    pub fn new(state: Arc<RoomState>, room: Room) -> ClaimKeeper {
        ClaimKeeper { state, room }
    }

    /// Renews every claim in flight for `claim_timeout`; the pause before the next renewal.
    async fn step(&self) -> Duration {
        let hold = self.state.settings().config.token.claim_timeout;
        let claims = self.state.claims().snapshot();
        for group in claims.chunks(GROUP) {
            let members: Vec<(&str, &str)> = group.iter().map(|(user, claim)| (user.as_str(), claim.as_str())).collect();
            if let Err(error) = self.room.keep_claims(&members, hold).await {
                // The claims still hold for what is left of their last renewal; the next step
                // tries again, and a claim that lapses meanwhile only lets a parallel order
                // meet Redis, which is away for it too.
                metrics::REDIS_ERRORS_TOTAL.inc();
                tracing::warn!(%error, claims = claims.len(), "could not renew the claims of orders in flight");
                break;
            }
        }
        (hold / 3).max(MIN_PAUSE)
    }
}

#[async_trait]
impl BackgroundService for ClaimKeeper {
    async fn start(&self, shutdown: ShutdownWatch) {
        crate::periodic::every_pause(shutdown, || self.step()).await
    }
}
