//! How a room reaches Redis. One `Connector` per service (see `Room`): it opens the connection
//! lazily, on the caller's runtime, and hands out cheap clones of it as a [`RedisConn`], the one
//! connection type `Room` runs its scripts on, whatever the topology:
//!
//! - `redis.url`: a `ConnectionManager`, which reconnects to the same address by itself, but
//!   only once a call has failed on the dead connection. So a keepalive pings it
//!   ([`KEEPALIVE_EVERY`]): the reconnect happens while Redis is away, not in the first user's
//!   request after it is back.
//! - `redis.cluster`: redis-rs's async cluster connection. It follows MOVED/ASK, refreshes its slot
//!   map after a failover and reconnects to the seed nodes when it lost every node, all by itself.
//!   A room's keys share one hash tag, so every call lands on one slot.
//! - `redis.sentinel`: a plain multiplexed connection to the primary the sentinels name. Unlike a
//!   `ConnectionManager` it never reconnects by itself: after a failover the old address may serve
//!   a replica, or an empty restarted primary. Instead, an answer that means "this is not the
//!   primary any more" (connection lost, READONLY, MASTERDOWN, NOREPLICAS) drops it and the next
//!   call asks the sentinels again. A watcher also asks the sentinels twice a second, so a primary
//!   that went silent (a partition), or that was failed over while still up and still takes
//!   writes until the sentinels reconfigure it, is left within half a second too. The sentinels
//!   are asked with the credentials of their own URLs; every node they name (the primary, the
//!   replica promoted in its place) is logged in to with `redis.sentinel.password_env`'s
//!   password, which is why a subscription reuses the primary's client rather than its address.
//!   With `read_from_replicas`, a second slot holds a replica the sentinels name: opened in the
//!   background (no call waits for it), used for read-only calls, dropped when it fails.
//!
//! Opening a cluster or sentinel connection runs in a task of its own, never inside a caller's
//! future: `Room` cuts each call off at `redis.timeout`, and a discovery restarted by every
//! caller's timeout might never finish. Callers wait for it no longer than their own timeout; a
//! failed attempt is retried after a backoff (50 ms doubling to 1 s), and until then callers fail
//! at once (the proxy answers 503) instead of queueing up behind a dead Redis.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::RandomReplicaStrategy;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    Arg, AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisConnectionInfo, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use tokio::sync::{watch, Mutex as AsyncMutex, OnceCell};

use super::StoreError;
use crate::config::{NodeAuth, RedisConfig, RedisTarget};

/// First retry after a failed connect; doubled per failure up to `MAX_BACKOFF`.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How often the sentinel watcher asks who the primary is.
const SENTINEL_CHECK_EVERY: Duration = Duration::from_millis(500);
/// How often a single-URL connection is pinged: a Redis back for this long (plus a connect)
/// meets a live connection.
pub const KEEPALIVE_EVERY: Duration = Duration::from_millis(250);

/// A connection usable by the scripts and commands of `Room`, on any of the three targets.
#[derive(Clone)]
pub struct RedisConn {
    inner: Inner,
    /// Set by [`RedisConn::read_only`].
    read_only: bool,
}

impl RedisConn {
    /// The same connection, for calls that only read (a script that calls no write command):
    /// with `redis.read_from_replicas` on a cluster, they are served by a replica of their slot,
    /// slightly behind its primary; behind sentinels, by the replica they name while one is
    /// connected; scripts go as `EVALSHA_RO`. On a single server, or without the option, it
    /// changes nothing. A script that does write after all is run again on the
    /// primary (a wasted round trip, never a lost write).
    pub fn read_only(mut self) -> RedisConn {
        self.read_only = true;
        self
    }

    /// True when read-only calls may go to a replica: a cluster with `read_from_replicas`, or
    /// sentinels with it while a replica is connected. Only single commands and scripts are
    /// routed there; pipelines always go to the primary.
    pub fn reads_from_replicas(&self) -> bool {
        matches!(
            self.inner,
            Inner::Cluster { read_from_replicas: true, .. } | Inner::Sentinel { replica: Some(_), .. }
        )
    }
}

