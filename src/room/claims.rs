//! What a room keeps of its orders in flight on this proxy: the claims to renew while their
//! requests last, and the settles that met an outage, waiting for Redis. The services that act on
//! them are in `crate::services::claims`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::store::{Settle, GROUP_MAX};

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

    pub fn snapshot(&self) -> Vec<(String, String)> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// No claim in flight.
    pub fn is_empty(&self) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
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

/// Settles waiting for Redis at most. Each is a few hundred bytes: the queue stays under a couple
/// of MB however long the outage, and when Redis returns it costs 128 calls of [`GROUP_MAX`].
pub const RETRY_BOUND: usize = 4096;

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

pub struct Pending {
    pub settle: Settle,
    pub why: Retry,
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
            if let Some(held_back) = crate::logging::Warning::SettleQueueFull.pass() {
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

    /// Waits until a settle is queued.
    pub async fn woken(&self) {
        self.wake.notified().await
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
    pub fn take(&self) -> Vec<Pending> {
        let now = Instant::now();
        let mut queue = self.queue();
        queue.retain(|p| p.until > now);
        let n = queue.len().min(GROUP_MAX);
        self.out.fetch_add(n, Ordering::AcqRel);
        queue.drain(..n).collect()
    }

    /// Puts back a call's settles that failed, in front, as they were.
    pub fn put_back(&self, mut group: Vec<Pending>) {
        let n = group.len();
        let mut queue = self.queue();
        while let Some(pending) = group.pop() {
            queue.push_front(pending);
        }
        while make_room(&mut queue, RETRY_BOUND).is_some() {}
        self.out.fetch_sub(n, Ordering::AcqRel);
    }

    /// A call's settles reached Redis.
    pub fn done(&self, n: usize) {
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
