//! Simulated users, the same for the demo's crowd (`crowd`) and the benchmark's (`wrbench crowd`):
//! what they do is defined once, here; what each tool watches and reports is its own, through a
//! [`Watcher`] and the [`Counters`].
//!
//! Every user behaves like a well-behaved client of the waiting page: it enters the line, polls
//! status exactly when `pollAfter` says (plus up to 10 % jitter, so that a crowd that arrived
//! together does not keep polling in lockstep), places its order as soon as it is READY, and backs
//! off for `Retry-After` when the room answers FULL or 503. Without a room ([`Visit::Direct`]) it
//! orders at once, as everybody does when nothing makes them wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinSet;
use tokio::time::{Instant, Interval, Sleep};

use crate::numbers::SplitMix64;
use crate::room::{QueueAnswer, Reply, Room};

/// Up to this fraction is added to every wait the proxy asks for.
const JITTER: f64 = 0.10;

/// Pause after a transport error or an answer the crowd does not understand, so a broken proxy is
/// not hammered in a tight loop.
const ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Where a user is, as far as the crowd knows. A user the proxy has admitted still counts as
/// waiting until its next poll sees READY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not in line: not arrived yet, or turned away (FULL, 503) and about to try again.
    Outside,
    Waiting,
    /// Holds a token; the order is on its way.
    Ready,
    Ordered,
}

/// What the users report, in one place: atomics, touched by thousands of tasks, read by whoever
/// prints or samples. The four gauges always sum to the crowd's size.
#[derive(Default)]
pub struct Counters {
    pub outside: AtomicI64,
    pub waiting: AtomicI64,
    pub ready: AtomicI64,
    pub ordered: AtomicI64,

    pub enters: AtomicU64,
    pub polls: AtomicU64,
    pub order_attempts: AtomicU64,
    /// 429 from enter, status or the order.
    pub full: AtomicU64,
    /// 503 from enter, status or the order.
    pub unavailable: AtomicU64,
    pub forbidden: AtomicU64,
    pub not_in_queue: AtomicU64,
    /// Orders the backend (or the proxy on its behalf) answered with anything but 2xx, 403, 429, 503.
    pub order_failures: AtomicU64,
    /// Transport errors, timeouts and answers the crowd does not understand.
    pub errors: AtomicU64,
}

impl Counters {
    /// A gauge's value (never negative, even while a move is half done).
    pub fn get(gauge: &AtomicI64) -> u64 {
        gauge.load(Ordering::Relaxed).max(0) as u64
    }

    pub fn total(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn gauge(&self, phase: Phase) -> &AtomicI64 {
        match phase {
            Phase::Outside => &self.outside,
            Phase::Waiting => &self.waiting,
            Phase::Ready => &self.ready,
            Phase::Ordered => &self.ordered,
        }
    }

    /// Moves one user between phases, keeping the four gauges summing to the crowd's size.
    fn move_to(&self, phase: &mut Phase, next: Phase) {
        if *phase != next {
            self.gauge(*phase).fetch_sub(1, Ordering::Relaxed);
            self.gauge(next).fetch_add(1, Ordering::Relaxed);
            *phase = next;
        }
    }
}

/// What one user lived through.
#[derive(Debug, Default, Clone)]
pub struct Journey {
    pub arrived: Option<Instant>,
    /// The first WAITING answer, and the `estimatedWaitTime` it promised.
    pub joined: Option<Instant>,
    pub first_eta: Option<u64>,
    /// When the user learned the READY it ordered with (a token lost to a 403 starts it again).
    pub ready: Option<Instant>,
    /// The order's 2xx.
    pub done: Option<Instant>,
    pub polls: u32,
}

/// What a tool wants to see of its users beyond the [`Counters`].
pub trait Watcher: Send + Sync + 'static {
    /// Every WAITING answer of user `index`; `first` is its first, right after it joined the line.
    fn waiting(
        &self,
        index: u32,
        user: &str,
        answer: &QueueAnswer,
        first: bool,
    ) -> impl Future<Output = ()> + Send;