#[derive(Clone)]
enum Inner {
    Single(ConnectionManager),
    Cluster {
        conn: ClusterConnection,
        read_from_replicas: bool,
    },
    Sentinel {
        primary: Primary,
        generation: u64,
        link: Arc<Link<Primary>>,
        /// With `redis.read_from_replicas`, a replica for read-only calls, while one is connected.
        replica: Option<(MultiplexedConnection, u64, Arc<Link<MultiplexedConnection>>)>,
    },
}

pub struct Connector {
    target: Target,
}

enum Target {
    Single {
        client: redis::Client,
        timeout: Duration,
        conn: OnceCell<ConnectionManager>,
        /// The keepalive ends when this is dropped with the connector.
        alive: Arc<()>,
    },
    Cluster {
        client: ClusterClient,
        /// The seed nodes, for a subscription (a PUBLISH reaches every node of a cluster).
        nodes: Vec<String>,
        read_from_replicas: bool,
        link: Arc<Link<ClusterConnection>>,
    },
    Sentinel {
        sentinel: Arc<Sentinel>,
        link: Arc<Link<Primary>>,
        /// With `redis.read_from_replicas`: the slot of a replica connection.
        replica: Option<Arc<Link<MultiplexedConnection>>>,
        watcher: std::sync::Once,
    },
}

