//! Keeping a connection to Redis usable while Redis goes away and comes back. A cluster or
//! sentinel connection lives in a [`Link`], whose connect attempt runs in a task of its own (so a
//! caller's timeout cannot restart it forever) and whose backoff makes callers fail at once rather
//! than queue behind a dead Redis. A single-URL `ConnectionManager` reconnects by itself, but only
//! once a call fails, which is why [`keepalive`] keeps calling it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, RedisResult};
use tokio::sync::watch;

/// First retry after a failed connect; doubled per failure up to `MAX_BACKOFF`.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How often a single-URL connection's keepalive looks at it, and pings it while Redis fails
/// to answer: a Redis back for this long (plus a connect) meets a live connection.
pub const KEEPALIVE_EVERY: Duration = Duration::from_millis(250);
/// While Redis answers, a connection that carried no call for this long is pinged; one that
/// carried calls is not pinged at all, as a failed call reconnects it as a failed PING does.
/// So an idle proxy sends one PING a second per connection, not four (contract section 17
/// gives a room nobody uses 5 calls a second), and only a death goes unnoticed for longer:
/// a return is still met within [`KEEPALIVE_EVERY`].
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(1);

/// Pings `manager` until the connector is dropped. A ping that fails on a dead connection makes
/// the manager reconnect in the background, and the next ping waits for that; a ping that merely
/// times out (a frozen Redis) changes nothing. `calls` counts the calls sent on the connection.
pub(super) async fn keepalive(mut manager: ConnectionManager, timeout: Duration, alive: Weak<()>, calls: Arc<AtomicU64>) {
    let mut every = tokio::time::interval(KEEPALIVE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unanswered = 0u32;
    let mut answered = false;
    let (mut seen, mut quiet_since) = (calls.load(Ordering::Relaxed), Instant::now());
    while alive.strong_count() > 0 {
        every.tick().await;
        let now = calls.load(Ordering::Relaxed);
        if now != seen {
            (seen, quiet_since) = (now, Instant::now());
        }
        if answered && quiet_since.elapsed() < KEEPALIVE_IDLE {
            continue;
        }
        let ping = redis::cmd("PING");
        match tokio::time::timeout(timeout, ping.query_async::<()>(&mut manager)).await {
            Ok(Ok(())) => {
                (unanswered, answered) = (0, true);
                // The PING is the connection's call: the next is due a quiet second from now.
                quiet_since = Instant::now();
            }
            // An error (a refused or reset connection) queues nothing, and the next PING is what
            // reconnects: no pause.
            Ok(Err(error)) if !error.is_timeout() => (unanswered, answered) = (0, false),
            // A frozen Redis keeps every PING it was sent and runs them all when it wakes: after
            // one it did not answer in time, pause longer (up to 8 periods) instead of adding
            // four a second to that pile.
            _ => {
                answered = false;
                unanswered = (unanswered + 1).min(3);
                tokio::time::sleep(KEEPALIVE_EVERY * ((1 << unanswered) - 1)).await;
            }
        }
    }
}

/// The shared slot of a cluster or sentinel connection: at most one connect attempt at a time, run
/// in its own task, its outcome published to every waiting caller.
pub(super) struct Link<C> {
    state: watch::Sender<State<C>>,
    generations: AtomicU64,
    /// How long one connect attempt may take in all.
    budget: Duration,
}

enum State<C> {
    /// Not connected; the next caller after `retry_at` starts an attempt.
    Down {
        retry_at: Instant,
        backoff: Duration,
        error: Option<RedisError>,
    },
    Connecting,
    Up {
        conn: C,
        generation: u64,
    },
}

impl<C: Clone + Send + Sync + 'static> Link<C> {
    pub(super) fn new(budget: Duration) -> Arc<Link<C>> {
        let (state, _) = watch::channel(State::Down {
            retry_at: Instant::now(),
            backoff: MIN_BACKOFF,
            error: None,
        });
        Arc::new(Link {
            state,
            generations: AtomicU64::new(0),
            budget,
        })
    }

    /// The live connection and its generation, starting an attempt if none is live and the
    /// backoff allows; fails at once while backing off.
    pub(super) async fn get<F, Fut>(self: &Arc<Self>, connect: F) -> RedisResult<(C, u64)>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = RedisResult<C>> + Send + 'static,
    {
        let mut seen = self.state.subscribe();
        loop {
            let mut answer = None;
            let mut start = None;
            self.state.send_if_modified(|state| match state {
                State::Up { conn, generation } => {
                    answer = Some(Ok((conn.clone(), *generation)));
                    false
                }
                State::Down {
                    retry_at, error, ..
                } if Instant::now() < *retry_at => {
                    answer = Some(Err(unavailable(error.as_ref())));
                    false
                }
                State::Down { backoff, .. } => {
                    start = Some(*backoff);
                    *state = State::Connecting;
                    true
                }
                State::Connecting => false,
            });
            if let Some(answer) = answer {
                return answer;
            }
            if let Some(backoff) = start {
                self.spawn_attempt(connect(), backoff);
            }
            // The sender lives in `self`, so this ends only when the attempt has.
            let _ = seen.wait_for(|s| !matches!(s, State::Connecting)).await;
        }
    }

    /// The live connection, if there is one; otherwise starts an attempt (unless one is running
    /// or the backoff says wait) and answers `None` at once: for a connection a caller can do
    /// without (a replica to read from).
    pub(super) fn current_or_connect<F, Fut>(self: &Arc<Self>, connect: F) -> Option<(C, u64)>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = RedisResult<C>> + Send + 'static,
    {
        let mut live = None;
        let mut start = None;
        self.state.send_if_modified(|state| match state {
            State::Up { conn, generation } => {
                live = Some((conn.clone(), *generation));
                false
            }
            State::Down { retry_at, backoff, .. } if Instant::now() >= *retry_at => {
                start = Some(*backoff);
                *state = State::Connecting;
                true
            }
            _ => false,
        });
        if let Some(backoff) = start {
            self.spawn_attempt(connect(), backoff);
        }
        live
    }

    fn spawn_attempt<Fut>(self: &Arc<Self>, attempt: Fut, backoff: Duration)
    where
        Fut: Future<Output = RedisResult<C>> + Send + 'static,
    {
        let link = Arc::clone(self);
        tokio::spawn(async move {
            let outcome = match tokio::time::timeout(link.budget, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => Err(RedisError::from((
                    ErrorKind::Io,
                    "connecting to redis timed out",
                    format!("{:?}", link.budget),
                ))),
            };
            let next = match outcome {
                Ok(conn) => State::Up {
                    conn,
                    generation: link.generations.fetch_add(1, Ordering::Relaxed) + 1,
                },
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?backoff, "cannot connect to redis");
                    State::Down {
                        retry_at: Instant::now() + backoff,
                        backoff: (backoff * 2).min(MAX_BACKOFF),
                        error: Some(error),
                    }
                }
            };
            link.state.send_replace(next);
        });
    }

    /// Drops the connection of `generation` (a newer one is left alone): the next caller connects
    /// afresh, at once.
    pub(super) fn drop_connection(&self, generation: u64, why: RedisError) {
        let dropped = self.state.send_if_modified(|state| match state {
            State::Up { generation: g, .. } if *g == generation => {
                *state = State::Down {
                    retry_at: Instant::now(),
                    backoff: MIN_BACKOFF,
                    error: Some(why.clone()),
                };
                true
            }
            _ => false,
        });
        if dropped {
            tracing::warn!(error = %why, "redis connection dropped; asking the sentinels again");
        }
    }

    pub(super) fn current(&self) -> Option<(C, u64)> {
        match &*self.state.borrow() {
            State::Up { conn, generation } => Some((conn.clone(), *generation)),
            _ => None,
        }
    }
}

