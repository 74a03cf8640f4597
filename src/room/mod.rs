//! A room: its compiled policy and keys, and what this proxy keeps of it between requests (the
//! line, the pace, held polls, the state, the event, spent tokens, claims in flight). A room is
//! created from its settings and a handle on its keys in Redis; the process holds its rooms in a
//! [`Rooms`] registry, which the proxy and the admin API look rooms up in, and the background
//! work that keeps a room fresh (`crate::services`) runs for as long as the registry holds it.
//!
//! Nothing here is a process-wide static (only the Prometheus metrics are), so a test can build
//! two rooms in one process.

pub mod claims;
pub mod event;
pub mod held;
pub mod line;
pub mod mode;
pub mod pace;
pub mod quiet;
pub mod spent;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption, Guard};

use crate::config::Phase;
use crate::metrics::RoomMetrics;
use crate::policy::Settings;
use crate::store::{Keys, RoomStore};
use claims::{LiveClaims, Settles};
use event::EventState;
use held::HeldPolls;
use line::LocalLine;
use mode::Mode;
use pace::{LatencyHistogram, Pacing, RoomView};
use spent::SpentTokens;

pub use crate::config::DEFAULT_ROOM as DEFAULT;

pub struct Room {
    name: String,
    /// The only Host this room serves (lowercase, no port); `None`: every host. Requests read
    /// it from [`Rooms::routes`].
    host: Option<String>,
    /// The request path's handle on the room's keys (the background work has its own, on the
    /// runtime it runs on).
    store: Arc<RoomStore>,
    /// The room's configuration and its compiled policy, swapped whole by a reload.
    settings: ArcSwap<Settings>,
    /// The room's pace as the room watcher last read it (used only while the room listens).
    view: ArcSwapOption<RoomView>,
    /// Protected upstream latencies seen since this proxy's last report to the room.
    latencies: LatencyHistogram,
    /// This proxy's view of the line, for polls answered without Redis.
    line: LocalLine,
    /// Tokens spent through this proxy, refused even if Redis loses the spend.
    spent: SpentTokens,
    /// The room's state as this proxy last read it from Redis (see `crate::services::control`).
    mode: AtomicU8,
    /// The scheduled event as this proxy last read it from Redis.
    event: EventState,
    /// Status polls held open until their user is admitted (contract section 13).
    held: HeldPolls,
    /// Claims of this proxy's orders in flight, renewed while their request lasts.
    claims: LiveClaims,
    /// Settles that met an outage, waiting for Redis (one bounded queue per room and proxy).
    settles: Settles,
    /// The room's series, labelled with its name.
    metrics: RoomMetrics,
    /// Whether the room is in use on this proxy, and the wake of its background work.
    activity: quiet::Activity,
}

