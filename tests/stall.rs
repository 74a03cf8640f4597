//! Nothing piles up when a dependency stalls (issue 36): a frozen Redis leaves the proxy a bounded
//! queue of settles, not a task per request, and Redis no burst when it returns; a log reader that
//! stops reading never stops the proxy answering.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::stream::{self, StreamExt};

/// Every command Redis has run (`INFO commandstats`, asked on `conn`), by name.
async fn command_calls<C: redis::aio::ConnectionLike>(conn: &mut C) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

/// A fresh Redis, a demo API that takes 5 ms an order and honours `X-Demo-Delay-Ms`, and a proxy
/// on them with `yaml` merged in, to be shared with the tasks that send its orders.
async fn order_room(yaml: &str) -> (RedisServer, DemoApi, Arc<Proxy>) {
    let (redis, api, proxy) = room(&["--service-time-ms", "5", "--client-delays"], yaml).await;
    (redis, api, Arc::new(proxy))
}

/// The buyer's order with `token`, which the demo API holds for `delay_ms`, sent in the
/// background; returns once the order has reached the API.
async fn order_in_flight(proxy: &Arc<Proxy>, api: &DemoApi, token: &str, delay_ms: &str) -> tokio::task::JoinHandle<Resp> {
    let order = {
        let (proxy, token, delay_ms) = (proxy.clone(), token.to_owned(), delay_ms.to_owned());
        tokio::spawn(async move { send(proxy.order_request("buyer", Some(&token)).header("X-Demo-Delay-Ms", delay_ms)).await })
    };
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(5), || async {
            api.stats().await["inFlight"].as_u64() == Some(1)
        })
        .await,
        "the buyer's order never reached the upstream"
    );
    order
}