fn unavailable(last: Option<&RedisError>) -> RedisError {
    match last {
        Some(e) => RedisError::from((ErrorKind::Io, "redis unreachable, retrying", e.to_string())),
        None => RedisError::from((ErrorKind::Io, "redis unreachable, retrying")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicU32;

    /// A connect that counts its calls and fails while `fail` is set, after `delay`.
    fn fake(
        calls: &Arc<AtomicU32>,
        fail: &Arc<std::sync::atomic::AtomicBool>,
        delay: Duration,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = RedisResult<u32>> + Send>> {
        let (calls, fail) = (Arc::clone(calls), Arc::clone(fail));
        move || {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let fail = fail.load(Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                if fail {
                    Err(RedisError::from((ErrorKind::Io, "down")))
                } else {
                    Ok(n)
                }
            })
        }
    }

    #[tokio::test]
    async fn failed_connects_back_off_and_a_dropped_connection_is_replaced() {
        let link: Arc<Link<u32>> = Link::new(Duration::from_secs(1));
        let calls = Arc::new(AtomicU32::new(0));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let connect = fake(&calls, &fail, Duration::ZERO);

        assert!(link.get(&connect).await.is_err());
        assert!(link.get(&connect).await.is_err(), "still backing off");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "no attempt during the backoff"
        );

        tokio::time::sleep(MIN_BACKOFF + Duration::from_millis(20)).await;
        fail.store(false, Ordering::SeqCst);
        let (conn, generation) = link.get(&connect).await.expect("connected");
        assert_eq!(
            link.get(&connect).await.unwrap(),
            (conn, generation),
            "shared, not reopened"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        link.drop_connection(generation + 1, RedisError::from((ErrorKind::Io, "stale")));
        assert_eq!(
            link.current(),
            Some((conn, generation)),
            "another generation's failure is ignored"
        );
        link.drop_connection(generation, RedisError::from((ErrorKind::Io, "gone")));
        let (_, next) = link.get(&connect).await.expect("reconnected at once");
        assert_eq!((calls.load(Ordering::SeqCst), next), (3, generation + 1));
    }

    #[tokio::test]
    async fn a_slow_connect_outlives_the_caller_that_started_it() {
        let link: Arc<Link<u32>> = Link::new(Duration::from_secs(1));
        let calls = Arc::new(AtomicU32::new(0));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let connect = fake(&calls, &fail, Duration::from_millis(200));

        let cut_short = tokio::time::timeout(Duration::from_millis(50), link.get(&connect)).await;
        assert!(
            cut_short.is_err(),
            "the caller gave up after its own timeout"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(
            link.current().map(|(c, _)| c),
            Some(1),
            "the attempt finished anyway"
        );
        link.get(&connect).await.expect("connected");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