impl Room {
    pub fn new(name: &str, host: Option<&str>, settings: Arc<Settings>, store: RoomStore) -> Arc<Room> {
        let metrics = RoomMetrics::new(name);
        metrics.admission_rate.set(settings.policy.configured_rate());
        metrics.admission_batch.set(settings.policy.rules.batch_size as i64);
        Arc::new(Room {
            name: name.to_owned(),
            host: host.map(str::to_owned),
            store: Arc::new(store),
            settings: ArcSwap::new(settings),
            view: ArcSwapOption::empty(),
            latencies: LatencyHistogram::new(),
            line: LocalLine::default(),
            spent: SpentTokens::default(),
            mode: AtomicU8::new(Mode::Open.to_u8()),
            event: EventState::default(),
            held: HeldPolls::new(metrics.held_polls.clone()),
            claims: LiveClaims::default(),
            settles: Settles::default(),
            metrics,
            activity: quiet::Activity::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn metrics(&self) -> &RoomMetrics {
        &self.metrics
    }

    pub fn activity(&self) -> &quiet::Activity {
        &self.activity
    }

    /// Whether the room is quiet on this proxy (see [`quiet`]): its background work looks once
    /// a second instead of every few milliseconds.
    pub fn is_quiet(&self) -> bool {
        if !self.activity.unused() || !self.held.is_empty() || !self.claims.is_empty() || !self.settles.is_empty() {
            return false;
        }
        let settings = self.settings();
        let Some(event) = settings.config.event.as_ref() else { return true };
        // No phase may begin before the next quiet look and the one after it.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let soon = now + 2 * quiet::QUIET_EVERY.as_millis() as i64;
        event.phase_at(now) == event.phase_at(soon)
    }

    /// Waits `busy`, or while the room is quiet, `quiet_every` or until it wakes.
    pub async fn pause(&self, busy: std::time::Duration, quiet_every: std::time::Duration) {
        self.activity.pause(busy, quiet_every, || self.is_quiet()).await
    }

    /// The request path's handle on the room's data in Redis.
    pub fn store(&self) -> &Arc<RoomStore> {
        &self.store
    }

    pub fn keys(&self) -> &Arc<Keys> {
        self.store.keys_shared()
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

    pub fn replace_settings(&self, settings: Arc<Settings>) {
        self.metrics.admission_rate.set(settings.policy.configured_rate());
        self.settings.store(settings);
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

    /// A protected upstream latency, for the adaptive controller.
    pub fn record_latency(&self, latency: Duration) {
        let target = self.settings().policy.controller.map(|c| c.target_p95);
        self.latencies.record(latency, target);
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

    /// The configured event's phase now, by Redis's clock as this proxy last read it (this
    /// machine's clock before the first reading); `None` without an event. For views of the room
    /// (`GET /admin/room`'s `event`) that must not wait on Redis.
    pub fn event_phase(&self) -> Option<Phase> {
        let settings = self.settings();
        let event = settings.config.event.as_ref()?;
        if let Some(snapshot) = self.event.snapshot() {
            return Some(snapshot.phase(event));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Some(event.phase_at(now))
    }
}

/// The process's rooms, in configuration order. The proxy and the admin API look rooms up here
/// for every request; a reload replaces the list, and the background work follows it (see
/// `crate::services::RoomWork`).
pub struct Rooms {
    list: ArcSwap<Vec<Arc<Room>>>,
    routes: ArcSwap<Vec<Route>>,
    changed: tokio::sync::watch::Sender<()>,
}

/// A room as requests are routed to it: its settings and host as of the last (re)load, one
/// snapshot of every room for a request to look through (one load for the request, rather than
/// one per room and look: see `crate::proxy::route`).
pub struct Route {
    pub room: Arc<Room>,
    pub settings: Arc<Settings>,
    pub host: Option<String>,
}

fn routes_of(rooms: &[Arc<Room>]) -> Vec<Route> {
    rooms.iter().map(|room| Route { room: room.clone(), settings: room.snapshot(), host: room.host.clone() }).collect()
}

impl Rooms {
    pub fn new(rooms: Vec<Arc<Room>>) -> Rooms {
        let routes = ArcSwap::from_pointee(routes_of(&rooms));
        Rooms { list: ArcSwap::from_pointee(rooms), routes, changed: tokio::sync::watch::Sender::new(()) }
    }

    /// Every room now.
    pub fn all(&self) -> Arc<Vec<Arc<Room>>> {
        self.list.load_full()
    }

    /// Every room as requests are routed to it now, in the configuration's order.
    pub fn routes(&self) -> arc_swap::Guard<Arc<Vec<Route>>> {
        self.routes.load()
    }

    /// Takes up the settings the rooms hold now: after a reload changed them.
    pub fn reroute(&self) {
        self.routes.store(Arc::new(routes_of(&self.list.load())));
    }

    pub fn get(&self, name: &str) -> Option<Arc<Room>> {
        self.list.load().iter().find(|room| room.name == name).cloned()
    }

    /// The room `default`, or the only room when there is one: what the unnamed admin paths and
    /// commands act on.
    pub fn default_or_only(&self) -> Option<Arc<Room>> {
        let list = self.list.load();
        match list.as_slice() {
            [only] => Some(only.clone()),
            rooms => rooms.iter().find(|room| room.name == DEFAULT).cloned(),
        }
    }

    /// Replaces the rooms; the background work starts and stops rooms to match.
    pub fn replace(&self, rooms: Vec<Arc<Room>>) {
        self.routes.store(Arc::new(routes_of(&rooms)));
        self.list.store(Arc::new(rooms));
        self.changed.send_replace(());
    }

    /// Changes whenever [`Rooms::replace`] is called.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::Redis;

    fn room(name: &str, batch: u32) -> Arc<Room> {
        let config = Config::parse(&format!("upstream: 127.0.0.1:1\nadmission: {{batch_size: {batch}}}")).unwrap();
        let redis = Redis::new(&config.redis).unwrap();
        Room::new(name, None, Arc::new(Settings::new(config)), redis.room(redis.default_keys()))
    }

    #[test]
    fn two_rooms_in_one_process_keep_their_own_state() {
        let (a, b) = (room("a", 3), room("b", 7));
        a.set_mode(Mode::Paused);
        assert!(a.paused() && !b.paused());
        assert_eq!(a.settings().policy.rules.batch_size, 3);
        assert_eq!(b.settings().policy.rules.batch_size, 7);
    }

    #[test]
    fn a_room_judges_its_latencies_against_its_own_target_only_when_it_adapts() {
        let ms = Duration::from_millis;
        let fixed = room("fixed", 5);
        let config = Config::parse(
            "upstream: 127.0.0.1:1\nadmission: {batch_size: 5, adaptive: {target_p95: 250ms}}",
        )
        .unwrap();
        let redis = Redis::new(&config.redis).unwrap();
        let adaptive = Room::new("adaptive", None, Arc::new(Settings::new(config)), redis.room(redis.default_keys()));
        for r in [&fixed, &adaptive] {
            for latency in [ms(100), ms(250), ms(251), ms(900)] {
                r.record_latency(latency);
            }
        }
        let (f, a) = (fixed.latencies().drain(), adaptive.latencies().drain());
        assert_eq!((f.count(), f.judged, f.over_target), (4, 0, 0), "nothing to judge against");
        assert_eq!((a.count(), a.judged, a.over_target), (4, 4, 2), "above 250 ms: 251 and 900");
    }

    #[test]
    fn the_registry_finds_rooms_by_name_and_tells_of_changes() {
        let rooms = Rooms::new(vec![room("sneakers", 1)]);
        assert_eq!(rooms.default_or_only().map(|r| r.name().to_owned()).as_deref(), Some("sneakers"), "the only room");
        let changes = rooms.watch();
        rooms.replace(vec![room("sneakers", 1), room(DEFAULT, 2), room("console", 3)]);
        assert!(changes.has_changed().unwrap());
        assert_eq!(rooms.default_or_only().map(|r| r.name().to_owned()).as_deref(), Some(DEFAULT));
        assert_eq!(rooms.get("console").map(|r| r.settings().policy.rules.batch_size), Some(3));
        assert!(rooms.get("nope").is_none());
        rooms.replace(vec![room("a", 1), room("b", 1)]);
        assert!(rooms.default_or_only().is_none(), "two rooms, none named default");
    }
}
