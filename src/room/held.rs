//! Held polls (contract section 13): a status poll from a user near the front waits for that
//! user's admission instead of being told to ask again in a few seconds, so READY reaches them
//! when it happens and orders reach the order API as the room admits, not in waves.
//!
//! Admission pops the line from its front (`ZPOPMIN`), so a user whose score is below the
//! front's score has left the line: admitted, or removed. The line watcher reads the front
//! every 10 ms anyway ([`crate::room::line`]); after each reading it hands the front to
//! [`HeldPolls::front`], which wakes exactly the held polls whose score it has passed. Each
//! woken poll then asks Redis once for the user's exact answer (READY with the token, or
//! NOT_IN_QUEUE when the place was removed), so a gap in the line never turns into a wrong
//! READY, and holding costs no Redis call per held user per tick.
//!
//! At most one poll per identity is held: a client that opens a second one while its first is
//! held (a retry behind a silent proxy, two tabs, a script) is answered at once instead, so one
//! identity cannot take many of the `queue.capacity` slots.
//!
//! Scores are compared as the non-negative floats Redis stores (arrival numbers, or a scheduled
//! event's drawn fractions below 1): for those, the order of the IEEE bit patterns is the
//! numeric order, so the held polls sit in a `BTreeMap` keyed by the bits and a reading wakes
//! a prefix of it.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use prometheus::IntGauge;

/// Where a held poll sits: its score's bits, then a number that tells apart two polls of the
/// same score.
type Seat = (u64, u64);

#[derive(Default)]
struct Inner {
    waiting: BTreeMap<Seat, oneshot::Sender<()>>,
    /// The identities with a poll held; each leaves with its [`Hold`].
    users: HashSet<Arc<str>>,
}

/// This proxy's held polls.
pub struct HeldPolls {
    inner: Arc<Mutex<Inner>>,
    /// The room's `waitroom_held_polls`.
    gauge: IntGauge,
    next: AtomicU64,
    count: Arc<AtomicUsize>,
    /// Set by a graceful stop: every held poll is answered now and none is held any more.
    stopping: AtomicBool,
}

impl HeldPolls {
    /// Polls held now.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn new(gauge: IntGauge) -> HeldPolls {
        HeldPolls { inner: Arc::default(), gauge, next: AtomicU64::new(0), count: Arc::default(), stopping: AtomicBool::new(false) }
    }

    /// Holds a poll for `user`, whose place has `score`, unless `limit` polls are held already,
    /// `user` has one held, or the proxy is stopping. The poll wakes when the line's front passes
    /// the score, or when every poll is woken (a closed room, a stop, a room that lost its
    /// numbers).
    pub fn hold(&self, user: &str, score: f64, limit: usize) -> Option<Hold> {
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        let user: Arc<str> = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if inner.users.contains(user) {
                return None;
            }
            // Counted first, so two polls racing for the last slot cannot both take it.
            if self.count.fetch_add(1, Ordering::AcqRel) >= limit {
                self.count.fetch_sub(1, Ordering::AcqRel);
                return None;
            }
            let user: Arc<str> = user.into();
            inner.users.insert(user.clone());
            user
        };
        self.gauge.inc();
        let mut hold = Hold {
            seat: None,
            woken: None,
            user,
            inner: self.inner.clone(),
            count: self.count.clone(),
            gauge: self.gauge.clone(),
        };
        hold.wait_for(score, self.next.fetch_add(1, Ordering::Relaxed));
        Some(hold)
    }

    /// Wakes the polls of every score below `first`, the front's score; with an empty line
    /// (`first` None), every poll: their users have all left the line.
    pub fn front(&self, first: Option<f64>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let woken = match first {
            None => std::mem::take(&mut inner.waiting),
            Some(first) => {
                let behind = inner.waiting.split_off(&(bits(first), 0));
                std::mem::replace(&mut inner.waiting, behind)
            }
        };
        drop(inner);
        for (_, wake) in woken {
            let _ = wake.send(());
        }
    }

    /// Wakes every held poll for an exact answer: the room was closed, or the line's numbers
    /// cannot be trusted any more.
    pub fn wake_all(&self) {
        self.front(None);
    }

    /// A graceful stop: every held poll is answered now, and no new one is held.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.wake_all();
    }

    /// Whether `user` has a poll held here now.
    pub fn holds(&self, user: &str) -> bool {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).users.contains(user)
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

}

/// The bits of a non-negative score, ordered as the scores are. A negative one (never stored
/// by waitroom) sorts first, so its poll is woken early and asks Redis: harmless. (`>` or `>=`:
/// 0.0's bits are 0 either way.)
fn bits(score: f64) -> u64 {
    if score > 0.0 { score.to_bits() } else { 0 }
}

/// One held poll. Dropping it (answered, timed out, or the client went away) frees its slot.
pub struct Hold {
    seat: Option<Seat>,
    woken: Option<oneshot::Receiver<()>>,
    user: Arc<str>,
    inner: Arc<Mutex<Inner>>,
    count: Arc<AtomicUsize>,
    gauge: IntGauge,
}