/// The queue's bound (`waitroom::room::claims::RETRY_BOUND`) and the members one call settles.
const QUEUE_CALLS: u64 = (waitroom::room::claims::RETRY_BOUND / waitroom::store::GROUP_MAX) as u64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_leaves_a_bounded_queue_and_no_burst_when_it_returns() {
    // One tick a second, which admits every user of the test at once: the ticks add little to
    // what Redis is asked after the freeze.
    let (redis, api, proxy) = order_room("admission: {interval: 1s, batch_size: 100}\ntoken: {ttl: 5m}\nredis: {timeout: 300ms}").await;
    let keys = keys(&proxy);
    // Real tokens: one whose order is in flight when Redis freezes, and some whose orders arrive
    // during the freeze.
    let buyer = proxy.until_ready("buyer", Duration::from_secs(10)).await;
    let mut real = Vec::new();
    for i in 0..20 {
        let user = format!("real-{i}");
        let token = proxy.until_ready(&user, Duration::from_secs(10)).await;
        real.push((user, token));
    }

    // The buyer's order is claimed, then Redis freezes while the upstream works on it: its 201
    // comes back during the freeze, and the spend cannot reach Redis.
    let slow_order = order_in_flight(&proxy, &api, &buyer, "800").await;
    let before = command_calls(&mut redis.conn().await).await;
    let rss_before = rss_kib(proxy.pid());
    redis.freeze();
    let frozen_at = Instant::now();
    let r = slow_order.await.unwrap();
    assert_eq!(r.status, 201, "the order that succeeded during the freeze: {}", r.body);

    // 3,000 protected requests with made-up tokens, and five orders of each real user, all refused.
    let sent = 3000 + 5 * real.len();
    let statuses: Vec<u16> = stream::iter(0..sent)
        .map(|i| {
            let proxy = proxy.clone();
            let (user, token) = if i < 5 * real.len() {
                real[i % real.len()].clone()
            } else {
                (format!("made-up-{i}"), format!("00000000-0000-4000-8000-{i:012}"))
            };
            async move { send(proxy.order_request(&user, Some(&token))).await.status }
        })
        .buffer_unordered(200)
        .collect()
        .await;
    let refused = statuses.iter().filter(|s| **s == 503).count();
    let froze_for = frozen_at.elapsed();
    let rss_frozen = rss_kib(proxy.pid());
    redis.thaw();
    assert_eq!(refused, sent, "every order during the freeze is a 503: {statuses:?}");

    // What Redis runs once it returns: what waited in the sockets, then the queue, in calls of
    // GROUP_MAX settles. The scripts and the MGETs they run are what a task per request made
    // thousands of (issue 36: 9,167 in the 3 s after a freeze like this one).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = command_calls(&mut redis.conn().await).await;
    let rss_after = rss_kib(proxy.pid());
    let delta: Vec<(String, u64)> = after
        .iter()
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let scripts = |calls: &std::collections::BTreeMap<String, u64>| {
        ["evalsha", "mget"].iter().map(|name| calls.get(*name).copied().unwrap_or(0)).sum::<u64>()
    };
    let calls = scripts(&after) - scripts(&before);
    println!(
        "frozen {froze_for:?} for {sent} orders; EVALSHA + MGET from the freeze to 3 s after it: {calls}; all commands: {delta:?}; \
         RSS kB before {rss_before}, frozen {rss_frozen}, 3 s after {rss_after}"
    );
    let spent = redis::cmd("EXISTS").arg(keys.token("buyer")).query_async::<i64>(&mut redis.conn().await).await == Ok(0);
    assert!(spent, "the buyer's token, whose order succeeded during the freeze, was not spent 3 s after Redis returned");
    // A settle call is one EVALSHA and two MGETs, a claim call one and one. Beside the queue's
    // calls: the claims' groups that waited in the socket (one a redis.timeout of freeze), and the
    // background services' scripts (ticks, watchers: a few a second).
    let claim_groups = froze_for.as_millis() as u64 / 300 + 2;
    let background = 10 * (froze_for.as_secs() + 4);
    let bound = 3 * QUEUE_CALLS + 2 * claim_groups + background;
    assert!(calls <= bound, "{calls} script calls and MGETs after the freeze, more than the queue's bound allows ({bound})");
    assert!(
        rss_frozen < rss_before + 64 * 1024,
        "the proxy grew from {rss_before} kB to {rss_frozen} kB during the freeze"
    );

    // The real users' claims that Redis ran when it returned were released by the queue: their
    // next order goes through rather than meeting 409 until claim_timeout.
    for (user, token) in &real {
        let r = proxy.order(user, Some(token)).await;
        assert_eq!(r.status, 201, "{user} after the freeze: {}", r.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_reader_that_stops_reading_never_stops_the_proxy() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let builder = Proxy::builder(&redis.url(), api.addr());
    let [listen, metrics] = free_ports();
    let (listen, metrics) = (
        std::net::SocketAddr::from(([127, 0, 0, 1], listen)),
        std::net::SocketAddr::from(([127, 0, 0, 1], metrics)),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    std::fs::write(&config, serde_yaml::to_string(&builder.config(listen, metrics)).unwrap()).unwrap();
    // stdout and stderr into pipes nobody reads: a log collector that stalled.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .arg("--config")
        .arg(&config)
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let client = http_client();
    let ready = wait_until(Duration::from_secs(20), Duration::from_millis(20), || async {
        client.get(format!("http://{metrics}/healthz")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(ready, "the proxy did not start");

    // Each request's access line carries its 8 KB path: 2,500 of them are 20 MB of log, five times
    // the buffer and three hundred times a pipe's.
    let long = "x".repeat(8 * 1024);
    let answered = std::sync::Mutex::new(Vec::new());
    let requests = stream::iter(0..2500)
        .map(|i| {
            let request = client.get(format!("http://{listen}/{long}{i}")).timeout(Duration::from_secs(10));
            async move { request.send().await.map(|r| r.status().as_u16()).unwrap_or(0) }
        })
        .buffer_unordered(16)
        .for_each(|status| {
            answered.lock().unwrap().push(status);
            async {}
        });
    // Unblocked, they take a few seconds; a proxy that waits on its log never finishes them.
    let finished = tokio::time::timeout(Duration::from_secs(60), requests).await.is_ok();
    let answered = answered.into_inner().unwrap();
    let unanswered = answered.iter().filter(|s| **s == 0).count() + (2500 - answered.len());
    let status = client.get(format!("http://{listen}/queue/status")).header("X-User-Id", "late").timeout(Duration::from_secs(5)).send().await;
    let text = client.get(format!("http://{metrics}/metrics")).timeout(Duration::from_secs(5)).send().await;
    let dropped = match text {
        Ok(r) => parse_metric(&r.text().await.unwrap_or_default(), "waitroom_log_lines_dropped_total"),
        Err(_) => None,
    };
    let _ = child.kill();
    let _ = child.wait();
    println!("unanswered: {unanswered} of {}; log lines dropped: {dropped:?}", answered.len());
    assert!(finished && unanswered == 0, "requests left unanswered while nobody read the log: {unanswered}");
    assert!(status.is_ok_and(|r| r.status() == 200), "a status poll after them was not answered");
    assert!(dropped.is_some_and(|n| n > 0.0), "no dropped line counted: {dropped:?}");
}

/// A graceful stop gives the queue what is left of `shutdown.grace`: a spend that met a frozen
/// Redis reaches it when Redis returns before the proxy exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_waits_for_queued_spends() {
    let (redis, api, proxy) =
        order_room("admission: {interval: 100ms, batch_size: 10}\ntoken: {ttl: 5m}\nredis: {timeout: 300ms}\nshutdown: {grace: 10s}").await;
    let token = proxy.until_ready("buyer", Duration::from_secs(10)).await;
    let order = order_in_flight(&proxy, &api, &token, "500").await;
    redis.freeze();
    assert_eq!(order.await.unwrap().status, 201);
    // The spend has met the freeze (redis.timeout) and waits in the queue.
    tokio::time::sleep(Duration::from_millis(600)).await;
    proxy.signal("TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(proxy.is_running(), "the proxy exited with a spend still queued:\n{}", proxy.logs());
    redis.thaw();
    let status = proxy.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(status.map(|s| s.code()), Some(Some(0)), "{}", proxy.logs());
    let left: i64 = redis::cmd("EXISTS").arg(keys(&proxy).token("buyer")).query_async(&mut redis.conn().await).await.unwrap();
    assert_eq!(left, 0, "the queued spend never reached Redis before the proxy exited:\n{}", proxy.logs());
}

/// What a proxy with nobody to serve leaves in the sockets of a frozen Redis: the line watcher's
/// readings (a MULTI each, every 10 ms while Redis answers) and the connections' keep-alive PINGs
/// (every 250 ms). Each that timed out is still run when Redis wakes, so the two back off while
/// Redis does not answer: a few a second, not one per period.
#[tokio::test]
async fn background_calls_back_off_while_redis_is_frozen() {
    let (redis, _api, proxy) = room(&[], "admission: {interval: 1h}\nredis: {timeout: 100ms}").await;
    // Opened before the freeze, so asking right after it costs no accept behind the pile.
    let mut ask = redis.conn().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = command_calls(&mut ask).await;
    let frozen = Duration::from_secs(4);
    redis.freeze();
    tokio::time::sleep(frozen).await;
    redis.thaw();
    // Long enough for Redis to run what waited, short enough for few new calls (about 5 readings).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = command_calls(&mut ask).await;
    let ran = |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    let (readings, pings) = (ran("multi"), ran("ping"));
    println!("frozen {frozen:?}: {readings} line readings and {pings} PINGs ran when Redis woke");
    // Without the back-off (seen: 45 readings, 64 PINGs from 4 connections): a reading per
    // timeout and a PING per 250 ms per connection. With it (seen: 11 and 16): doubling pauses
    // up to 500 ms and 1,750 ms.
    assert!(readings <= 20, "{readings} line readings piled up in {frozen:?}");
    assert!(pings <= 32, "{pings} PINGs piled up in {frozen:?}");
    assert!(proxy.is_running());
}
