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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::logging::Limited;
use crate::metrics;
use crate::state::RoomState;
use crate::store::{Room, Settle, GROUP_MAX};

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

/// Settles waiting for Redis at most. Each is a few hundred bytes: the queue stays under a couple
/// of MB however long the outage, and when Redis returns it costs 128 calls of [`GROUP_MAX`].
pub const RETRY_BOUND: usize = 4096;

/// The first pause after a failed call; it doubles up to [`BACKOFF_MAX`]. While Redis is frozen
/// (rather than refusing connections) every call sent waits in its socket and runs when it
/// returns, so the cap also bounds those calls: one per `BACKOFF_MAX` of outage.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Why a settle is retried, from the most to the least worth keeping when the queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Retry {
    /// An order that succeeded (or whose outcome is unknown and spends): until it reaches Redis
    /// only this proxy refuses the token, and every other proxy of the room would take it again.
    Spend,
    /// A claim the upstream's answer released: left alone it refuses the user's retries with 409
    /// until `claim_timeout`.
    Release,
    /// A claim that met a Redis error may have been written or not (a script that timed out may
    /// still run, a frozen Redis runs it when it returns); most such claims are of made-up or
    /// stale tokens and hold nothing. Worth one try, and the first to go when the queue is full:
    /// `claim_timeout` ends one that did run anyway.
    MaybeClaimed,
}

struct Pending {
    settle: Settle,
    why: Retry,
    /// Past it the settle changes nothing: the claim or the token has expired by itself.
    until: Instant,
}

/// This proxy's settles that met an outage, oldest first.
#[derive(Default)]
pub struct Settles {
    queue: Mutex<VecDeque<Pending>>,
    wake: tokio::sync::Notify,
    /// Settles taken by the worker and not yet answered.
    out: std::sync::atomic::AtomicUsize,
}

static QUEUE_FULL: Limited = Limited::every(Duration::from_secs(10));

impl Settles {
    fn queue(&self) -> MutexGuard<'_, VecDeque<Pending>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `settle` for the worker, to be sent while `live` lasts. When the queue is full the
    /// settle least worth keeping goes (see [`Retry`]), the oldest of its kind: the nearest to
    /// expiring by itself.
    pub fn retry(&self, settle: Settle, why: Retry, live: Duration) {
        let pending = Pending { settle, why, until: Instant::now() + live };
        let dropped = {
            let mut queue = self.queue();
            queue.push_back(pending);
            make_room(&mut queue, RETRY_BOUND)
        };
        if let Some(dropped) = dropped {
            if let Some(held_back) = QUEUE_FULL.pass() {
                tracing::error!(
                    ?dropped,
                    also_dropped = held_back,
                    bound = RETRY_BOUND,
                    "the queue of settles waiting for Redis is full: one was dropped"
                );
            }
        }
        self.wake.notify_one();
    }

