//! The background work that keeps each room fresh on this proxy: admission ticks and adaptive
//! reports ([`admission`]), the line watcher ([`line`]), the state and event watchers
//! ([`control`], [`event`]), the room watcher with readiness and gauges ([`watch`]), and the
//! keeper and retrier of orders in flight ([`claims`]).
//!
//! All rooms' work runs on one runtime (one pingora background service, [`RoomWork`]) and shares
//! its one connection to Redis, rather than a runtime thread and a connection per task and room.
//! A room's tasks are owned by its entry in [`RoomWork`]: a room the registry no longer holds has
//! its tasks aborted at once, and a room added to it has them started, so a reload can add and
//! remove rooms while the process runs.

pub mod admission;
pub mod claims;
pub mod control;
pub mod event;
pub mod line;
pub mod watch;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::task::JoinSet;

use crate::periodic::{every_after, Watch};
use crate::process::Process;
use crate::room::Room;
use crate::store::Redis;

/// Runs every room's background work for as long as the registry holds the room.
pub struct RoomWork {
    process: Arc<Process>,
}

impl RoomWork {
    pub fn new(process: Arc<Process>) -> RoomWork {
        RoomWork { process }
    }
}

/// A running room: its tasks end when this is dropped.
struct Running {
    room: Arc<Room>,
    _tasks: JoinSet<()>,
}

/// A watcher of `room`: a step every [`Watch::EVERY`], once a second while the room is quiet.
struct RoomWatching<W>(Arc<Room>, W);

#[async_trait]
impl<W: Watch> BackgroundService for RoomWatching<W> {
    async fn start(&self, shutdown: ShutdownWatch) {
        every_after(shutdown, || self.0.pause(W::EVERY, W::QUIET_EVERY), || self.1.step()).await
    }
}

/// Starts `room`'s tasks on the current runtime, on `redis`.
fn start(process: &Arc<Process>, room: &Arc<Room>, redis: &Redis, shutdown: &ShutdownWatch) -> JoinSet<()> {
    let store = || redis.room(room.keys().clone());
    let mut tasks = JoinSet::new();
    let mut spawn = |service: Box<dyn BackgroundService + Send + Sync>| {
        let shutdown = shutdown.clone();
        tasks.spawn(async move { service.start(shutdown).await });
    };
    spawn(Box::new(admission::Admitter::new(room.clone(), store())));
    spawn(Box::new(RoomWatching(room.clone(), watch::RoomWatcher::new(process.clone(), room.clone(), store()))));
    spawn(Box::new(line::LineWatcher::new(room.clone(), store())));
    spawn(Box::new(RoomWatching(room.clone(), event::EventWatcher::new(room.clone(), store()))));
    spawn(Box::new(claims::ClaimKeeper::new(room.clone(), store())));
    spawn(Box::new(claims::SettleRetrier::new(room.clone())));
    tasks
}

#[async_trait]
impl BackgroundService for RoomWork {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // Opened here, on this service's runtime: a redis-rs connection's driver task lives on
        // the runtime that made it.
        let redis = match Redis::new(&self.process.settings().config.redis) {
            Ok(redis) => redis,
            Err(error) => {
                tracing::error!(%error, "the rooms' background work cannot reach redis");
                return;
            }
        };
        let mut changes = self.process.rooms().watch();
        let mut running: HashMap<String, Running> = HashMap::new();
        loop {
            let rooms = self.process.rooms().all();
            // A room replaced by another of the same name (a reload) is a new room value: its
            // work restarts on it.
            let removed: Vec<String> =
                running.keys().filter(|name| !rooms.iter().any(|room| room.name() == *name)).cloned().collect();
            running.retain(|name, entry| rooms.iter().any(|room| room.name() == name && Arc::ptr_eq(room, &entry.room)));
            // Once its tasks are stopped: a child metric one of them still holds is no longer
            // exported after its series is removed.
            for name in removed {
                tracing::info!(room = name, "room removed: its work stopped and its series dropped; its line stays in redis");
                crate::metrics::forget_room(&name);
            }
            for room in rooms.iter() {
                if !running.contains_key(room.name()) {
                    let tasks = start(&self.process, room, &redis, &shutdown);
                    running.insert(room.name().to_owned(), Running { room: room.clone(), _tasks: tasks });
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { break },
                _ = shutdown.changed() => break,
            }
        }
        // The watchers end by themselves at shutdown; the settle retriers carry on through the
        // graceful stop, which waits for their queues (crate::lifecycle), until the process exits.
        std::future::pending::<()>().await;
        drop(running);
    }
}
