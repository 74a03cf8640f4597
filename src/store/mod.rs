//! The room's state in Redis, and the only code that talks to it.
//!
//! Every change that touches more than one key is one Lua script from `lua/` (compiled into the
//! binary, run by SHA, reloaded on NOSCRIPT by redis-rs), so a proxy killed at any moment leaves
//! the room consistent. Every call is bounded by `redis.timeout`: a Redis that hangs costs a
//! request at most that long, never a stuck connection.
//!
//! All of a room's keys share one hash tag, `{<key_prefix>}`, so each script touches one slot and
//! the same layout works on a Redis Cluster.
//!
//! The admission switches of contract section 11 are handed to the scripts as data
//! ([`RoomRules`], 0 = off) rather than as separate scripts, so each rule is applied inside the
//! one atomic step it concerns: the instant pass and the active cap inside enter, the sweep of
//! abandoned places and the batch in force inside the admission tick, "heard from" inside enter
//! and status. A rule that is off costs no Redis command, and none of its keys is ever written.
//! Keys they add: `admission:spent` (what the interval in progress has admitted, shared by the
//! tick and instant passes), `admission:adaptive` and `admission:latencies` (the controller's
//! state and the latencies reported since its last step, see `lua/adapt.lua`), `admission:log`
//! (admissions per 100 ms, for the measured rate) and `heard` (when each waiting user was last
//! heard from).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use crate::config::RedisConfig;
use crate::rules::ControlState;

mod conn;
pub use conn::{Connector, RedisConn};

/// The poll clock's functions are shared by enter and status, the admission helpers by enter and
/// admit: one source each, prepended where used.
macro_rules! with_poll_clock {
    ($file:literal) => {
        concat!(include_str!("../../lua/poll_clock.lua"), "\n", include_str!($file))
    };
}

macro_rules! with_admission {
    ($file:literal) => {
        concat!(include_str!("../../lua/admission.lua"), "\n", include_str!($file))
    };
}

static ENTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../../lua/poll_clock.lua"),
        "\n",
        include_str!("../../lua/admission.lua"),
        "\n",
        include_str!("../../lua/enter.lua")
    ))
});
static STATUS: LazyLock<Script> =
    LazyLock::new(|| Script::new(with_poll_clock!("../../lua/status.lua")));
static ADMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(with_admission!("../../lua/admit.lua")));
static CONSUME: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/consume.lua")));
static STATS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/stats.lua")));
static ADAPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/adapt.lua")));
static ADAPT_COMMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/adapt_commit.lua")));

/// How often the room's adaptive controller steps.
pub const ADAPT_PERIOD: Duration = Duration::from_secs(1);
/// A room whose controller nobody has called for this long forgets its batch and starts again
/// at `batch_size`, as a new room does.
const ADAPT_KEEP: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
}

/// The names of a room's keys.
#[derive(Debug, Clone)]
pub struct Keys {
    pub queue: String,
    pub seq: String,
    pub next_admission: String,
    pub tokens: String,
    pub token_prefix: String,
    pub poll_prefix: String,
    pub abuse_prefix: String,
    /// What the interval in progress has admitted so far (instant passes share its batch).
    pub admission_spent: String,
    /// The adaptive controller's state: the batch in force, its schedule.
    pub adaptive: String,
    /// Protected upstream latencies reported since the controller's last step.
    pub latencies: String,
    /// Admissions per 100 ms and the room's first admission: the measured rate.
    pub admissions: String,
    /// When each waiting user was last heard from (abandonment).
    pub heard: String,
    /// A random value that changes when the room is reset (see `crate::line`).
    pub epoch: String,
    /// A pub/sub channel nobody publishes on: the line watcher's subscription to it ends the
    /// moment Redis goes away.
    pub line_watch: String,
}

impl Keys {
    pub fn new(key_prefix: &str) -> Keys {
        let tag = format!("{{{key_prefix}}}");
        Keys {
            queue: format!("{tag}:queue"),
            seq: format!("{tag}:seq"),
            next_admission: format!("{tag}:admission:next"),
            tokens: format!("{tag}:tokens"),
            token_prefix: format!("{tag}:token:"),
            poll_prefix: format!("{tag}:poll:"),
            abuse_prefix: format!("{tag}:abuse:"),
            admission_spent: format!("{tag}:admission:spent"),
            adaptive: format!("{tag}:admission:adaptive"),
            latencies: format!("{tag}:admission:latencies"),
            admissions: format!("{tag}:admission:log"),
            heard: format!("{tag}:heard"),
            epoch: format!("{tag}:epoch"),
            line_watch: format!("{tag}:line:watch"),
        }
    }

