//! The room's state in Redis, and the only code that talks to it.
//!
//! Every change that touches more than one key is one Lua script from `lua/` (compiled into the
//! binary, run by SHA, reloaded on NOSCRIPT by redis-rs), so a proxy killed at any moment leaves
//! the room consistent. Every call is bounded by `redis.timeout`: a Redis that hangs costs a
//! request at most that long, never a stuck connection.
//!
//! All of a room's keys share one hash tag, `{<key_prefix>}`, so each script touches one slot and
//! the same layout works on a Redis Cluster.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use crate::config::RedisConfig;

mod conn;
pub use conn::{Connector, RedisConn};

/// The poll clock's functions are shared by enter and status: one source, prepended to both.
macro_rules! with_poll_clock {
    ($file:literal) => {
        concat!(include_str!("../../lua/poll_clock.lua"), "\n", include_str!($file))
    };
}

static ENTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(with_poll_clock!("../../lua/enter.lua")));
static STATUS: LazyLock<Script> =
    LazyLock::new(|| Script::new(with_poll_clock!("../../lua/status.lua")));
static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/admit.lua")));
static CONSUME: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/consume.lua")));
static STATS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/stats.lua")));

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
    Ready { token: String, remaining_ms: u64 },
    Full,
    Limited { retry_secs: u64 },
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomStats {
    pub waiting: u64,
    pub live_tokens: u64,
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

    pub async fn enter(&self, request: EnterRequest<'_>) -> Result<EnterOutcome, StoreError> {
        let user = request.user;
        let (address, limit) = request.per_address.unwrap_or(("-", 0));
        self.bounded(async {
            let mut conn = self.conn().await?;
            let mut call = ENTER.key(&self.keys.queue);
            call.key(&self.keys.seq)
                .key(self.keys.token(user))
                .key(self.keys.poll_clock(user))
                .key(self.keys.abuse_counter(address))
                .arg(user)
                .arg(request.capacity)
                .arg(limit);
            request.poll.push_args(&mut call);
            let reply: Vec<Value> = call.invoke_async(&mut conn).await?;
            match tag(&reply)? {
                "READY" => Ok(EnterOutcome::Ready {
                    token: text(&reply, 1)?,
                    remaining_ms: int(&reply, 2)?.max(0) as u64,
                }),
                "WAITING" => Ok(EnterOutcome::Waiting {
                    position: int(&reply, 1)?.max(1) as u64,
                    already: int(&reply, 2)? == 1,
                }),
                "FULL" => Ok(EnterOutcome::Full),
                "LIMITED" => Ok(EnterOutcome::Limited { retry_secs: int(&reply, 1)?.max(1) as u64 }),
                other => Err(StoreError::Reply(format!("enter answered {other}"))),
            }
        })
        .await
    }

    pub async fn status(&self, user: &str, poll: PollClock<'_>) -> Result<StatusOutcome, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let mut call = STATUS.key(&self.keys.queue);
            call.key(self.keys.token(user)).key(self.keys.poll_clock(user)).arg(user);
            poll.push_args(&mut call);
            let reply: Vec<Value> = call.invoke_async(&mut conn).await?;
            match tag(&reply)? {
                "WAITING" => Ok(StatusOutcome::Waiting { position: int(&reply, 1)?.max(1) as u64 }),
                "READY" => Ok(StatusOutcome::Ready {
                    token: text(&reply, 1)?,
                    remaining_ms: int(&reply, 2)?.max(0) as u64,
                }),
                "NOT_IN_QUEUE" => Ok(StatusOutcome::NotInQueue),
                "TOO_EARLY" => Ok(StatusOutcome::TooEarly { retry_secs: int(&reply, 1)?.max(1) as u64 }),
                other => Err(StoreError::Reply(format!("status answered {other}"))),
            }
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

    /// One admission tick: admits a batch if the room's schedule says one is due.
    pub async fn admit(
        &self,
        interval: Duration,
        batch: u32,
        token_ttl: Duration,
    ) -> Result<AdmitOutcome, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let mut call = ADMIT.key(&self.keys.queue);
            call.key(&self.keys.next_admission)
                .key(&self.keys.tokens)
                .arg(interval.as_micros().max(1) as u64)
                .arg(batch)
                .arg(token_ttl.as_millis().max(1) as u64)
                .arg(&self.keys.token_prefix);
            for _ in 0..batch {
                call.arg(uuid::Uuid::new_v4().to_string());
            }
            let (admitted, wait_us, due): (u64, u64, u8) = call.invoke_async(&mut conn).await?;
            Ok(AdmitOutcome {
                admitted,
                next_due: Duration::from_micros(wait_us),
                was_due: due == 1,
            })
        })
        .await
    }

    /// The room's numbers: users waiting and live tokens.
    pub async fn stats(&self) -> Result<RoomStats, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let (waiting, live_tokens): (u64, u64) = STATS
                .key(&self.keys.queue)
                .key(&self.keys.tokens)
                .invoke_async(&mut conn)
                .await?;
            Ok(RoomStats { waiting, live_tokens })
        })
        .await
    }
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

fn int(reply: &[Value], i: usize) -> Result<i64, StoreError> {
    match reply.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(StoreError::Reply(format!("expected an integer at {i}, got {other:?}"))),
    }
}