impl Connector {
    /// Parses the target; opens nothing (there is no runtime to open it on yet).
    pub fn new(config: &RedisConfig) -> Result<Connector, StoreError> {
        let timeout = config.timeout;
        // Long enough for a sentinel round plus a connect on a slow network, short enough that
        // a blackholed address is given up and retried.
        let budget = (timeout * 4).clamp(Duration::from_secs(1), Duration::from_secs(10));
        let target = match &config.target {
            RedisTarget::Url(url) => Target::Single {
                client: redis::Client::open(url.as_str())?,
                timeout,
                conn: OnceCell::new(),
                alive: Arc::new(()),
            },
            RedisTarget::Cluster(nodes) => {
                let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // redis-rs waits 1.28 s and more between retries by default; a request has
                    // `timeout` in all, so retry (after MOVED, TRYAGAIN, a lost node) within it.
                    .retries(6)
                    .min_retry_wait(5)
                    .max_retry_wait(timeout.as_millis().clamp(10, 200) as u64)
                    .retry_wait_formula(10, 2);
                if config.read_from_replicas {
                    // Also makes redis-rs send READONLY to replica connections.
                    builder = builder.read_routing_strategy(RandomReplicaStrategy);
                }
                Target::Cluster {
                    client: builder.build()?,
                    nodes: nodes.clone(),
                    read_from_replicas: config.read_from_replicas,
                    link: Link::new(budget),
                }
            }
            RedisTarget::Sentinel { master, addrs, auth } => {
                // The sentinels log in with the credentials of their own URLs; the nodes they
                // name (the primary, and the replica promoted in its place) with these.
                let node_login = node_login(auth)?;
                let client = |server_type| {
                    SentinelClient::build(
                        addrs.iter().map(String::as_str).collect(),
                        master.clone(),
                        Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(node_login.clone())),
                        server_type,
                    )
                };
                let replica_client = match config.read_from_replicas {
                    true => Some(AsyncMutex::new(client(SentinelServerType::Replica)?)),
                    false => None,
                };
                let sentinel = Sentinel {
                    client: AsyncMutex::new(client(SentinelServerType::Master)?),
                    replica_client,
                    master: master.clone(),
                    addrs: addrs.clone(),
                    node_login,
                    config: AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(Some(timeout)),
                };
                Target::Sentinel {
                    sentinel: Arc::new(sentinel),
                    link: Link::new(budget),
                    replica: config.read_from_replicas.then(|| Link::new(budget)),
                    watcher: std::sync::Once::new(),
                }
            }
        };
        Ok(Connector { target })
    }

    /// The client of a single-URL target (`redis.url`), for a connection of its own (a pub/sub
    /// subscription); `None` for a cluster or sentinel target.
    pub fn single_client(&self) -> Option<redis::Client> {
        match &self.target {
            Target::Single { client, .. } => Some(client.clone()),
            _ => None,
        }
    }

    /// A client for a pub/sub subscription of its own (see `crate::line`), on any target: the
    /// single server; a cluster's seed node number `attempt` (modulo their number: a message
    /// published on any node reaches every node); the primary a sentinel target is connected to
    /// (`None` while it is not connected).
    pub fn subscriber_client(&self, attempt: usize) -> Option<redis::Client> {
        match &self.target {
            Target::Single { client, .. } => Some(client.clone()),
            Target::Cluster { nodes, .. } => {
                let node = nodes.get(attempt % nodes.len().max(1))?;
                redis::Client::open(node.as_str()).ok()
            }
            Target::Sentinel { link, .. } => link.current().map(|(primary, _)| (*primary.client).clone()),
        }
    }

    /// A clone of the service's connection, opening it on first use (and, for a sentinel target,
    /// again after it was dropped).
    pub async fn get(&self) -> Result<RedisConn, StoreError> {
        let inner = match &self.target {
            Target::Single {
                client,
                timeout,
                conn,
                alive,
            } => {
                let manager = conn
                    .get_or_try_init(|| async {
                        // Reconnect quickly and give up on a dead socket quickly: a proxy in front
                        // of a checkout must notice a Redis that came back within a second or so.
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(*timeout))
                            .set_response_timeout(Some(*timeout))
                            .set_min_delay(Duration::from_millis(10))
                            .set_max_delay(Duration::from_millis(250))
                            .set_number_of_retries(2);
                        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
                        // Here, on the caller's runtime, which the connection lives on too.
                        tokio::spawn(keepalive(manager.clone(), *timeout, Arc::downgrade(alive)));
                        Ok::<_, RedisError>(manager)
                    })
                    .await?;
                Inner::Single(manager.clone())
            }
            Target::Cluster {
                client,
                read_from_replicas,
                link,
                ..
            } => {
                let (conn, _) = link
                    .get(|| {
                        let client = client.clone();
                        async move { client.get_async_connection().await }
                    })
                    .await?;
                Inner::Cluster {
                    conn,
                    read_from_replicas: *read_from_replicas,
                }
            }
            Target::Sentinel {
                sentinel,
                link,
                replica,
                watcher,
            } => {
                // Spawned here rather than in `new`: this is the first moment on the service's
                // runtime, and the watcher's connections must live on it.
                watcher.call_once(|| {
                    tokio::spawn(watch_sentinels(Arc::clone(sentinel), Arc::downgrade(link)));
                });
                let (primary, generation) = link
                    .get(|| Arc::clone(sentinel).connect_to_primary())
                    .await?;
                // A replica is a bonus, never waited for: without one, reads go to the primary.
                let replica = replica.as_ref().and_then(|slot| {
                    let (conn, generation) =
                        slot.current_or_connect(|| Arc::clone(sentinel).connect_to_replica())?;
                    Some((conn, generation, Arc::clone(slot)))
                });
                Inner::Sentinel {
                    primary,
                    generation,
                    link: Arc::clone(link),
                    replica,
                }
            }
        };
        Ok(RedisConn {
            inner,
            read_only: false,
        })
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let read_only = self.read_only;
        match &mut self.inner {
            Inner::Single(conn) => conn.req_packed_command(cmd),
            Inner::Cluster {
                conn,
                read_from_replicas: false,
            } => conn.req_packed_command(cmd),
            Inner::Cluster {
                conn,
                read_from_replicas: true,
            } => Box::pin(route_with_replicas(conn, cmd, read_only)),
            Inner::Sentinel {
                primary,
                generation,
                link,
                replica,
            } => Box::pin(async move {
                if let (true, Some((conn, generation, slot))) = (read_only, replica.as_mut()) {
                    if let Some(answer) = read_on_replica(conn, *generation, slot, cmd).await {
                        return answer;
                    }
                }
                let result = primary.conn.req_packed_command(cmd).await;
                let why = match &result {
                    Err(e) => not_primary(e).then(|| e.clone()),
                    Ok(value) => server_error(value).filter(not_primary),
                };
                if let Some(why) = why {
                    link.drop_connection(*generation, why);
                }
                result
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.inner {
            Inner::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Inner::Cluster {
                conn,
                read_from_replicas: false,
            } => conn.req_packed_commands(pipeline, offset, count),
            Inner::Cluster {
                conn,
                read_from_replicas: true,
            } => Box::pin(route_pipeline_to_primary(conn, pipeline, offset, count)),
            Inner::Sentinel {
                primary,
                generation,
                link,
                ..
            } => Box::pin(async move {
                let result = primary
                    .conn
                    .req_packed_commands(pipeline, offset, count)
                    .await;
                let why = match &result {
                    Err(e) => not_primary(e).then(|| e.clone()),
                    Ok(values) => values.iter().filter_map(server_error).find(not_primary),
                };
                if let Some(why) = why {
                    link.drop_connection(*generation, why);
                }
                result
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Single(conn) => conn.get_db(),
            Inner::Cluster { conn, .. } => conn.get_db(),
            Inner::Sentinel { primary, .. } => primary.conn.get_db(),
        }
    }
}

/// Pings `manager` until the connector is dropped. A ping that fails on a dead connection makes
/// the manager reconnect in the background, and the next ping waits for that; a ping that merely
/// times out (a frozen Redis) changes nothing.
async fn keepalive(mut manager: ConnectionManager, timeout: Duration, alive: Weak<()>) {
    let mut every = tokio::time::interval(KEEPALIVE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unanswered = 0u32;
    while alive.strong_count() > 0 {
        every.tick().await;
        let ping = redis::cmd("PING");
        match tokio::time::timeout(timeout, ping.query_async::<()>(&mut manager)).await {
            // An error (a refused or reset connection) queues nothing, and the next PING is what
            // reconnects: no pause.
            Ok(Ok(())) => unanswered = 0,
            Ok(Err(error)) if !error.is_timeout() => unanswered = 0,
            // A frozen Redis keeps every PING it was sent and runs them all when it wakes: after
            // one it did not answer in time, pause longer (up to 8 periods) instead of adding
            // four a second to that pile.
            _ => {
                unanswered = (unanswered + 1).min(3);
                tokio::time::sleep(KEEPALIVE_EVERY * ((1 << unanswered) - 1)).await;
            }
        }
    }
}

// ---- cluster routing ------------------------------------------------------------------------

/// With `read_from_replicas`, redis-rs would send every read-only *command* to a replica, a
/// `GET` of a token included: a token check answered by a replica that has not yet seen the
/// token's deletion would let a spent token through twice. So only calls made through
/// [`RedisConn::read_only`] go to a replica; every other call with a key goes to its slot's
/// primary explicitly. Scripts for a replica go as `EVALSHA_RO`, the form a replica runs (it
/// refuses writes) and redis-rs routes as a read.
async fn route_with_replicas(
    conn: &mut ClusterConnection,
    cmd: &Cmd,
    read_only: bool,
) -> RedisResult<Value> {
    let args = args_of(cmd);
    let name = args
        .first()
        .map(|n| n.to_ascii_uppercase())
        .unwrap_or_default();
    let Some(key) = key_of(&name, &args) else {
        return conn.req_packed_command(cmd).await;
    };
    let to = |addr| {
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
            key, addr,
        )))
    };
    if !read_only {
        return conn.route_command(cmd.clone(), to(SlotAddr::Master)).await;
    }
    let answer = conn
        .route_command(for_replica(cmd, &name, &args), to(SlotAddr::ReplicaRequired))
        .await;
    // "Write commands are not allowed from read-only scripts": run it where writes are allowed.
    let refused = |e: &RedisError| e.to_string().contains("read-only script");
    match &answer {
        Err(e) if refused(e) => conn.route_command(cmd.clone(), to(SlotAddr::Master)).await,
        Ok(v) if server_error(v).is_some_and(|e| refused(&e)) => {
            conn.route_command(cmd.clone(), to(SlotAddr::Master)).await
        }
        _ => answer,
    }
}

/// A pipeline goes, whole, to the primary of its first keyed command's slot: redis-rs would send
/// a pipeline of reads to a replica. (`read_only` does not apply to pipelines; none reads through
/// one today.)
async fn route_pipeline_to_primary(
    conn: &mut ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let key = pipeline.cmd_iter().find_map(|cmd| {
        let args = args_of(cmd);
        let name = args
            .first()
            .map(|n| n.to_ascii_uppercase())
            .unwrap_or_default();
        key_of(&name, &args).map(|k| k.to_vec())
    });
    let Some(key) = key else {
        return conn.req_packed_commands(pipeline, offset, count).await;
    };
    let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
    conn.route_pipeline(pipeline.clone(), offset, count, route)
        .await
}

/// `cmd` (named `name`, upper case, with `args`) as a replica runs it: a script as `EVALSHA_RO` /
/// `EVAL_RO`, the form that refuses writes, anything else as it is.
fn for_replica(cmd: &Cmd, name: &[u8], args: &[&[u8]]) -> Cmd {
    match name {
        b"EVALSHA" | b"EVAL" => {
            let mut ro = redis::cmd(if name == b"EVAL" { "EVAL_RO" } else { "EVALSHA_RO" });
            for arg in &args[1..] {
                ro.arg(*arg);
            }
            ro
        }
        _ => cmd.clone(),
    }
}

fn args_of(cmd: &Cmd) -> Vec<&[u8]> {
    cmd.args_iter()
        .map(|a| match a {
            Arg::Simple(bytes) => bytes,
            _ => &b""[..],
        })
        .collect()
}

/// The key a command's slot comes from: a script's first key, or the key of a known single-key
/// read; None for anything else (which keeps redis-rs's own routing).
fn key_of<'a>(name: &[u8], args: &[&'a [u8]]) -> Option<&'a [u8]> {
    if matches!(name, b"EVALSHA" | b"EVAL" | b"EVALSHA_RO" | b"EVAL_RO") {
        let keys: usize = args
            .get(2)
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        (keys > 0).then(|| args.get(3).copied()).flatten()
    } else if SINGLE_KEY_READS.contains(&name) {
        args.get(1).copied()
    } else {
        None
    }
}

