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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::metrics;
use crate::room::Room;
use crate::store::{RoomStore, Settle};

/// Claims sent to Redis in one call at most: a keeper's call stays short however many orders
/// are in flight.
const GROUP: usize = 256;

/// The shortest pause between two renewals, so a `claim_timeout` of a few milliseconds does not
/// turn the keeper into a busy loop (such a claim still holds while its request lasts: it is
/// renewed as often as this allows, and the check refuses a `claim_timeout` below the upstream's
/// timeout).
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// The background service that renews this proxy's claims in flight.
pub struct ClaimKeeper {
    room: Arc<Room>,
    store: RoomStore,
}

impl ClaimKeeper {
    pub fn new(room: Arc<Room>, store: RoomStore) -> ClaimKeeper {
        ClaimKeeper { room, store }
    }

    /// Renews every claim in flight for `claim_timeout`; the pause before the next renewal.
    async fn step(&self) -> Duration {
        let hold = self.room.settings().config.token.claim_timeout;
        let claims = self.room.claims().snapshot();
        for group in claims.chunks(GROUP) {
            let members: Vec<(&str, &str)> = group.iter().map(|(user, claim)| (user.as_str(), claim.as_str())).collect();
            if let Err(error) = self.store.keep_claims(&members, hold).await {
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

/// The first pause after a failed call; it doubles up to [`BACKOFF_MAX`]. While Redis is frozen
/// (rather than refusing connections) every call sent waits in its socket and runs when it
/// returns, so the cap also bounds those calls: one per `BACKOFF_MAX` of outage.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The one worker that sends this proxy's queued settles.
pub struct SettleRetrier {
    room: Arc<Room>,
}


impl SettleRetrier {
    /// Settles go through the room's own handle, whose connection carried the claims: on one
    /// connection Redis runs commands in the order sent, so a release queued after a claim that
    /// timed out finds that claim written if it ran (a reconnect in between can still reorder
    /// them; then `claim_timeout` ends the claim).
    pub fn new(room: Arc<Room>) -> SettleRetrier {
        SettleRetrier { room }
    }

    async fn run(&self) {
        let settles = self.room.settles();
        let mut backoff = BACKOFF_MIN;
        loop {
            let group = settles.take();
            if group.is_empty() {
                settles.woken().await;
                continue;
            }
            let members: Vec<Settle> = group.iter().map(|p| p.settle.clone()).collect();
            match self.room.store().settle_all(&members).await {
                Ok(deleted) => {
                    settles.done(group.len());
                    let spent = deleted.iter().filter(|d| **d).count();
                    self.room.metrics().tokens_consumed.inc_by(spent as u64);
                    tracing::info!(settled = members.len(), spent, left = settles.len(), "settled entry tokens after Redis came back");
                    backoff = BACKOFF_MIN;
                }
                Err(error) => {
                    metrics::REDIS_ERRORS_TOTAL.inc();
                    if let Some(held_back) = crate::logging::Warning::SettleRetryFailed.pass() {
                        tracing::warn!(%error, queued = settles.len() + group.len(), also_failed = held_back, "could not settle entry tokens yet; retrying");
                    }
                    settles.put_back(group);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }
}

#[async_trait]
impl BackgroundService for SettleRetrier {
    /// Runs through a graceful stop too: the requests still in flight then may queue settles, and
    /// the drain (`crate::lifecycle`) waits for the queue within `shutdown.grace` before it exits.
    async fn start(&self, _shutdown: ShutdownWatch) {
        self.run().await
    }
}