    /// The user's order went through.
    fn ordered(&self, journey: &Journey);
}

/// A what-if beyond the contract's client: users at or before `positions` poll every `every`
/// instead of when `pollAfter` says, i.e. they learn READY within that long of their admission.
pub struct FrontPolling {
    pub positions: u64,
    pub every: Duration,
}

/// How the users reach the order API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Through the waiting room: enter, poll, order when READY.
    Room,
    /// No waiting room: everybody orders at once.
    Direct,
}

pub struct Crowd<W> {
    pub room: Room,
    pub counters: Counters,
    pub watcher: W,
    pub front: Option<FrontPolling>,
}

/// One user's own state while it shops.
struct Shopper {
    index: u32,
    name: String,
    journey: Arc<Mutex<Journey>>,
    phase: Phase,
    rng: SplitMix64,
}

/// What a user does next.
enum Step {
    Enter,
    Poll,
    Order(String),
}

impl<W: Watcher> Crowd<W> {
    pub fn new(room: Room, watcher: W) -> Crowd<W> {
        Crowd {
            room,
            counters: Counters::default(),
            watcher,
            front: None,
        }
    }

    /// Starts `users` users, named by `name`, arriving at `start` plus a repeatable random share of
    /// `spread`. Stopped by [`Users::next`]'s end (or by dropping the [`Users`]).
    pub fn spawn(
        self: &Arc<Self>,
        users: u32,
        start: Instant,
        spread: Duration,
        visit: Visit,
        name: impl Fn(u32) -> String,
    ) -> Users {
        self.counters
            .outside
            .fetch_add(i64::from(users), Ordering::Relaxed);
        let mut set = JoinSet::new();
        let mut journeys = Vec::with_capacity(users as usize);
        for index in 0..users {
            let arrival = start + spread.mul_f64(SplitMix64::new(u64::from(index)).unit());
            let journey = Arc::new(Mutex::new(Journey::default()));
            journeys.push(Arc::clone(&journey));
            let crowd = Arc::clone(self);
            let user = name(index);
            set.spawn(async move {
                tokio::time::sleep_until(arrival).await;
                lock(&journey).arrived = Some(Instant::now());
                match visit {
                    Visit::Room => crowd.shop(index, user, journey).await,
                    Visit::Direct => crowd.order_directly(user, journey).await,
                }
            });
        }
        Users {
            set,
            journeys,
            give_up: None,
            ctrl_c: Box::pin(async {
                let _ = tokio::signal::ctrl_c().await;
            }),
        }
    }

    /// One shopper, from arrival until the order went through. Never returns early on its own:
    /// the crowd's deadline aborts whoever is not done.
    async fn shop(&self, index: u32, name: String, journey: Arc<Mutex<Journey>>) {
        let mut me = Shopper {
            index,
            name,
            journey,
            phase: Phase::Outside,
            // Mixed with a constant so that user 0 does not start from the all-zero state.
            rng: SplitMix64::new(u64::from(index) ^ 0x5EED_C0DE_0000_0000),
        };
        let c = &self.counters;
        let mut step = Step::Enter;
        loop {
            step = match step {
                Step::Enter | Step::Poll => {
                    let reply = if matches!(step, Step::Poll) {
                        Counters::count(&c.polls);
                        lock(&me.journey).polls += 1;
                        self.room.status(&me.name).await
                    } else {
                        Counters::count(&c.enters);
                        self.room.enter(&me.name).await
                    };
                    match reply {
                        Ok(reply) if reply.status == 200 => {
                            self.on_queue_answer(&reply, &mut me).await
                        }
                        Ok(reply) => self.refused(&reply).await,
                        Err(_) => self.failed(Step::Enter).await,
                    }
                }
                Step::Order(token) => {
                    Counters::count(&c.order_attempts);
                    match self.room.order(&me.name, Some(&token)).await {
                        Ok(reply) if (200..300).contains(&reply.status) => {
                            return self.done(&me.journey, &mut me.phase);
                        }
                        Ok(reply) if reply.status == 403 => {
                            // The token is gone (expired, or spent by an earlier try whose answer
                            // we lost): the only way back is the end of the line.
                            Counters::count(&c.forbidden);
                            lock(&me.journey).ready = None;
                            c.move_to(&mut me.phase, Phase::Outside);
                            Step::Enter
                        }
                        // The token outlives a short outage; entering again hands it back
                        // (READY), and the latency keeps counting from the first READY.
                        Ok(reply) if matches!(reply.status, 429 | 503) => {
                            self.refused(&reply).await
                        }
                        Ok(_) => {
                            // The backend said no (or the proxy could not reach it): the token
                            // stays valid, so try the same order again shortly, as a shopper would.
                            Counters::count(&c.order_failures);
                            tokio::time::sleep(ERROR_PAUSE).await;
                            Step::Order(token)
                        }
                        Err(_) => self.failed(Step::Order(token)).await,
                    }
                }
            };
        }
    }

