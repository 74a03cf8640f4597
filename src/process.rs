//! The process: what belongs to the proxy rather than to any one room. Its settings (listeners,
//! Redis, identity, limits, admin, shutdown, reload), whether Redis answers, the requests in
//! flight that a graceful stop waits for, the request path's connection to Redis, and the rooms.
//!
//! Like pingora's `load_balancer` example hands a background service's task to the proxy, the
//! data flow is visible in [`crate::server::run`]: one `Process` is created at start-up and handed
//! to every service.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use crate::config::{Config, RoomConfig};
use crate::policy::Settings;
use crate::room::{Room, Rooms, DEFAULT};
use crate::store::{Redis, StoreError};

pub struct Process {
    /// The running configuration, swapped whole by a reload.
    settings: ArcSwap<Settings>,
    /// The request path's connection to Redis, shared by every room.
    redis: Redis,
    rooms: Rooms,
    /// Whether the last probe reached Redis (`/readyz`).
    redis_ready: AtomicBool,
    /// Requests being handled right now; a graceful stop waits for this to reach zero.
    in_flight: AtomicUsize,
}

impl Process {
    /// The process of `config` and its room. Opens nothing: connections are opened on first use,
    /// on the runtime that uses them.
    pub fn new(config: Config) -> Result<Arc<Process>, StoreError> {
        let settings = Arc::new(Settings::new(config));
        let redis = Redis::new(&settings.config.redis)?;
        let rooms = rooms_of(&redis, &settings, &[]);
        Ok(Arc::new(Process {
            settings: ArcSwap::new(settings),
            redis,
            rooms: Rooms::new(rooms),
            redis_ready: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        }))
    }

    /// A snapshot of the running settings (see [`Room::settings`] for a room's).
    pub fn settings(&self) -> Guard<Arc<Settings>> {
        self.settings.load()
    }

    /// The same snapshot as one to keep across an await (see [`Room::snapshot`]).
    pub fn settings_now(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// Applies reloaded settings to the process and to every room.
    pub fn replace_settings(&self, settings: Settings) {
        let settings = Arc::new(settings);
        let running = self.rooms.all();
        let next = rooms_of(&self.redis, &settings, &running);
        let same_rooms = next.len() == running.len() && next.iter().zip(running.iter()).all(|(a, b)| Arc::ptr_eq(a, b));
        if same_rooms {
            self.rooms.reroute();
        } else {
            self.rooms.replace(next);
        }
        self.settings.store(settings);
    }

    pub fn redis(&self) -> &Redis {
        &self.redis
    }

    pub fn rooms(&self) -> &Rooms {
        &self.rooms
    }

    pub fn redis_ready(&self) -> bool {
        self.redis_ready.load(Ordering::Acquire)
    }

    /// Records whether Redis answered the last probe; returns what the probe before said.
    pub fn set_redis_ready(&self, ready: bool) -> bool {
        self.redis_ready.swap(ready, Ordering::AcqRel)
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

/// The rooms `settings` configures, in its order: without `rooms`, the room `default` running the
/// top level. A room already running under a configured name is kept with its new settings, so
/// its line, held polls and background work go on through a reload; a new name is a new room,
/// on its own keys (whose state in Redis, if the room ran before, it takes up again).
fn rooms_of(redis: &Redis, settings: &Arc<Settings>, running: &[Arc<Room>]) -> Vec<Arc<Room>> {
    let configured: Vec<(&str, Option<&str>, Arc<Settings>)> = if settings.config.rooms.is_empty() {
        vec![(DEFAULT, None, settings.clone())]
    } else {
        let each = |room: &'_ RoomConfig| Arc::new(Settings::new(room.config.clone()));
        settings.config.rooms.iter().map(|room| (room.name.as_str(), room.host.as_deref(), each(room))).collect()
    };
    configured
        .into_iter()
        .map(|(name, host, room_settings)| match running.iter().find(|room| room.name() == name) {
            Some(room) => {
                room.replace_settings(room_settings);
                room.clone()
            }
            None => Room::new(name, host, room_settings, redis.room(redis.room_keys(name))),
        })
        .collect()
}

/// A request in flight; dropping it (with the request's context) ends it.
pub struct InFlight(Arc<Process>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(batch: u32) -> Arc<Process> {
        Process::new(Config::parse(&format!("upstream: 127.0.0.1:1\nadmission: {{batch_size: {batch}}}")).unwrap()).unwrap()
    }

    #[test]
    fn two_processes_keep_their_own_state() {
        let (a, b) = (process(3), process(7));
        let guard = a.request_started();
        assert_eq!((a.in_flight(), b.in_flight()), (1, 0));
        drop(guard);
        assert_eq!(a.in_flight(), 0);
        a.set_redis_ready(true);
        assert!(a.redis_ready() && !b.redis_ready());
    }

    #[test]
    fn a_reload_reaches_the_room() {
        let process = process(3);
        let reloaded = Config::parse("upstream: 127.0.0.1:1\nadmission: {batch_size: 9}").unwrap();
        process.replace_settings(Settings::new(reloaded));
        let room = process.rooms().default_or_only().unwrap();
        assert_eq!(room.name(), DEFAULT);
        assert_eq!(room.settings().policy.rules.batch_size, 9);
        assert_eq!(process.settings().policy.rules.batch_size, 9);
    }
}