    pub fn token(&self, user: &str) -> String {
        [self.token_prefix.as_str(), user].concat()
    }

    pub fn poll_clock(&self, user: &str) -> String {
        [self.poll_prefix.as_str(), user].concat()
    }

    pub fn abuse_counter(&self, address: &str) -> String {
        [self.abuse_prefix.as_str(), address].concat()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnterOutcome {
    Waiting { position: u64, already: bool },
    /// The user already held a live token.
    Ready { token: String, remaining_ms: u64 },
    /// admission.instant: nobody waited and the interval had room: admitted by this enter.
    Instant { token: String, remaining_ms: u64 },
    Full,
    Limited { retry_secs: u64 },
}

/// An enter's outcome, and whether it found the user's place lost (abandonment) and removed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entered {
    pub outcome: EnterOutcome,
    pub abandoned: u64,
    /// A waiting user's arrival number and the room's epoch (for `crate::line`).
    pub arrival: Option<(u64, String)>,
}

/// A status call's outcome, and whether it found the user's place lost and removed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub outcome: StatusOutcome,
    pub abandoned: u64,
    /// A waiting user's arrival number and the room's epoch, when the answer read them (for
    /// `crate::line`).
    pub arrival: Option<(u64, String)>,
}

/// One consistent reading of the line, for `crate::line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineReading {
    /// The arrival counter: the last number handed out.
    pub last: u64,
    /// Users waiting.
    pub len: u64,
    /// The first waiting user's number.
    pub first: Option<u64>,
    pub epoch: Option<String>,
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
        }
    }

    /// The rules in force under `config`. `abandon_after` is never shorter than the longest
    /// pollAfter a user can be told (tiers are rounded up to whole seconds in answers), so a
    /// user who polls as told never loses the place.
    pub fn from_config(config: &crate::config::Config) -> RoomRules {
        let a = &config.admission;
        let abandon_after = if config.queue.abandon_after.is_zero() {
            Duration::ZERO
        } else {
            let longest = config
                .poll_after
                .iter()
                .map(|t| Duration::from_secs(crate::rules::ceil_secs(t.poll_after)))
                .max()
                .unwrap_or_default();
            config.queue.abandon_after.max(longest)
        };
        RoomRules {
            interval: a.interval,
            batch_size: a.batch_size.get(),
            token_ttl: config.token.ttl,
            instant: a.instant,
            max_active: a.max_active,
            min_batch: a.adaptive.as_ref().map(|ad| ad.min_batch.get()),
            abandon_after,
        }
    }

    /// Whether any admission switch is on: then the room logs its admissions, and estimates
    /// use the measured rate.
    pub fn listens(&self) -> bool {
        self.instant || self.max_active > 0 || self.min_batch.is_some()
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusOutcome {
    Waiting { position: u64 },
    Ready { token: String, remaining_ms: u64 },
    NotInQueue,
    TooEarly { retry_secs: u64 },
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

    fn push_args(&self, call: &mut redis::ScriptInvocation<'_>) {
        match self.on_time_factor {
            None => {
                call.arg(0);
            }
            Some(factor) => {
                call.arg(factor);
                for (first, poll_after) in self.thresholds {
                    call.arg(*first).arg(poll_after.as_millis() as u64);
                }
            }
        }
    }
}

/// Who is entering, from where, under which limits.
#[derive(Debug, Clone, Copy)]
pub struct EnterRequest<'a> {
    pub user: &'a str,
    pub capacity: u64,
    /// `(client address, identities allowed per address per minute)`; `None` when unlimited.
    pub per_address: Option<(&'a str, u32)>,
    pub poll: PollClock<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmitOutcome {
    pub admitted: u64,
    /// How long until the room's next admission is due.
    pub next_due: Duration,
    /// Whether this call was the one the schedule was waiting for (false: another proxy's was).
    pub was_due: bool,
    /// Places of users who stopped polling, removed by this tick.
    pub abandoned: u64,
    /// The batch this tick admitted with (0 when it was not due).
    pub batch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomStats {
    pub waiting: u64,
    pub live_tokens: u64,
}

/// What the room watcher reads: [`RoomStats`] and what the admission switches need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomWatch {
    pub waiting: u64,
    pub live_tokens: u64,
    /// The batch the adaptive controller stored (not clamped to the configured bounds); `None`
    /// without adaptive or before its first step.
    pub stored_batch: Option<u32>,
    /// Users admitted in the last 10 s (only when the rules listen).
    pub admitted_recently: u64,
    /// Time since the room's first logged admission; `None` before it (or when not asked).
    pub since_first: Option<Duration>,
}

/// A controller step this proxy claimed: compute the next state, then [`Room::adapt_commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptStep {
    /// Identifies the step for the commit.
    pub id: String,
    /// The stored state; `None` before the room's first commit.
    pub state: Option<ControlState>,
    /// Every latency reported since the previous step, as `(bucket, count)`.
    pub latencies: Vec<(usize, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptOutcome {
    /// `Some` when this call claimed the room's step.
    pub step: Option<AdaptStep>,
    /// How long until the room's next step is due.
    pub next_due: Duration,
}

/// A handle on one room. Cheap to create; the connection is opened on first use, on the runtime
/// of the caller, because a redis-rs connection's driver task lives on the runtime that made it
/// and pingora gives every service its own runtime. So: one `Room` per service.
pub struct Room {
    keys: Keys,
    connector: Connector,
    timeout: Duration,
}

impl Room {
    pub fn new(config: &RedisConfig) -> Result<Room, StoreError> {
        Ok(Room {
            keys: Keys::new(&config.key_prefix),
            connector: Connector::new(config)?,
            timeout: config.timeout,
        })
    }

    /// The same room with another bound on each call (the readiness probe wants a short one).
    pub fn with_timeout(mut self, timeout: Duration) -> Room {
        self.timeout = timeout;
        self
    }

    pub fn keys(&self) -> &Keys {
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

    /// Enter under the fixed rate (no admission switch, no abandonment).
    pub async fn enter(&self, request: EnterRequest<'_>) -> Result<EnterOutcome, StoreError> {
        Ok(self.enter_with(request, &RoomRules::OFF).await?.outcome)
    }

    /// Enter under `rules`: with `instant`, a fresh token goes along in case the user may pass.
    pub async fn enter_with(
        &self,
        request: EnterRequest<'_>,
        rules: &RoomRules,
    ) -> Result<Entered, StoreError> {
        let user = request.user;
        let (address, limit) = request.per_address.unwrap_or(("-", 0));
        let instant_token = if rules.instant { uuid::Uuid::new_v4().to_string() } else { String::new() };
        self.bounded(async {
            let mut conn = self.conn().await?;
            let mut call = ENTER.key(&self.keys.queue);
            call.key(&self.keys.seq)
                .key(self.keys.token(user))
                .key(self.keys.poll_clock(user))
                .key(self.keys.abuse_counter(address))
                .key(&self.keys.tokens)
                .key(&self.keys.next_admission)
                .key(&self.keys.admission_spent)
                .key(&self.keys.adaptive)
                .key(&self.keys.admissions)
                .key(&self.keys.heard)
                .key(&self.keys.epoch)
                .arg(user)
                .arg(request.capacity)
                .arg(limit)
                .arg(rules.abandon_ms())
                .arg(&instant_token)
                .arg(rules.ttl_ms())
                .arg(rules.interval_us())
                .arg(rules.batch_size)
                .arg(rules.min_batch.unwrap_or(0))
                .arg(rules.max_active)
                .arg(u8::from(rules.listens()));
            request.poll.push_args(&mut call);
            let reply: Vec<Value> = call.invoke_async(&mut conn).await?;
            let (outcome, abandoned_at) = match tag(&reply)? {
                "READY" => {
                    let token = text(&reply, 1)?;
                    let remaining_ms = int(&reply, 2)?.max(0) as u64;
                    let outcome = if int_or(&reply, 3, 0) == 1 {
                        EnterOutcome::Instant { token, remaining_ms }
                    } else {
                        EnterOutcome::Ready { token, remaining_ms }
                    };
                    (outcome, 4)
                }
                "WAITING" => (
                    EnterOutcome::Waiting {
                        position: int(&reply, 1)?.max(1) as u64,
                        already: int(&reply, 2)? == 1,
                    },
                    3,
                ),
                "FULL" => (EnterOutcome::Full, 1),
                "LIMITED" => (EnterOutcome::Limited { retry_secs: int(&reply, 1)?.max(1) as u64 }, 2),
                other => return Err(StoreError::Reply(format!("enter answered {other}"))),
            };
            let arrival = match (&outcome, reply.get(5)) {
                (EnterOutcome::Waiting { .. }, Some(Value::BulkString(epoch))) => {
                    let number = int_or(&reply, 4, 0);
                    (number >= 1).then(|| (number as u64, String::from_utf8_lossy(epoch).into_owned()))
                }
                _ => None,
            };
            Ok(Entered { outcome, abandoned: int_or(&reply, abandoned_at, 0).max(0) as u64, arrival })
        })
        .await
    }

    /// Status without abandonment.
    pub async fn status(&self, user: &str, poll: PollClock<'_>) -> Result<StatusOutcome, StoreError> {
        Ok(self.status_with(user, poll, &RoomRules::OFF).await?.outcome)
    }

    /// Status under `rules` (only `abandon_after` matters here).
    pub async fn status_with(
        &self,
        user: &str,
        poll: PollClock<'_>,
        rules: &RoomRules,
    ) -> Result<Status, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            // Without abandonment and enforced polling the status script only reads, so a
            // replica may answer it (when `redis.read_from_replicas` is on).
            if rules.abandon_ms() == 0 && poll.on_time_factor.is_none() {
                if !conn.reads_from_replicas() {
                    return read_status(&mut conn, &self.keys, user).await;
                }
                conn = conn.read_only();
            }
            let mut call = STATUS.key(&self.keys.queue);
            call.key(self.keys.token(user))
                .key(self.keys.poll_clock(user))
                .key(&self.keys.heard)
                .arg(user)
                .arg(rules.abandon_ms());
            poll.push_args(&mut call);
            let reply: Vec<Value> = call.invoke_async(&mut conn).await?;
            let mut abandoned = 0;
            let outcome = match tag(&reply)? {
                "WAITING" => StatusOutcome::Waiting { position: int(&reply, 1)?.max(1) as u64 },
                "READY" => StatusOutcome::Ready {
                    token: text(&reply, 1)?,
                    remaining_ms: int(&reply, 2)?.max(0) as u64,
                },
                "NOT_IN_QUEUE" => {
                    abandoned = int_or(&reply, 1, 0).max(0) as u64;
                    StatusOutcome::NotInQueue
                }
                "TOO_EARLY" => StatusOutcome::TooEarly { retry_secs: int(&reply, 1)?.max(1) as u64 },
                other => return Err(StoreError::Reply(format!("status answered {other}"))),
            };
            Ok(Status { outcome, abandoned, arrival: None })
        })
        .await
    }

    /// The line's counter, length, first number and epoch, in one MULTI/EXEC.
    pub async fn read_line(&self) -> Result<LineReading, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            type Reply = (Option<u64>, u64, Vec<(String, f64)>, Option<String>);
            let (last, len, first, epoch): Reply = redis::pipe()
                .atomic()
                .cmd("GET")
                .arg(&self.keys.seq)
                .cmd("ZCARD")
                .arg(&self.keys.queue)
                .cmd("ZRANGE")
                .arg(&self.keys.queue)
                .arg(0)
                .arg(0)
                .arg("WITHSCORES")
                .cmd("GET")
                .arg(&self.keys.epoch)
                .query_async(&mut conn)
                .await?;
            Ok(LineReading {
                last: last.unwrap_or(0),
                len,
                first: first.first().map(|(_, score)| *score as u64),
                epoch,
            })
        })
        .await
    }

    /// The client of a single-URL Redis (see [`Connector::single_client`]).
    pub fn single_client(&self) -> Option<redis::Client> {
        self.connector.single_client()
    }

    /// Gives the room an epoch if it has none (a new room, or one reset since).
    pub async fn start_epoch(&self) -> Result<(), StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let _: Option<String> = redis::cmd("SET")
                .arg(&self.keys.epoch)
                .arg(uuid::Uuid::new_v4().simple().to_string())
                .arg("NX")
                .query_async(&mut conn)
                .await?;
            Ok(())
        })
        .await
    }

    /// The user's current token, if one is live.
    pub async fn current_token(&self, user: &str) -> Result<Option<String>, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let token: Option<String> =
                redis::cmd("GET").arg(self.keys.token(user)).query_async(&mut conn).await?;
            Ok(token)
        })
        .await
    }

    /// Deletes the user's token if it is still `token`; true when it was deleted.
    pub async fn consume(&self, user: &str, token: &str) -> Result<bool, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let deleted: i64 = CONSUME
                .key(self.keys.token(user))
                .key(&self.keys.tokens)
                .arg(token)
                .arg(user)
                .invoke_async(&mut conn)
                .await?;
            Ok(deleted == 1)
        })
        .await
    }

    /// One admission tick at the fixed rate: admits a batch if the room's schedule says one is due.
    pub async fn admit(
        &self,
        interval: Duration,
        batch: u32,
        token_ttl: Duration,
    ) -> Result<AdmitOutcome, StoreError> {
        self.admit_with(&RoomRules::fixed(interval, batch, token_ttl)).await
    }

    /// One admission tick under `rules`: sweeps abandoned places, then admits the batch in
    /// force (less what max_active leaves no room for) if the room's schedule says one is due.
    pub async fn admit_with(&self, rules: &RoomRules) -> Result<AdmitOutcome, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let mut call = ADMIT.key(&self.keys.queue);
            call.key(&self.keys.next_admission)
                .key(&self.keys.tokens)
                .key(&self.keys.adaptive)
                .key(&self.keys.admission_spent)
                .key(&self.keys.admissions)
                .key(&self.keys.heard)
                .arg(rules.interval_us())
                .arg(rules.batch_size)
                .arg(rules.ttl_ms())
                .arg(&self.keys.token_prefix)
                .arg(rules.max_active)
                .arg(rules.min_batch.unwrap_or(0))
                .arg(u8::from(rules.instant))
                .arg(rules.abandon_ms())
                .arg(u8::from(rules.listens()));
            for _ in 0..rules.batch_size {
                call.arg(uuid::Uuid::new_v4().to_string());
            }
            let (admitted, wait_us, due, abandoned, batch): (u64, u64, u8, u64, u32) =
                call.invoke_async(&mut conn).await?;
            Ok(AdmitOutcome {
                admitted,
                next_due: Duration::from_micros(wait_us),
                was_due: due == 1,
                abandoned,
                batch,
            })
        })
        .await
    }

    /// The room's numbers: users waiting and live tokens.
    pub async fn stats(&self) -> Result<RoomStats, StoreError> {
        let watch = self.watch(None).await?;
        Ok(RoomStats { waiting: watch.waiting, live_tokens: watch.live_tokens })
    }

    /// The room's numbers, and under `rules` that listen, the batch in force and the measured
    /// admissions (nothing more is read under the fixed rate).
    pub async fn watch(&self, rules: Option<&RoomRules>) -> Result<RoomWatch, StoreError> {
        let adaptive = rules.is_some_and(|r| r.min_batch.is_some());
        let listens = rules.is_some_and(RoomRules::listens);
        self.bounded(async {
            let mut conn = self.conn().await?;
            let (waiting, live_tokens, batch, admitted, since_first): (u64, u64, i64, u64, i64) = STATS
                .key(&self.keys.queue)
                .key(&self.keys.tokens)
                .key(&self.keys.adaptive)
                .key(&self.keys.admissions)
                .arg(u8::from(adaptive))
                .arg(u8::from(listens))
                .invoke_async(&mut conn)
                .await?;
            Ok(RoomWatch {
                waiting,
                live_tokens,
                stored_batch: u32::try_from(batch).ok(),
                admitted_recently: admitted,
                since_first: u64::try_from(since_first).ok().map(Duration::from_millis),
            })
        })
        .await
    }

    /// This proxy's once-a-second adaptive call: reports its latencies (`(bucket, count)`) and
    /// claims the room's controller step when it is due.
    pub async fn adapt(&self, report: &[(usize, u64)]) -> Result<AdaptOutcome, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let mut call = ADAPT.key(&self.keys.adaptive);
            call.key(&self.keys.latencies)
                .arg(ADAPT_PERIOD.as_micros() as u64)
                .arg(ADAPT_KEEP.as_millis() as u64);
            for (bucket, count) in report {
                call.arg(*bucket).arg(*count);
            }
            let reply: Vec<Value> = call.invoke_async(&mut conn).await?;
            let next_due = Duration::from_micros(int(&reply, 1)?.max(0) as u64);
            if int(&reply, 0)? != 1 {
                return Ok(AdaptOutcome { step: None, next_due });
            }
            let latencies = (7..reply.len())
                .step_by(2)
                .map(|i| Ok((int(&reply, i)?.max(0) as usize, int(&reply, i + 1)?.max(0) as u64)))
                .collect::<Result<Vec<_>, StoreError>>()?;
            let number =
                |i| -> Result<u32, StoreError> { Ok(int(&reply, i)?.clamp(0, u32::MAX as i64) as u32) };
            let state = match int(&reply, 3)? {
                batch if batch >= 0 => Some(ControlState {
                    batch: batch.min(u32::MAX as i64) as u32,
                    settle: number(4)?,
                    served_at_cut: Some(number(5)?).filter(|n| *n > 0),
                    probe_wait: number(6)?,
                }),
                _ => None,
            };
            Ok(AdaptOutcome {
                step: Some(AdaptStep { id: text(&reply, 2)?, state, latencies }),
                next_due,
            })
        })
        .await
    }

    /// Stores the state a claimed step computed; false when a later step was claimed meanwhile.
    pub async fn adapt_commit(&self, step_id: &str, state: ControlState) -> Result<bool, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let stored: i64 = ADAPT_COMMIT
                .key(&self.keys.adaptive)
                .arg(step_id)
                .arg(state.batch)
                .arg(state.settle)
                .arg(state.served_at_cut.unwrap_or(0))
                .arg(state.probe_wait)
                .invoke_async(&mut conn)
                .await?;
            Ok(stored == 1)
        })
        .await
    }
}