/// Read-only commands with their key first, which redis-rs would otherwise route to a replica
/// once `read_from_replicas` is on.
const SINGLE_KEY_READS: &[&[u8]] = &[
    b"GET",
    b"MGET",
    b"EXISTS",
    b"TTL",
    b"PTTL",
    b"TYPE",
    b"STRLEN",
    b"ZRANK",
    b"ZSCORE",
    b"ZCARD",
    b"ZCOUNT",
    b"ZRANGE",
    b"ZRANGEBYSCORE",
    b"HGET",
    b"HGETALL",
    b"HMGET",
    b"SCARD",
    b"SISMEMBER",
    b"SMEMBERS",
    b"LLEN",
    b"LRANGE",
];

// ---- sentinel -------------------------------------------------------------------------------

struct Sentinel {
    master: String,
    addrs: Vec<String>,
    /// How to log in to a node the sentinels name (`redis.sentinel.password_env`).
    node_login: RedisConnectionInfo,
    /// Needs `&mut` for its cached sentinel connections; only connect attempts take it.
    client: AsyncMutex<SentinelClient>,
    /// The same, asking for a replica (with `redis.read_from_replicas`).
    replica_client: Option<AsyncMutex<SentinelClient>>,
    config: AsyncConnectionConfig,
}

/// A connection to the node the sentinels named as primary, and where that node is.
#[derive(Clone)]
struct Primary {
    conn: MultiplexedConnection,
    addr: (String, u16),
    /// For connections of their own (a subscription): its address with the login. Behind an
    /// Arc: `RedisConn` is cloned per call, and a client is a few hundred bytes.
    client: Arc<redis::Client>,
}

