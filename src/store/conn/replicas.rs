//! Which node answers a call when `redis.read_from_replicas` is on. A replica lags its primary,
//! so what may read from one is decided here, in one place, on the call's own terms (only calls
//! made read-only, never a token check that must see a deletion), not by redis-rs's
//! command-name routing.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

use super::reconnect::Link;
use super::server_error;

/// With `read_from_replicas`, redis-rs would send every read-only *command* to a replica, a
/// `GET` of a token included: a token check answered by a replica that has not yet seen the
/// token's deletion would let a spent token through twice. So only calls made through
/// [`RedisConn::read_only`](super::RedisConn::read_only) go to a replica; every other call with a
/// key goes to its slot's primary explicitly. Scripts for a replica go as `EVALSHA_RO`, the form a
/// replica runs (it refuses writes) and redis-rs routes as a read.
pub(super) async fn route_with_replicas(
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
pub(super) async fn route_pipeline_to_primary(
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

/// A read-only call on the sentinels' replica: a script as `EVALSHA_RO` (what a replica runs),
/// anything else as it is. The replica's answer stands only when it is no error, or `NOSCRIPT`
/// (so that redis-rs loads the script there); on any other error `None` sends the call to the
/// primary instead: a replica that is loading, cut off from its primary, wants another password,
/// or a script that wants to write after all must never fail a read the primary can answer. A
/// replica that is gone is dropped, and the sentinels are asked for another on a later call.
pub(super) async fn read_on_replica(
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
