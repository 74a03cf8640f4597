//! The line watcher: reads the room's line every [`REFRESH_EVERY`] into the room's
//! [`LocalLine`], wakes held polls as the front passes them, and holds the subscription that
//! notices a dead Redis at once and hears the tokens other proxies spend (see
//! [`crate::room::line`] for what the local answers may and may not do with it).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::room::line::{LocalLine, CANARY_CONNECT, FRESH_FOR, REFRESH_EVERY};
use crate::room::Room;
use crate::store::{RoomStore, StoreError};

/// Reads the line's mark every [`REFRESH_EVERY`] for this proxy's [`LocalLine`] (the room
/// state's).
pub struct LineWatcher {
    store: Arc<RoomStore>,
    /// The Redis server (`run_id`) the last reading came from.
    server: Mutex<Option<String>>,
    room: Arc<Room>,
    /// Readings failed in a row (see [`LineWatcher::read`]).
    failures: AtomicU32,
}

/// The longest pause between readings while Redis does not answer.
const MOST_BETWEEN_FAILURES: Duration = Duration::from_millis(500);

impl LineWatcher {
    pub fn new(room: Arc<Room>, store: RoomStore) -> LineWatcher {
        // A reading that takes much longer than its freshness is useless anyway.
        let timeout = store.timeout().min(FRESH_FOR * 4);
        LineWatcher { store: Arc::new(store.with_timeout(timeout)), server: Mutex::default(), room, failures: Default::default() }
    }

    fn line(&self) -> &LocalLine {
        self.room.line()
    }

    /// Subscribes to the room's channels and waits for the subscription to end, over and over.
    /// The spent-token channel feeds this proxy's [`crate::room::spent::SpentTokens`] with the tokens
    /// every proxy of the room spends. With a single-URL Redis the subscription is also the
    /// line's canary (on the watch channel, where nobody publishes): each end means the
    /// connection dropped, and the line is invalidated at once. A Redis that refuses the
    /// subscription itself (an ACL without channel rights) leaves the readings alone to guard
    /// the line, and each proxy to remember only the tokens it spent itself; so does a cluster
    /// or sentinel subscription that fails, which is retried.
    async fn subscription(&self) {
        let canary = self.store.single_client().is_some();
        let keys = self.store.keys();
        let channels: Vec<&str> = if canary { vec![&keys.line_watch, &keys.spent] } else { vec![&keys.spent] };
        let mut pause = REFRESH_EVERY;
        for attempt in 0.. {
            let subscribed = tokio::time::timeout(CANARY_CONNECT, async {
                // None: a sentinel target not connected yet.
                let Some(client) = self.store.subscriber_client(attempt) else { return Ok(None) };
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&channels).await?;
                Ok::<_, redis::RedisError>(Some(pubsub))
            })
            .await;
            match subscribed {
                Ok(Ok(Some(pubsub))) => {
                    pause = REFRESH_EVERY;
                    let mut messages = pubsub.into_on_message();
                    while let Some(message) = messages.next().await {
                        if message.get_channel_name() == keys.spent {
                            let ttl = self.room.settings().config.token.ttl;
                            self.room.spent().announced(message.get_payload_bytes(), ttl);
                        }
                    }
                }
                Ok(Err(error)) if !(error.is_io_error() || error.is_connection_dropped() || error.is_timeout()) => {
                    tracing::warn!(%error, "Redis refused the line watcher's subscription: a dead Redis is noticed at the next line reading instead, and tokens spent through other proxies are known only to Redis");
                    return std::future::pending().await;
                }
                _ => {}
            }
            if canary {
                self.line().invalidate();
            }
            tokio::time::sleep(pause).await;
            // Redis is away: try again, but not 100 times a second.
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// When another Redis server answers than before (a restart, a failover), it may have lost
    /// the spends of tokens (see [`crate::room::spent`]): this proxy makes every spend it remembers
    /// again, in a task of its own, so the readings go on meanwhile.
    fn after_a_loss(&self, server: &str) {
        let mut seen = self.server.lock().unwrap_or_else(|e| e.into_inner());
        let changed = seen.as_deref().is_some_and(|before| before != server);
        *seen = Some(server.to_owned());
        if !changed {
            return;
        }
        let spends = self.room.spent().live();
        if spends.is_empty() {
            return;
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            let mut made = 0;
            for (user, token) in &spends {
                // No claim: only the spend is made again, and only of that very token.
                if store.consume(user, token, "", true).await.unwrap_or(false) {
                    made += 1;
                }
            }
            tracing::info!(remembered = spends.len(), made, "another Redis server answers: spends it had lost made again");
        });
    }

    async fn read(&self) {
        self.line().reading();
        match self.store.read_line().await {
            Ok(reading) => {
                let forgotten = self.line().refresh(&reading);
                // Held polls wake when the front passes their user's place; when the numbers
                // they were learned against are gone, all of them ask Redis.
                let held = self.room.held();
                match (forgotten, reading.len, reading.front) {
                    (true, _, _) | (false, 0, _) => held.wake_all(),
                    (false, _, Some(front)) => held.front(Some(front)),
                    (false, _, None) => {}
                }
                self.after_a_loss(&reading.server);
                if reading.epoch.is_none() {
                    // A new room, or one reset: give it an epoch (the next reading takes it).
                    if let Err(error) = self.store.start_epoch().await {
                        tracing::debug!(%error, "could not store the room's epoch");
                    }
                }
            }
            Err(error) => {
                self.line().invalidate();
                tracing::debug!(%error, "reading the line's mark failed");
                // A reading that timed out still sits in the socket of a frozen Redis, which
                // runs it when it wakes: every 10 ms through an outage would be a burst of
                // thousands. Doubling pauses keep it to a few a second, and the first reading
                // after it returns comes within MOST_BETWEEN_FAILURES. A refusal queues nothing.
                let timed_out = match &error {
                    StoreError::Timeout(_) => true,
                    StoreError::Redis(e) => e.is_timeout(),
                    _ => false,
                };
                if !timed_out {
                    self.failures.store(0, Ordering::Relaxed);
                    return;
                }
                let failures = self.failures.fetch_add(1, Ordering::Relaxed).min(16);
                let pause = REFRESH_EVERY.saturating_mul(1 << failures).min(MOST_BETWEEN_FAILURES);
                tokio::time::sleep(pause).await;
                return;
            }
        }
        self.failures.store(0, Ordering::Relaxed);
    }
}

#[async_trait]
impl BackgroundService for LineWatcher {
    async fn start(&self, shutdown: ShutdownWatch) {
        // The subscription (the canary, and spends announced by other proxies) is read between
        // the readings.
        // A quiet room's line is not read (see crate::room::quiet): nobody asks for it here, and
        // the room watcher's reading wakes the room when the line is no longer empty.
        let mut shutdown = shutdown;
        let beside = self.subscription();
        tokio::pin!(beside);
        loop {
            tokio::select! {
                _ = self.room.pause(REFRESH_EVERY, crate::room::quiet::QUIET_EVERY) => {
                    if !self.room.is_quiet() {
                        self.read().await;
                    }
                }
                _ = &mut beside => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