impl Hold {
    fn wait_for(&mut self, score: f64, id: u64) {
        let (wake, woken) = oneshot::channel();
        let seat = (bits(score), id);
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).waiting.insert(seat, wake);
        self.seat = Some(seat);
        self.woken = Some(woken);
    }

    /// Waits again, for a new score (the user entered again behind a removed place) or the same.
    pub fn rearm(&mut self, score: f64) {
        self.leave();
        let id = self.seat.map_or(0, |(_, id)| id);
        self.wait_for(score, id);
    }

    /// Resolves when the poll is woken; pending for ever once it has been (until re-armed).
    pub async fn woken(&mut self) {
        match self.woken.as_mut() {
            Some(woken) => {
                let _ = woken.await;
                self.woken = None;
            }
            None => std::future::pending().await,
        }
    }

    fn leave(&mut self) {
        if let Some(seat) = self.seat.take() {
            self.inner.lock().unwrap_or_else(|e| e.into_inner()).waiting.remove(&seat);
        }
        self.woken = None;
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seat) = self.seat.take() {
            inner.waiting.remove(&seat);
        }
        inner.users.remove(&self.user);
        drop(inner);
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn is_woken(hold: &mut Hold) -> bool {
        tokio::time::timeout(Duration::from_millis(20), hold.woken()).await.is_ok()
    }

    #[tokio::test]
    async fn the_front_wakes_exactly_the_polls_it_has_passed() {
        let held = HeldPolls::new(IntGauge::new("held", "test").unwrap());
        let mut polls: Vec<Hold> = [3.0, 5.0, 7.0].iter().map(|s| held.hold(&format!("u{s}"), *s, 10).unwrap()).collect();
        held.front(Some(5.0));
        assert!(is_woken(&mut polls[0]).await, "3 has left a line whose front is 5");
        assert!(!is_woken(&mut polls[1]).await, "5 is the front: still waiting");
        assert!(!is_woken(&mut polls[2]).await);
        held.front(Some(7.5));
        assert!(is_woken(&mut polls[1]).await && is_woken(&mut polls[2]).await);
    }

    #[tokio::test]
    async fn drawn_scores_below_one_keep_their_order() {
        let held = HeldPolls::new(IntGauge::new("held", "test").unwrap());
        let mut early = held.hold("early", 0.125, 10).unwrap();
        let mut late = held.hold("late", 0.75, 10).unwrap();
        held.front(Some(0.5));
        assert!(is_woken(&mut early).await);
        assert!(!is_woken(&mut late).await);
        held.front(None);
        assert!(is_woken(&mut late).await, "an empty line: everyone held has left it");
    }

    #[tokio::test]
    async fn at_most_the_limit_is_held_and_a_dropped_hold_frees_its_slot() {
        let held = HeldPolls::new(IntGauge::new("held", "test").unwrap());
        let first = held.hold("a", 1.0, 2).unwrap();
        let _second = held.hold("b", 2.0, 2).unwrap();
        assert!(held.hold("c", 3.0, 2).is_none());
        drop(first);
        assert_eq!(held.count.load(Ordering::Acquire), 1);
        assert!(held.inner.lock().unwrap().waiting.len() == 1, "the dropped poll left the map");
        let third = held.hold("c", 3.0, 2);
        assert!(third.is_some());
        drop(third);
        drop(_second);
        assert_eq!(held.count.load(Ordering::Acquire), 0, "every slot given back");
    }

    #[tokio::test]
    async fn one_poll_is_held_per_user_until_it_ends() {
        let held = HeldPolls::new(IntGauge::new("held", "test").unwrap());
        let first = held.hold("alice", 1.0, 10).unwrap();
        assert!(held.hold("alice", 1.0, 10).is_none(), "alice has a poll held");
        let bob = held.hold("bob", 2.0, 10);
        assert!(bob.is_some(), "another user is held");
        assert_eq!(held.count.load(Ordering::Acquire), 2, "a refused poll takes no slot");
        drop(first);
        let again = held.hold("alice", 1.0, 10);
        assert!(again.is_some(), "alice's ended hold let her poll be held again");
        drop((again, bob));
        assert!(held.inner.lock().unwrap().users.is_empty(), "every user left with their hold");
    }

    #[tokio::test]
    async fn a_stop_wakes_every_poll_and_holds_no_new_one() {
        let held = HeldPolls::new(IntGauge::new("held", "test").unwrap());
        let mut poll = held.hold("a", 9.0, 10).unwrap();
        assert!(!held.stopping());
        held.stop();
        assert!(held.stopping());
        assert!(is_woken(&mut poll).await);
        assert!(held.hold("b", 10.0, 10).is_none());
    }

    #[tokio::test]
    async fn a_rearmed_poll_waits_for_its_new_score() {
        let held = HeldPolls::new(IntGauge::new("held", "test").unwrap());
        let mut poll = held.hold("a", 2.0, 10).unwrap();
        held.front(Some(3.0));
        assert!(is_woken(&mut poll).await);
        poll.rearm(8.0);
        held.front(Some(4.0));
        assert!(!is_woken(&mut poll).await);
        held.front(Some(9.0));
        assert!(is_woken(&mut poll).await);
    }
}
