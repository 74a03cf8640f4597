//! How a room reaches Redis. One `Connector` per service (see `Room`): it opens the connection
//! lazily, on the caller's runtime, and hands out cheap clones of it as a [`RedisConn`], the one
//! connection type `Room` runs its scripts on, whatever the topology:
//!
//! - `redis.url`: a `ConnectionManager`, which reconnects to the same address by itself, but
//!   only once a call has failed on the dead connection. So a keepalive pings it while it
//!   carries no calls (once a second while Redis answers, every
//!   [`KEEPALIVE_EVERY`](reconnect::KEEPALIVE_EVERY) while it does not): the reconnect happens
//!   while Redis is away, not in the first user's request after it is back.
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

mod reconnect;
mod replicas;
mod sentinel;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::RandomReplicaStrategy;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::{Mutex as AsyncMutex, OnceCell};

use super::StoreError;
use crate::config::{RedisConfig, RedisTarget};
use reconnect::{keepalive, Link};
use replicas::{read_on_replica, route_pipeline_to_primary, route_with_replicas};
use sentinel::{node_login, not_primary, watch_sentinels, Primary, Sentinel};

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
    /// The manager, and the count of calls sent on it (which spares its keepalive a PING).
    Single(ConnectionManager, Arc<AtomicU64>),
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
        /// Calls sent on the connection, read by its keepalive.
        calls: Arc<AtomicU64>,
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
                calls: Arc::new(AtomicU64::new(0)),
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

    /// A client for a pub/sub subscription of its own (see `crate::room::line`), on any target: the
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
                calls,
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
                        tokio::spawn(keepalive(manager.clone(), *timeout, Arc::downgrade(alive), calls.clone()));
                        Ok::<_, RedisError>(manager)
                    })
                    .await?;
                Inner::Single(manager.clone(), calls.clone())
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
            Inner::Single(conn, calls) => {
                calls.fetch_add(1, Ordering::Relaxed);
                conn.req_packed_command(cmd)
            }
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
            Inner::Single(conn, calls) => {
                calls.fetch_add(1, Ordering::Relaxed);
                conn.req_packed_commands(pipeline, offset, count)
            }
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
            Inner::Single(conn, _) => conn.get_db(),
            Inner::Cluster { conn, .. } => conn.get_db(),
            Inner::Sentinel { primary, .. } => primary.conn.get_db(),
        }
    }
}

fn server_error(value: &Value) -> Option<RedisError> {
    match value {
        Value::ServerError(e) => Some(e.clone().into()),
        _ => None,
    }
}