/// The login to the nodes behind the sentinels.
fn node_login(auth: &NodeAuth) -> RedisResult<RedisConnectionInfo> {
    let mut login = RedisConnectionInfo::default();
    if let Some(password) = &auth.password {
        let password = std::str::from_utf8(password.expose())
            .map_err(|_| RedisError::from((ErrorKind::InvalidClientConfig, "the primary's password is not UTF-8")))?;
        login = login.set_password(password);
    }
    if let Some(username) = &auth.username {
        login = login.set_username(username);
    }
    Ok(login)
}

impl Sentinel {
    /// Asks the sentinels for the primary (redis-rs checks the node's ROLE too) and connects.
    async fn connect_to_primary(self: Arc<Self>) -> RedisResult<Primary> {
        let client = self.client.lock().await.async_get_client().await?;
        let addr = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            other => (other.to_string(), 0),
        };
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        tracing::info!(master = %self.master, host = %addr.0, port = addr.1, "redis primary found through the sentinels");
        Ok(Primary { conn, addr, client: Arc::new(client) })
    }

    /// A connection to a replica the sentinels name (redis-rs picks one that is up and checks
    /// its ROLE), for read-only calls.
    async fn connect_to_replica(self: Arc<Self>) -> RedisResult<MultiplexedConnection> {
        let Some(replicas) = &self.replica_client else {
            return Err(RedisError::from((ErrorKind::InvalidClientConfig, "read_from_replicas is off")));
        };
        let client = replicas.lock().await.async_get_client().await?;
        let conn = client.get_multiplexed_async_connection_with_config(&self.config).await?;
        tracing::info!(master = %self.master, replica = %client.get_connection_info().addr(), "redis replica found through the sentinels, for reads");
        Ok(conn)
    }

    /// Whether the node at `addr` answers `ROLE` as a primary (logged in as to the primary: a
    /// node that wants a password refuses ROLE without it).
    async fn is_primary(&self, addr: &(String, u16)) -> bool {
        let role = async {
            let info = ConnectionAddr::Tcp(addr.0.clone(), addr.1)
                .into_connection_info()?
                .set_redis_settings(self.node_login.clone());
            let client = redis::Client::open(info)?;
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await?;
            redis::cmd("ROLE")
                .query_async::<Vec<Value>>(&mut conn)
                .await
        };
        match role.await.as_deref() {
            Ok([Value::BulkString(r), ..]) => r.as_slice() == b"master",
            Ok([Value::SimpleString(r), ..]) => r == "master",
            _ => false,
        }
    }

    /// Who the first sentinel that answers names as primary; None when none answers.
    async fn named_primary(
        &self,
        conns: &mut [Option<MultiplexedConnection>],
    ) -> Option<(String, u16)> {
        for (addr, slot) in self.addrs.iter().zip(conns.iter_mut()) {
            if slot.is_none() {
                let opened = async {
                    redis::Client::open(addr.as_str())?
                        .get_multiplexed_async_connection_with_config(&self.config)
                        .await
                };
                *slot = opened.await.ok();
            }
            let Some(conn) = slot.as_mut() else { continue };
            let answer: RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.master)
                .query_async(conn)
                .await;
            match answer {
                Ok(Some(addr)) => return Some(addr),
                Ok(None) => {}
                Err(_) => *slot = None,
            }
        }
        None
    }
}

