//! The one room state of a process, created at start-up and handed to every service: the proxy,
//! the admission ticker, the watchers, the operator endpoints, the reloader and the drain.
//!
//! Like pingora's `load_balancer` example hands a background service's task to the proxy, the
//! data flow is visible in [`crate::server::run`]: nothing here is a process-wide static (only
//! the Prometheus metrics are), so a test can build two rooms in one process.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption, Guard};

use crate::admission::{LatencyHistogram, Pacing, RoomView};
use crate::claims::{LiveClaims, Settles};
use crate::config::Config;
use crate::control::Mode;
use crate::event::EventState;
use crate::hold::HeldPolls;
use crate::line::LocalLine;
use crate::policy::Settings;
use crate::spent::SpentTokens;

pub struct RoomState {
    /// The running configuration and its compiled policy, swapped whole by a reload.
    settings: ArcSwap<Settings>,
    /// The room's pace as the room watcher last read it (used only while the room listens).
    view: ArcSwapOption<RoomView>,
    /// Protected upstream latencies seen since this proxy's last report to the room.
    latencies: LatencyHistogram,
    /// Whether the last probe reached Redis (`/readyz`).
    redis_ready: AtomicBool,
    /// Requests being handled right now; a graceful stop waits for this to reach zero.
    in_flight: AtomicUsize,
    /// This proxy's view of the line, for polls answered without Redis.
    line: LocalLine,
    /// Tokens spent through this proxy, refused even if Redis loses the spend.
    spent: SpentTokens,
    /// The room's state as this proxy last read it from Redis (see `crate::control`).
    mode: AtomicU8,
    /// The scheduled event as this proxy last read it from Redis.
    event: EventState,
    /// Status polls held open until their user is admitted (contract section 13).
    held: HeldPolls,
    /// Claims of this proxy's orders in flight, renewed while their request lasts.
    claims: LiveClaims,
    /// Settles that met an outage, waiting for Redis (one bounded queue per proxy).
    settles: Settles,
}

impl RoomState {
    pub fn new(config: Config) -> Arc<RoomState> {
        Arc::new(RoomState {
            settings: ArcSwap::from_pointee(Settings::new(config)),
            view: ArcSwapOption::empty(),
            latencies: LatencyHistogram::new(),
            redis_ready: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            line: LocalLine::default(),
            spent: SpentTokens::default(),
            mode: AtomicU8::new(Mode::Open.to_u8()),
            event: EventState::default(),
            held: HeldPolls::default(),
            claims: LiveClaims::default(),
            settles: Settles::default(),
        })
    }

    /// A snapshot of the running settings: take one per request or tick, so a reload never
    /// changes the rules half way through.
    pub fn settings(&self) -> Guard<Arc<Settings>> {
        self.settings.load()
    }

    /// The same snapshot as one to keep across an await: a `Guard` held there pins one of
    /// arc_swap's few per-thread slots (and every other load on the thread falls back to a slower
    /// path) for as long as the request waits on Redis or a held poll.
    pub fn snapshot(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    pub fn replace_settings(&self, settings: Settings) {
        self.settings.store(Arc::new(settings));
    }

    /// The pace estimates are given at under `settings`: the room's measured one when the room
    /// listens and the watcher has read it, else the configured one.
    pub fn pacing<'a>(&self, settings: &'a Settings) -> Pacing<'a> {
        let view = if settings.policy.listens { self.view.load_full() } else { None };
        Pacing::new(&settings.policy, view)
    }

    /// Publishes what the room watcher read.
    pub fn publish_view(&self, view: RoomView) {
        self.view.store(Some(Arc::new(view)));
    }

    pub fn latencies(&self) -> &LatencyHistogram {
        &self.latencies
    }

    pub fn line(&self) -> &LocalLine {
        &self.line
    }

    pub fn spent(&self) -> &SpentTokens {
        &self.spent
    }

    pub fn event(&self) -> &EventState {
        &self.event
    }

    pub fn claims(&self) -> &LiveClaims {
        &self.claims
    }

    pub fn settles(&self) -> &Settles {
        &self.settles
    }

    pub fn held(&self) -> &HeldPolls {
        &self.held
    }

    pub fn redis_ready(&self) -> bool {
        self.redis_ready.load(Ordering::Acquire)
    }

    /// Records whether Redis answered the last probe; returns what the probe before said.
    pub fn set_redis_ready(&self, ready: bool) -> bool {
        self.redis_ready.swap(ready, Ordering::AcqRel)
    }

    pub fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Acquire))
    }

    /// Whether admission is paused (section 15): waiting users are then told no estimate.
    pub fn paused(&self) -> bool {
        self.mode() == Mode::Paused
    }

    /// Records the room's state as read from Redis; returns the one held before.
    pub fn set_mode(&self, mode: Mode) -> Mode {
        Mode::from_u8(self.mode.swap(mode.to_u8(), Ordering::AcqRel))
    }

    /// Counts a request as in flight until the returned guard is dropped.
    pub fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// A request in flight; dropping it (with the request's context) ends it.
pub struct InFlight(Arc<RoomState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_rooms_in_one_process_keep_their_own_state() {
        let config = |batch: u32| {
            Config::parse(&format!("upstream: 127.0.0.1:1\nadmission: {{batch_size: {batch}}}")).unwrap()
        };
        let (a, b) = (RoomState::new(config(3)), RoomState::new(config(7)));
        let guard = a.request_started();
        assert_eq!((a.in_flight(), b.in_flight()), (1, 0));
        drop(guard);
        assert_eq!(a.in_flight(), 0);
        a.set_redis_ready(true);
        assert!(a.redis_ready() && !b.redis_ready());
        assert_eq!(a.settings().policy.rules.batch_size, 3);
        assert_eq!(b.settings().policy.rules.batch_size, 7);
    }
}