    /// A 200 from enter or status: wait as told, or go and order.
    async fn on_queue_answer(&self, reply: &Reply, me: &mut Shopper) -> Step {
        let c = &self.counters;
        let Some(answer) = reply.queue_answer() else {
            return self.failed(Step::Enter).await;
        };
        match (answer.status.as_str(), answer.token.clone()) {
            ("READY", Some(token)) => {
                lock(&me.journey).ready.get_or_insert_with(Instant::now);
                c.move_to(&mut me.phase, Phase::Ready);
                Step::Order(token)
            }
            ("WAITING", _) => {
                c.move_to(&mut me.phase, Phase::Waiting);
                let first = {
                    let mut j = lock(&me.journey);
                    j.ready = None;
                    let first = j.joined.is_none();
                    if first {
                        j.joined = Some(Instant::now());
                        j.first_eta = answer.estimated_wait_time;
                    }
                    first
                };
                self.watcher
                    .waiting(me.index, &me.name, &answer, first)
                    .await;
                let near_front = self
                    .front
                    .as_ref()
                    .filter(|f| answer.position.is_some_and(|p| p <= f.positions));
                // Exactly what the proxy asked for, plus jitter; never earlier. A pollAfter of 0
                // means at once: the proxy holds that poll until the user is admitted.
                let pause = match near_front {
                    Some(front) => front.every,
                    None => Duration::from_secs(answer.poll_after.unwrap_or(1)),
                };
                tokio::time::sleep(pause.mul_f64(1.0 + JITTER * me.rng.unit())).await;
                Step::Poll
            }
            // A scheduled event (contract section 14): in the pre-queue, poll status until the
            // draw turns it into a place in line; before the pre-queue, come back and enter.
            ("PREQUEUED" | "NOT_OPEN", _) => {
                let pause = Duration::from_secs(answer.poll_after.unwrap_or(1).max(1));
                tokio::time::sleep(pause.mul_f64(1.0 + JITTER * me.rng.unit())).await;
                if answer.status == "PREQUEUED" {
                    c.move_to(&mut me.phase, Phase::Waiting);
                    Step::Poll
                } else {
                    Step::Enter
                }
            }
            ("NOT_IN_QUEUE", _) => {
                // The place is gone (a room reset, or a token that expired before we looked).
                Counters::count(&c.not_in_queue);
                c.move_to(&mut me.phase, Phase::Outside);
                Step::Enter
            }
            _ => self.failed(Step::Enter).await,
        }
    }

    /// Anything but a 200 from enter or status (and a 429/503 from the order): stay away for
    /// `Retry-After`, then enter again, which keeps the place (or the token) if there still is
    /// one. The user's phase stays as it was: a refusal moves nobody in or out of the line.
    async fn refused(&self, reply: &Reply) -> Step {
        let c = &self.counters;
        let pause = match reply.status {
            429 => Some(&c.full),
            503 => Some(&c.unavailable),
            _ => None,
        };
        match pause {
            Some(counter) => {
                Counters::count(counter);
                tokio::time::sleep(reply.back_off()).await;
                Step::Enter
            }
            None => self.failed(Step::Enter).await,
        }
    }

