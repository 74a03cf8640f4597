//! Redis read (and seeded) the way the proxy writes it: key names come from the crate
//! (`waitroom::store::Keys`), never spelled again here, so a renamed key breaks these helpers
//! at compile time or fails the tests, instead of leaving them reading a key nobody writes.

use super::proxy::Proxy;
use super::redis_server::RedisServer;
use redis::aio::ConnectionLike;
use waitroom::config::Config;
use waitroom::store::{EnterOutcome, EnterRequest, PollClock, RoomStore, RoomRules, StoreError};

pub use waitroom::store::Keys;

/// The keys of the room `proxy` serves.
pub fn keys(proxy: &Proxy) -> Keys {
    Keys::new(&proxy.key_prefix())
}

/// `ZCARD key`: how many members a sorted set (the line, the live tokens, ...) holds.
pub async fn zcard<C: ConnectionLike>(conn: &mut C, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

/// `ZRANGE key 0 -1`: a sorted set's members, lowest score first (the line front to back).
pub async fn zrange_all<C: ConnectionLike>(conn: &mut C, key: &str) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("ZRANGE")
}

/// How many users wait in `proxy`'s room, read straight from Redis.
pub async fn queue_len(redis: &RedisServer, proxy: &Proxy) -> u64 {
    zcard(&mut redis.conn().await, &keys(proxy).queue).await
}

/// Whether `key` exists in Redis within `timeout` (a token the ticker writes, say), checked every
/// 20 ms.
pub async fn key_appears(redis: &RedisServer, key: &str, timeout: std::time::Duration) -> bool {
    let conn = redis.conn().await;
    super::wait_until(timeout, std::time::Duration::from_millis(20), || {
        let mut conn = conn.clone();
        async move { redis::cmd("EXISTS").arg(key).query_async::<i64>(&mut conn).await == Ok(1) }
    })
    .await
}

/// Redis's clock in milliseconds: admission, abuse windows and poll clocks follow it, not ours.
pub async fn redis_now_ms<C: ConnectionLike>(conn: &mut C) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1000 + micros / 1000
}

/// The room of `prefix` through the library, to seed or inspect a line as a proxy would.
pub fn library_room(redis: &RedisServer, prefix: &str) -> RoomStore {
    let yaml = format!(
        "upstream: 127.0.0.1:1\nredis: {{url: \"{}\", key_prefix: \"{prefix}\", timeout: 2s}}\n",
        redis.url()
    );
    RoomStore::new(&Config::parse(&yaml).expect("valid").redis).expect("room")
}

/// `n` library rooms on one prefix, each with its own connection: `n` proxies of one room.
pub fn library_rooms(redis: &RedisServer, prefix: &str, n: usize) -> Vec<std::sync::Arc<RoomStore>> {
    (0..n)
        .map(|_| std::sync::Arc::new(library_room(redis, prefix)))
        .collect()
}

/// Queues `user` straight in Redis, as a proxy's enter would.
pub async fn enter_room(
    room: &RoomStore,
    user: &str,
    capacity: u64,
) -> Result<EnterOutcome, StoreError> {
    let request = EnterRequest { user, capacity, per_address: None, poll: PollClock::OFF };
    Ok(room.enter(request, &RoomRules::OFF).await?.outcome)
}

/// A proxy whose room has had its first admission tick (see `ProxyBuilder::start_settled`).
pub async fn start_settled(redis: &RedisServer, builder: &super::proxy::ProxyBuilder) -> Proxy {
    builder.start_settled(&redis.conn().await).await
}

/// Returns once Redis's current one-minute window (the per-address abuse windows follow Redis's
/// clock) has at least `need` seconds left, sleeping into the next window if it has not: a test
/// that counts within one window then never straddles two.
pub async fn minute_left<C: ConnectionLike>(conn: &mut C, need: u64) {
    let into = redis_now_ms(conn).await as u64 % 60_000;
    if 60_000 - into < need * 1000 {
        tokio::time::sleep(std::time::Duration::from_millis(60_000 - into + 50)).await;
    }
}

/// A fresh Redis and demo API, and the builder of a `NO_ADMISSION` room on them with `yaml`
/// merged in: for a test that adds to it (environment, files, more YAML) or starts more than one
/// proxy of the room. Start each with `start_settled`, so that nobody it queues is admitted.
pub fn quiet_builder(yaml: &str) -> (RedisServer, super::DemoApi, super::proxy::ProxyBuilder) {
    let redis = RedisServer::start();
    let api = super::DemoApi::start(&[]);
    let builder = Proxy::builder(&redis.url(), api.addr())
        .yaml(super::NO_ADMISSION)
        .yaml(yaml);
    (redis, api, builder)
}

/// A fresh Redis and demo API, and a proxy on them in a `NO_ADMISSION` room with `yaml` merged
/// in, started once its first (empty) admission tick has passed: nobody it queues is admitted.
pub async fn quiet_room(yaml: &str) -> (RedisServer, super::DemoApi, Proxy) {
    let (redis, api, builder) = quiet_builder(yaml);
    let proxy = start_settled(&redis, &builder).await;
    (redis, api, proxy)
}

/// A fresh Redis, a demo API started with `api_args`, and a ready proxy on them with `yaml`
/// merged in (not waiting for the first admission tick: see `quiet_room` for that).
pub async fn room(api_args: &[&str], yaml: &str) -> (RedisServer, super::DemoApi, Proxy) {
    let redis = RedisServer::start();
    let api = super::DemoApi::start(api_args);
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .yaml(yaml)
        .start()
        .await;
    (redis, api, proxy)
}

/// A fresh Redis, a [`Recorder`](super::Recorder) upstream answering `status`, and a ready proxy
/// between them with `yaml` merged in.
pub async fn recorded_room(status: u16, yaml: &str) -> (RedisServer, super::Recorder, Proxy) {
    let redis = RedisServer::start();
    let upstream = super::Recorder::start(status).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr()).yaml(yaml).start().await;
    (redis, upstream, proxy)
}

/// How many `EVALSHA` calls Redis has served since its statistics were last reset.
pub async fn evalsha_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut redis.conn().await).await.unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
        .unwrap_or(0)
}

/// Resets Redis's command statistics (`evalsha_calls` counts from here).
pub async fn reset_stats(redis: &RedisServer) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut redis.conn().await).await.unwrap();
}