/// Twice a second: if the sentinels name another primary than the one connected (and that node
/// says it is one), drop the
/// connection. Errors do that when the old primary dies; this catches one that went silent, and
/// one that was failed over while up: until the sentinels reconfigure it (seconds later) it still
/// takes writes, which its resync then throws away. Ends when the connector is dropped.
async fn watch_sentinels(sentinel: Arc<Sentinel>, link: Weak<Link<Primary>>) {
    let mut conns: Vec<Option<MultiplexedConnection>> = vec![None; sentinel.addrs.len()];
    let mut every = tokio::time::interval(SENTINEL_CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(link) = link.upgrade() else { return };
        let Some((connected, generation)) = link.current() else {
            continue;
        };
        let Some(named) = sentinel.named_primary(&mut conns).await else {
            continue;
        };
        // A sentinel cut off from the others may still name a dead or demoted primary: leave
        // only for a node that says it is the primary.
        if named != connected.addr && sentinel.is_primary(&named).await {
            let why = RedisError::from((
                ErrorKind::Io,
                "the sentinels name another primary",
                format!(
                    "{}:{} (connected to {}:{})",
                    named.0, named.1, connected.addr.0, connected.addr.1
                ),
            ));
            link.drop_connection(generation, why);
        }
    }
}

/// A read-only call on the sentinels' replica: a script as `EVALSHA_RO` (what a replica runs),
/// anything else as it is. The replica's answer stands only when it is no error, or `NOSCRIPT`
/// (so that redis-rs loads the script there); on any other error `None` sends the call to the
/// primary instead: a replica that is loading, cut off from its primary, wants another password,
/// or a script that wants to write after all must never fail a read the primary can answer. A
/// replica that is gone is dropped, and the sentinels are asked for another on a later call.
async fn read_on_replica(
    conn: &mut MultiplexedConnection,
    generation: u64,
    slot: &Link<MultiplexedConnection>,
    cmd: &Cmd,
) -> Option<RedisResult<Value>> {
    let args = args_of(cmd);
    let name = args.first().map(|n| n.to_ascii_uppercase()).unwrap_or_default();
    let answer = conn.req_packed_command(&for_replica(cmd, &name, &args)).await;
    let no_script = |e: &RedisError| e.kind() == ErrorKind::Server(ServerErrorKind::NoScript);
    match &answer {
        Err(e) if no_script(e) => Some(answer),
        Err(e) => {
            if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || e.is_timeout() {
                slot.drop_connection(generation, e.clone());
            }
            None
        }
        Ok(value) => match server_error(value) {
            Some(e) if !no_script(&e) => None,
            _ => Some(answer),
        },
    }
}