/// A status that writes nothing (no poll clock, no abandonment): the status script's three
/// reads as one MULTI/EXEC, as atomic as the script, at half of Redis's cost for the Lua call
/// (22k against 43k instructions per status, BENCHMARKS.md). The most frequent request of a rush.
async fn read_status(conn: &mut RedisConn, keys: &Keys, user: &str) -> Result<Status, StoreError> {
    let token_key = keys.token(user);
    type Reply = (Option<i64>, Option<f64>, Option<String>, i64, Option<String>);
    let (rank, score, token, pttl, epoch): Reply = redis::pipe()
        .atomic()
        .cmd("ZRANK")
        .arg(&keys.queue)
        .arg(user)
        .cmd("ZSCORE")
        .arg(&keys.queue)
        .arg(user)
        .cmd("GET")
        .arg(&token_key)
        .cmd("PTTL")
        .arg(&token_key)
        .cmd("GET")
        .arg(&keys.epoch)
        .query_async(conn)
        .await?;
    let outcome = match (rank, token) {
        (Some(rank), _) => StatusOutcome::Waiting { position: rank as u64 + 1 },
        (None, Some(token)) => StatusOutcome::Ready { token, remaining_ms: pttl.max(0) as u64 },
        (None, None) => StatusOutcome::NotInQueue,
    };
    let arrival = match (score, epoch) {
        (Some(score), Some(epoch)) if score >= 1.0 => Some((score as u64, epoch)),
        _ => None,
    };
    Ok(Status { outcome, abandoned: 0, arrival })
}

fn tag(reply: &[Value]) -> Result<&str, StoreError> {
    match reply.first() {
        Some(Value::BulkString(b)) => {
            std::str::from_utf8(b).map_err(|_| StoreError::Reply("non-UTF-8 tag".into()))
        }
        Some(Value::SimpleString(s)) => Ok(s),
        other => Err(StoreError::Reply(format!("expected a tag, got {other:?}"))),
    }
}

fn text(reply: &[Value], i: usize) -> Result<String, StoreError> {
    match reply.get(i) {
        Some(Value::BulkString(b)) => String::from_utf8(b.clone())
            .map_err(|_| StoreError::Reply("non-UTF-8 text".into())),
        Some(Value::SimpleString(s)) => Ok(s.clone()),
        other => Err(StoreError::Reply(format!("expected text at {i}, got {other:?}"))),
    }
}

/// An optional trailing integer: `default` when the script did not send it.
fn int_or(reply: &[Value], i: usize, default: i64) -> i64 {
    match reply.get(i) {
        Some(Value::Int(n)) => *n,
        _ => default,
    }
}

fn int(reply: &[Value], i: usize) -> Result<i64, StoreError> {
    match reply.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(StoreError::Reply(format!("expected an integer at {i}, got {other:?}"))),
    }
}
