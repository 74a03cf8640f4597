//! The room's state in Redis, and the only code that talks to it.
//!
//! Every change that touches more than one key is one Lua script from `lua/` (compiled into the
//! binary, run by SHA, reloaded on NOSCRIPT by redis-rs), so a proxy killed at any moment leaves
//! the room consistent. Every call is bounded by `redis.timeout`: a Redis that hangs costs a
//! request at most that long, never a stuck connection.
//!
//! One module per script or operation (`enter`, `status`, `admit`, `adapt`, `consume`, `stats`,
//! `line`, `room`), as mini-redis has one file per command: each owns its Lua file, declares the names of
//! its KEYS, ARGV and reply once (see `script.rs`: Rust fills them by name, the Lua reads them by
//! name), and decodes its own reply. A new key or argument touches that module and its Lua file,
//! nothing else; a new key name, `keys.rs`. `RoomStore` holds only what they share: the key names, the
//! connection (`conn/`) and the bound on each call. Tests call the same operations with
//! [`RoomRules`] and [`PollClock`] spelled out.
//!
//! All of a room's keys share one hash tag, `{<key_prefix>}`, so each script touches one slot and
//! the same layout works on a Redis Cluster.
//!
//! The admission switches of contract section 11 are handed to the scripts as data
//! ([`RoomRules`], 0 = off) rather than as separate scripts, so each rule is applied inside the
//! one atomic step it concerns: the instant pass and the active cap inside enter, the sweep of
//! abandoned places and the batch in force inside the admission tick, "heard from" inside enter
//! and status. A rule that is off costs no Redis command, and none of its keys is ever written
//! (but one: the tick deletes the heard-from set while abandonment is off, so that nothing is
//! remembered against anyone then).
//! Keys they add: `admission:spent` (what the interval in progress has admitted, shared by the
//! tick and instant passes), `admission:adaptive` and `admission:latencies` (the controller's
//! state and the latencies reported since its last step, see `lua/adapt.lua`), `admission:log`
//! (admissions per 100 ms, for the measured rate), `heard` (when each waiting user was last
//! heard from) and `clock` (the room's clock, which outages do not advance: see
//! `lua/room_clock.lua`).

use std::sync::Arc;
use std::time::Duration;

use crate::config::RedisConfig;

#[macro_use]
mod script;
mod adapt;
mod admit;
mod conn;
mod consume;
mod enter;
mod event;
mod group;
mod keys;
mod line;
mod room;
mod stats;
mod status;

pub use adapt::{AdaptOutcome, AdaptStep, ADAPT_PERIOD};
pub use admit::AdmitOutcome;
pub use conn::{Connector, RedisConn};
pub use consume::{Claim, Settle};
pub use enter::{EnterOutcome, EnterRequest, Entered};
pub use event::{seed_bytes, Entering, EventEnter, EventTick, EventTimes, SeedRef, Standing, DRAW_PAGE};
pub use group::{GROUPS_IN_FLIGHT, GROUP_MAX};
pub use keys::{Keys, DEFAULT_ROOM};
pub use line::LineReading;
pub use room::{RoomReport, RoomStateReading};
pub use stats::RoomWatch;
pub use status::{Status, StatusOutcome};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
    /// The error of a call that carried several requests (grouped enters), as each one sees it.
    #[error(transparent)]
    Shared(std::sync::Arc<StoreError>),
}

/// The admission rules the scripts apply (contract sections 3 and 11), as data. Zero / `false` /
/// `None` switch a rule off, and a room with every switch off does the Redis work of the fixed
/// rate, nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomRules {
    pub interval: Duration,
    /// The batch, or with adaptive its ceiling.
    pub batch_size: u32,
    pub token_ttl: Duration,
    pub instant: bool,
    /// 0 = no cap.
    pub max_active: u64,
    /// `Some(min_batch)` with adaptive: the batch in force is the controller's.
    pub min_batch: Option<u32>,
    /// Zero = off.
    pub abandon_after: Duration,
    /// Whether status calls are enforced (`polling.enforce`): the room then keeps its clock
    /// (`lua/room_clock.lua`) even without abandonment.
    pub polls_enforced: bool,
}

impl RoomRules {
    /// Every switch off, for calls whose outcome does not depend on the rate (enter and status
    /// at the fixed rate).
    pub const OFF: RoomRules = RoomRules {
        interval: Duration::from_secs(1),
        batch_size: 1,
        token_ttl: Duration::from_secs(1),
        instant: false,
        max_active: 0,
        min_batch: None,
        abandon_after: Duration::ZERO,
        polls_enforced: false,
    };

    /// The fixed rate: `batch` per `interval`, nothing listening, nobody abandoned.
    pub fn fixed(interval: Duration, batch: u32, token_ttl: Duration) -> RoomRules {
        RoomRules {
            interval,
            batch_size: batch,
            token_ttl,
            instant: false,
            max_active: 0,
            min_batch: None,
            abandon_after: Duration::ZERO,
            polls_enforced: false,
        }
    }

    /// Whether any admission switch is on: then the room logs its admissions, and estimates
    /// use the measured rate.
    pub fn listens(&self) -> bool {
        self.instant || self.max_active > 0 || self.min_batch.is_some()
    }

    /// Whether the scripts keep the room's clock: for abandonment and enforced polling, each
    /// of which must not count an outage against a user.
    pub fn keeps_time(&self) -> bool {
        self.abandon_ms() > 0 || self.polls_enforced
    }

    fn abandon_ms(&self) -> u64 {
        if self.abandon_after.is_zero() {
            0
        } else {
            (self.abandon_after.as_millis() as u64).max(1)
        }
    }

    fn interval_us(&self) -> u64 {
        self.interval.as_micros().max(1) as u64
    }