    /// Settles queued now.
    pub fn len(&self) -> usize {
        self.queue().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// No spend queued and no call out: what a graceful stop waits for. Releases are not waited
    /// for: their claims end with `claim_timeout` anyway, and an outage's refused requests would
    /// otherwise hold every stop for the whole grace period.
    pub fn settled(&self) -> bool {
        self.out.load(Ordering::Acquire) == 0 && !self.queue().iter().any(|p| p.why == Retry::Spend)
    }

    /// The next call's settles, oldest first, the expired ones dropped.
    fn take(&self) -> Vec<Pending> {
        let now = Instant::now();
        let mut queue = self.queue();
        queue.retain(|p| p.until > now);
        let n = queue.len().min(GROUP_MAX);
        self.out.fetch_add(n, Ordering::AcqRel);
        queue.drain(..n).collect()
    }

    /// Puts back a call's settles that failed, in front, as they were.
    fn put_back(&self, mut group: Vec<Pending>) {
        let n = group.len();
        let mut queue = self.queue();
        while let Some(pending) = group.pop() {
            queue.push_front(pending);
        }
        while make_room(&mut queue, RETRY_BOUND).is_some() {}
        self.out.fetch_sub(n, Ordering::AcqRel);
    }

    /// A call's settles reached Redis.
    fn done(&self, n: usize) {
        self.out.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Drops one settle if `queue` holds more than `bound`: the oldest of the kind least worth
/// keeping. Returns the kind dropped.
fn make_room(queue: &mut VecDeque<Pending>, bound: usize) -> Option<Retry> {
    if queue.len() <= bound {
        return None;
    }
    let least = queue.iter().map(|p| p.why).max()?;
    let at = queue.iter().position(|p| p.why == least)?;
    queue.remove(at).map(|p| p.why)
}

/// The one worker that sends this proxy's queued settles.
pub struct SettleRetrier {
    state: Arc<RoomState>,
    room: Arc<Room>,
}

static RETRY_FAILED: Limited = Limited::every(Duration::from_secs(10));

impl SettleRetrier {
    /// `room` is the proxy's own handle, whose connection carried the claims: on one connection
    /// Redis runs commands in the order sent, so a release queued after a claim that timed out
    /// finds that claim written if it ran (a reconnect in between can still reorder them; then
    /// `claim_timeout` ends the claim).
    pub fn new(state: Arc<RoomState>, room: Arc<Room>) -> SettleRetrier {
        SettleRetrier { state, room }
    }

    async fn run(&self) {
        let settles = self.state.settles();
        let mut backoff = BACKOFF_MIN;
        loop {
            let group = settles.take();
            if group.is_empty() {
                settles.wake.notified().await;
                continue;
            }
            let members: Vec<Settle> = group.iter().map(|p| p.settle.clone()).collect();
            match self.room.settle_all(&members).await {
                Ok(deleted) => {
                    settles.done(group.len());
                    let spent = deleted.iter().filter(|d| **d).count();
                    metrics::TOKENS_CONSUMED_TOTAL.inc_by(spent as u64);
                    tracing::info!(settled = members.len(), spent, left = settles.len(), "settled entry tokens after Redis came back");
                    backoff = BACKOFF_MIN;
                }
                Err(error) => {
                    metrics::REDIS_ERRORS_TOTAL.inc();
                    if let Some(held_back) = RETRY_FAILED.pass() {
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
    /// the drain (crate::lifecycle) waits for the queue within `shutdown.grace` before it exits.
    async fn start(&self, _shutdown: ShutdownWatch) {
        self.run().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(user: &str, why: Retry) -> Pending {
        Pending { settle: Settle::new(user, "t", "c", why == Retry::Spend), why, until: Instant::now() + Duration::from_secs(60) }
    }

    fn users(queue: &VecDeque<Pending>) -> Vec<String> {
        queue.iter().map(|p| format!("{:?}", p.settle).split('"').nth(1).unwrap().to_owned()).collect()
    }

    #[test]
    fn a_full_queue_drops_the_oldest_of_the_kind_least_worth_keeping() {
        let mut queue: VecDeque<Pending> = [
            pending("s1", Retry::Spend),
            pending("r1", Retry::Release),
            pending("m1", Retry::MaybeClaimed),
            pending("r2", Retry::Release),
            pending("m2", Retry::MaybeClaimed),
        ]
        .into_iter()
        .collect();
        assert_eq!(make_room(&mut queue, 5), None);
        assert_eq!(make_room(&mut queue, 4), Some(Retry::MaybeClaimed));
        assert_eq!(make_room(&mut queue, 3), Some(Retry::MaybeClaimed));
        assert_eq!(make_room(&mut queue, 2), Some(Retry::Release));
        assert_eq!(users(&queue), ["s1", "r2"]);
        queue.push_back(pending("s2", Retry::Spend));
        assert_eq!(make_room(&mut queue, 2), Some(Retry::Release));
        assert_eq!(make_room(&mut queue, 1), Some(Retry::Spend));
        assert_eq!(users(&queue), ["s2"]);
    }

    #[test]
    fn the_queue_never_holds_more_than_its_bound() {
        let settles = Settles::default();
        for i in 0..RETRY_BOUND + 100 {
            let why = [Retry::Spend, Retry::Release, Retry::MaybeClaimed][i % 3];
            settles.retry(Settle::new(&format!("u{i}"), "t", "c", why == Retry::Spend), why, Duration::from_secs(60));
        }
        assert_eq!(settles.len(), RETRY_BOUND);
        let group = settles.take();
        assert_eq!(group.len(), GROUP_MAX);
        assert!(!settles.settled());
        settles.put_back(group);
        assert_eq!(settles.len(), RETRY_BOUND);
        let group = settles.take();
        settles.done(group.len());
        assert_eq!(settles.len(), RETRY_BOUND - GROUP_MAX);
        assert!(!settles.settled(), "spends are queued");
        let releases = Settles::default();
        releases.retry(Settle::new("u", "t", "c", false), Retry::MaybeClaimed, Duration::from_secs(60));
        assert!(releases.settled(), "a stop waits for releases");
    }

    #[test]
    fn expired_settles_are_never_sent() {
        let settles = Settles::default();
        settles.retry(Settle::new("u", "t", "c", true), Retry::Spend, Duration::ZERO);
        settles.retry(Settle::new("v", "t", "c", true), Retry::Spend, Duration::from_secs(60));
        assert_eq!(settles.take().len(), 1);
    }
}