    async fn failed(&self, then: Step) -> Step {
        Counters::count(&self.counters.errors);
        tokio::time::sleep(ERROR_PAUSE).await;
        then
    }

    fn done(&self, journey: &Mutex<Journey>, phase: &mut Phase) {
        let journey = {
            let mut j = lock(journey);
            j.done = Some(Instant::now());
            j.clone()
        };
        self.counters.move_to(phase, Phase::Ordered);
        self.watcher.ordered(&journey);
    }

    /// No room: order at once, and again after every failure, until it goes through.
    async fn order_directly(&self, user: String, journey: Arc<Mutex<Journey>>) {
        let c = &self.counters;
        let mut phase = Phase::Outside;
        lock(&journey).ready = Some(Instant::now());
        c.move_to(&mut phase, Phase::Ready);
        loop {
            Counters::count(&c.order_attempts);
            match self.room.order(&user, None).await {
                Ok(reply) if (200..300).contains(&reply.status) => {
                    return self.done(&journey, &mut phase);
                }
                Ok(_) => Counters::count(&c.order_failures),
                Err(_) => Counters::count(&c.errors),
            }
            tokio::time::sleep(ERROR_PAUSE).await;
        }
    }
}

/// A poisoned lock only means another task panicked mid-update; the record is still usable.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The running users.
pub struct Users {
    set: JoinSet<()>,
    /// Every user's record, in index order, also of those a deadline stopped.
    pub journeys: Vec<Arc<Mutex<Journey>>>,
    give_up: Option<Pin<Box<Sleep>>>,
    // Made once, not per call of `next`: a Ctrl-C must not fall between two calls' futures.
    ctrl_c: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Why the crowd stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    AllDone,
    GaveUp,
    Interrupted,
}

/// What [`Users::next`] saw first.
pub enum Next {
    Tick,
    End(Ending),
}

impl Users {
    /// Users not done by `at` count as lost.
    pub fn give_up_at(&mut self, at: Instant) {
        self.give_up = Some(Box::pin(tokio::time::sleep_until(at)));
    }

    /// Waits for the next tick or for the end: every user done, the deadline, or Ctrl-C. After an
    /// end the remaining users are stopped.
    pub async fn next(&mut self, tick: &mut Interval) -> Next {
        let give_up = async {
            match self.give_up.as_mut() {
                Some(sleep) => sleep.await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(give_up);
        let ending = loop {
            tokio::select! {
                joined = self.set.join_next() => match joined {
                    None => break Ending::AllDone,
                    Some(Err(e)) if e.is_panic() => eprintln!("crowd: a user task panicked: {e}"),
                    Some(_) => {}
                },
                _ = tick.tick() => return Next::Tick,
                _ = &mut give_up => break Ending::GaveUp,
                _ = &mut self.ctrl_c => break Ending::Interrupted,
            }
        };
        self.set.abort_all();
        Next::End(ending)
    }
}

/// A short tag that differs between runs, for user names: a second run against the same room
/// never finds the first run's places or tokens.
pub fn run_tag() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    // Mixed, so that the clock's low bits and the process id both reach the 32 bits kept.
    let seed = nanos as u64 ^ (u64::from(std::process::id()) << 32);
    format!("{:08x}", SplitMix64::new(seed).next_u64() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_move_one_user_at_a_time() {
        let c = Counters::default();
        c.outside.store(2, Ordering::Relaxed);
        let mut phase = Phase::Outside;
        c.move_to(&mut phase, Phase::Waiting);
        c.move_to(&mut phase, Phase::Waiting);
        c.move_to(&mut phase, Phase::Ordered);
        let gauges = [&c.outside, &c.waiting, &c.ready, &c.ordered].map(Counters::get);
        assert_eq!(gauges, [1, 0, 0, 1]);
    }
}