    fn ttl_ms(&self) -> u64 {
        self.token_ttl.as_millis().max(1) as u64
    }
}

/// Server-enforced polling, handed to the scripts as data (see `lua/poll_clock.lua`).
#[derive(Debug, Clone, Copy)]
pub struct PollClock<'a> {
    /// 1 - grace; `None` when enforcement is off.
    pub on_time_factor: Option<f64>,
    /// `(first position of the tier, pollAfter)`, in tier order.
    pub thresholds: &'a [(u64, Duration)],
}

impl PollClock<'_> {
    pub const OFF: PollClock<'static> = PollClock { on_time_factor: None, thresholds: &[] };

    /// The scripts' `poll_factor` argument: 0 when enforcement is off.
    fn factor(&self) -> f64 {
        self.on_time_factor.unwrap_or(0.0)
    }

    /// The tiers as the scripts read them, `(first position, pollAfter in ms)` (none when
    /// enforcement is off).
    fn tiers(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let tiers = if self.on_time_factor.is_some() { self.thresholds } else { &[] };
        tiers.iter().map(|(first, poll_after)| (*first, poll_after.as_millis() as u64))
    }

    /// The tiers, as the tail of the script's arguments.
    fn push_tiers(&self, call: &mut redis::ScriptInvocation<'_>) {
        push_tiers(call, self.tiers());
    }
}

/// Poll tiers `(first position, pollAfter in ms)` as script arguments, where the poll clock reads them.
fn push_tiers(call: &mut redis::ScriptInvocation<'_>, tiers: impl Iterator<Item = (u64, u64)>) {
    for (first, poll_after_ms) in tiers {
        call.arg(first).arg(poll_after_ms);
    }
}

/// The process's way to Redis on one runtime: the connection (opened on first use, on the
/// runtime of the caller, because a redis-rs connection's driver task lives on the runtime that
/// made it) and the default bound on each call. Cloning shares the connection, so every room
/// served from one runtime uses one connection.
#[derive(Clone)]
pub struct Redis {
    connector: Arc<Connector>,
    timeout: Duration,
    key_prefix: Arc<str>,
}

impl Redis {
    pub fn new(config: &RedisConfig) -> Result<Redis, StoreError> {
        Ok(Redis {
            connector: Arc::new(Connector::new(config)?),
            timeout: config.timeout,
            key_prefix: Arc::from(config.key_prefix.as_str()),
        })
    }

    /// The handle on one room's keys over this connection.
    pub fn room(&self, keys: Arc<Keys>) -> RoomStore {
        RoomStore { keys, connector: self.connector.clone(), timeout: self.timeout, groups: Queues::default() }
    }

    /// The keys of the room `default`, the one room of a configuration without `rooms`.
    pub fn default_keys(&self) -> Arc<Keys> {
        Arc::new(Keys::new(&self.key_prefix))
    }

    /// The keys of the room `name`.
    pub fn room_keys(&self, name: &str) -> Arc<Keys> {
        Arc::new(Keys::of_room(&self.key_prefix, name))
    }
}

/// One room's data in Redis: its keys, the connection it is reached on, the bound on each call,
/// and the requests waiting to be sent to it in groups. Every operation of this module is a
/// method of it.
pub struct RoomStore {
    keys: Arc<Keys>,
    connector: Arc<Connector>,
    timeout: Duration,
    /// Requests waiting to be sent in groups (see `group.rs`).
    groups: Queues,
}

/// A queue of requests waiting for a group, per kind.
#[derive(Default)]
struct Queues {
    enters: group::Groups<enter::Member>,
    claims: group::Groups<consume::claim::Member>,
    settles: group::Groups<consume::Settle>,
}

impl RoomStore {
    /// The room `default` on a connection of its own (tools and tests; the proxy shares one
    /// [`Redis`] between its rooms).
    pub fn new(config: &RedisConfig) -> Result<RoomStore, StoreError> {
        let redis = Redis::new(config)?;
        Ok(redis.room(redis.default_keys()))
    }

    /// The same room with another bound on each call (the readiness probe wants a short one).
    pub fn with_timeout(mut self, timeout: Duration) -> RoomStore {
        self.timeout = timeout;
        self
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn keys_shared(&self) -> &Arc<Keys> {
        &self.keys
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn conn(&self) -> Result<RedisConn, StoreError> {
        self.connector.get().await
    }

    /// Runs one Redis operation under the configured timeout.
    async fn bounded<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        match tokio::time::timeout(self.timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Runs a script call (see `script.rs`) under the bound.
    async fn run<T: redis::FromRedisValue>(&self, call: &redis::ScriptInvocation<'_>) -> Result<T, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            Ok(call.invoke_async(&mut conn).await?)
        })
        .await
    }

    /// The client of a single-URL Redis (see [`Connector::single_client`]).
    pub fn single_client(&self) -> Option<redis::Client> {
        self.connector.single_client()
    }

    /// A client for a subscription (see [`Connector::subscriber_client`]).
    pub fn subscriber_client(&self, attempt: usize) -> Option<redis::Client> {
        self.connector.subscriber_client(attempt)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    /// Every script's prelude is generated without a clash of names and with what its helpers
    /// read (the Lua itself is run against Redis by tests/scripts.rs).
    #[test]
    fn every_script_builds() {
        for script in [
            &super::enter::SCRIPT,
            &super::status::SCRIPT,
            &super::admit::SCRIPT,
            &super::adapt::SCRIPT,
            &super::adapt::commit::SCRIPT,
            &super::consume::SCRIPT,
            &super::consume::claim::SCRIPT,
            &super::stats::SCRIPT,
            &super::room::SCRIPT,
            &super::event::SCRIPT,
        ] {
            LazyLock::force(script);
        }
    }
}