/// True for answers that mean the connection does not lead to a usable primary any more.
fn not_primary(e: &RedisError) -> bool {
    if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
        return true;
    }
    if matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::ReadOnly)
            | ErrorKind::Server(ServerErrorKind::MasterDown)
    ) {
        return true;
    }
    // A script's failed write reports the READONLY of the call inside it.
    // NOREPLICAS: a primary configured with `min-replicas-to-write` lost its replicas, which is
    // what an old primary sees once its replica was promoted away.
    let text = e.to_string();
    ["READONLY", "MASTERDOWN", "NOREPLICAS"]
        .iter()
        .any(|code| text.contains(code))
}

fn server_error(value: &Value) -> Option<RedisError> {
    match value {
        Value::ServerError(e) => Some(e.clone().into()),
        _ => None,
    }
}

// ---- a connection that is replaced when it fails ---------------------------------------------

/// The shared slot of a cluster or sentinel connection: at most one connect attempt at a time, run
/// in its own task, its outcome published to every waiting caller.
struct Link<C> {
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
    fn new(budget: Duration) -> Arc<Link<C>> {
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
    async fn get<F, Fut>(self: &Arc<Self>, connect: F) -> RedisResult<(C, u64)>
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
    fn current_or_connect<F, Fut>(self: &Arc<Self>, connect: F) -> Option<(C, u64)>
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
    fn drop_connection(&self, generation: u64, why: RedisError) {
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

    fn current(&self) -> Option<(C, u64)> {
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

    #[test]
    fn replica_answers_that_mean_failover() {
        let reply = |raw: &[u8]| server_error(&redis::parse_redis_value(raw).unwrap()).unwrap();
        assert!(not_primary(&reply(
            b"-READONLY You can't write against a read only replica.\r\n"
        )));
        assert!(not_primary(&reply(
            b"-MASTERDOWN Link with MASTER is down\r\n"
        )));
        assert!(!not_primary(&reply(b"-NOSCRIPT No matching script.\r\n")));
        assert!(!not_primary(&reply(b"-ERR wrong number of arguments\r\n")));
    }
}
