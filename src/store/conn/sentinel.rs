//! Following the primary the sentinels name. redis-rs's sentinel client only names a node when
//! asked; noticing that the node connected to is no longer the primary (its answers, a watcher
//! asking the sentinels, the node's own ROLE) and logging in to whichever node replaces it is
//! this module's work.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::SentinelClient;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo,
    RedisError, RedisResult, ServerErrorKind, Value,
};
use tokio::sync::Mutex as AsyncMutex;

use super::reconnect::Link;
use crate::config::NodeAuth;

/// How often the sentinel watcher asks who the primary is.
const SENTINEL_CHECK_EVERY: Duration = Duration::from_millis(500);

pub(super) struct Sentinel {
    pub(super) master: String,
    pub(super) addrs: Vec<String>,
    /// How to log in to a node the sentinels name (`redis.sentinel.password_env`).
    pub(super) node_login: RedisConnectionInfo,
    /// Needs `&mut` for its cached sentinel connections; only connect attempts take it.
    pub(super) client: AsyncMutex<SentinelClient>,
    /// The same, asking for a replica (with `redis.read_from_replicas`).
    pub(super) replica_client: Option<AsyncMutex<SentinelClient>>,
    pub(super) config: AsyncConnectionConfig,
}

/// A connection to the node the sentinels named as primary, and where that node is.
#[derive(Clone)]
pub(super) struct Primary {
    pub(super) conn: MultiplexedConnection,
    addr: (String, u16),
    /// For connections of their own (a subscription): its address with the login. Behind an
    /// Arc: `RedisConn` is cloned per call, and a client is a few hundred bytes.
    pub(super) client: Arc<redis::Client>,
}

/// The login to the nodes behind the sentinels.
pub(super) fn node_login(auth: &NodeAuth) -> RedisResult<RedisConnectionInfo> {
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
    pub(super) async fn connect_to_primary(self: Arc<Self>) -> RedisResult<Primary> {
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
    pub(super) async fn connect_to_replica(self: Arc<Self>) -> RedisResult<MultiplexedConnection> {
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
pub(super) async fn watch_sentinels(sentinel: Arc<Sentinel>, link: Weak<Link<Primary>>) {
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

/// True for answers that mean the connection does not lead to a usable primary any more.
pub(super) fn not_primary(e: &RedisError) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conn::server_error;

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
