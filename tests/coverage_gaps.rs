//! Contract lines no other test held the proxy to (issue 36, "Tests that must be able to fail"):
//! held polls cost no Redis call per held user per tick (section 13); at most `queue.capacity`
//! polls are held (section 13); an upstream timeout is a slow answer for `adaptive` (sections 11
//! and 16); a stalled body on every own endpoint gets 408 (section 16).
//!
//! Each test names, in its comment, the break it was seen failing on.

mod common;

use common::*;
use std::time::{Duration, Instant};

/// Every Redis command's call count so far, from `INFO commandstats`, leaving out the test's own
/// `INFO` and `CONFIG` calls.
async fn redis_calls(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut redis.conn().await).await.expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:") && !l.starts_with("cmdstat_config"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// `n` status polls through `proxy`, each on its own task; each ends with its answer.
fn poll_all(proxy: &Proxy, users: &[String]) -> Vec<tokio::task::JoinHandle<Result<Resp, reqwest::Error>>> {
    users
        .iter()
        .map(|u| {
            let (url, client, user) = (proxy.url("/queue/status"), proxy.client().clone(), u.clone());
            tokio::spawn(async move { try_send(client.get(url).header("X-User-Id", &user)).await })
        })
        .collect()
}

async fn until_held(proxy: &Proxy, n: u64) {
    let held = wait_until(Duration::from_secs(10), Duration::from_millis(20), || async {
        proxy.metric("waitroom_held_polls").await == Some(n as f64)
    })
    .await;
    assert!(held, "waitroom_held_polls never read {n}: {:?}", proxy.metric("waitroom_held_polls").await);
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i}")).collect()
}

/// Enters each of `users` (each must be queued), then reloads the room with `yaml` merged in by
/// SIGHUP and waits for the reload to be counted.
async fn enter_then_reload(proxy: &Proxy, users: &[String], yaml: &str) {
    for user in users {
        assert_eq!(proxy.enter(user).await.status, 200, "enter {user}");
    }
    proxy.rewrite_config(yaml);
    proxy.signal("HUP");
    let reloaded = wait_until(Duration::from_secs(5), Duration::from_millis(20), || async {
        proxy.counter("waitroom_config_reloads_total{result=\"ok\"}").await >= 1.0
    })
    .await;
    assert!(reloaded, "reload not applied:\n{}", proxy.logs());
}

/// Section 13: "holding costs no Redis call per held user per tick". 200 polls are held while
/// the room admits one user every 100 ms; the Redis calls of one second with them held are
/// compared with the calls of one second with the same line and nobody polling (about 750 here:
/// the line watcher's readings, admission, the event and state watchers). Asking Redis once per
/// held user per admission tick would add 200 x 10 = 2,000 calls; the bound allows half the idle
/// figure again (a starved window reads less) plus 150 (the users admitted meanwhile each read
/// their answer once).
/// Seen red: each held poll made to wake every 100 ms and ask Redis (`room.status`) before
/// re-arming: 13,078 extra calls. (Waking every poll at each reading of the front is not a
/// break this test sees: a woken poll is answered from the proxy's own view of the line.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_polls_cost_no_redis_call_per_held_user_per_tick() {
    const N: usize = 200;
    // Position 300 at 10 a second is 30 s away: within a 60 s hold, every poll is held.
    let (redis, _api, proxy) = quiet_room("endpoints: {hold: 60s}\nqueue: {capacity: 1000}").await;
    let users = names("c", N + 100);
    // Admission starts once they are in line, by a reload to 1 user per 100 ms: the ticks to count.
    enter_then_reload(&proxy, &users, "admission: {interval: 100ms, batch_size: 1}").await;
    let ticking = wait_until(Duration::from_secs(5), Duration::from_millis(20), || async {
        proxy.counter("waitroom_admitted_total").await >= 1.0
    })
    .await;
    assert!(ticking, "admission never started after the reload");

    let window = Duration::from_secs(1);
    let measure = || async {
        let (calls, admitted) = (redis_calls(&redis).await, proxy.counter("waitroom_admitted_total").await);
        tokio::time::sleep(window).await;
        (redis_calls(&redis).await - calls, proxy.counter("waitroom_admitted_total").await - admitted)
    };
    let (idle_calls, idle_ticks) = measure().await;
    // The back 200 of the line hold polls (the front 100 are admitted meanwhile, unpolled).
    let polls = poll_all(&proxy, &users[100..]);
    until_held(&proxy, N as u64).await;
    let (held_calls, held_ticks) = measure().await;
    let still = proxy.metric("waitroom_held_polls").await.unwrap_or(0.0);
    println!("1 s, nobody held: {idle_calls} Redis calls, {idle_ticks} admitted; 1 s, {N} held: {held_calls} calls, {held_ticks} admitted, {still} still held");
    assert!(idle_ticks >= 5.0 && held_ticks >= 5.0, "admission must tick meanwhile: {idle_ticks}, {held_ticks}");
    assert!(still >= (N - 20) as f64, "the polls must stay held through the window: {still}");
    // Half the idle figure again as slack: a window the loaded machine starved has fewer of the
    // line watcher's readings, whatever is held.
    assert!(
        held_calls <= idle_calls + idle_calls / 2 + 150,
        "{N} held polls added {} Redis calls in {held_ticks} ticks (per held user per tick would be {})",
        held_calls.saturating_sub(idle_calls),
        N as f64 * held_ticks
    );
    drop(proxy);
    for p in polls {
        let _ = p.await;
    }
}

/// Section 13: "at most `queue.capacity` polls are held". Five users wait; a reload lowers the
/// capacity to three (the line keeps its five); of five polls three are held and the other two
/// are answered at once, WAITING with a `pollAfter` of at least 1.
/// Seen red: the limit handed to `HeldPolls::hold` (proxy/status.rs) set to `usize::MAX`: five
/// held, no poll answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_polls_are_held_than_the_queue_capacity() {
    let (_redis, _api, proxy) = quiet_room("admission: {interval: 1h, batch_size: 50}\nendpoints: {hold: 10s}\nqueue: {capacity: 5}").await;
    let users = names("k", 5);
    enter_then_reload(&proxy, &users, "queue: {capacity: 3}").await;
    let started = Instant::now();
    let polls = poll_all(&proxy, &users);
    let mut at_once = Vec::new();
    for (user, p) in users.iter().zip(polls) {
        // A held poll lasts the whole 10 s hold here; one answered within 3 s was not held.
        if let Ok(r) = tokio::time::timeout(Duration::from_secs(3).saturating_sub(started.elapsed()), p).await {
            let r = r.unwrap().expect("status poll");
            assert_eq!(r.status, 200, "{user}: {}", r.body);
            let body = r.json();
            assert_eq!(body["status"], "WAITING", "{user}: {body}");
            assert!(body["pollAfter"].as_u64().is_some_and(|a| a >= 1), "{user} answered at once must not be told to ask at once: {body}");
            at_once.push(user.clone());
        }
    }
    let held = proxy.metric("waitroom_held_polls").await;
    println!("answered at once: {at_once:?}; held: {held:?}");
    assert_eq!(held, Some(3.0), "capacity 3: three polls held");
    assert_eq!(at_once.len(), 2, "the polls beyond the capacity are answered at once: {at_once:?}");
}

/// Sections 11 and 16: an upstream that does not answer within `upstream_timeout` counts as a
/// slow response for `admission.adaptive`. Every protected request here times out (the upstream
/// answers after 10 s, the timeout is 300 ms, the target p95 100 ms); the batch must leave its
/// ceiling of 10 within a few seconds, as it would for answers slower than the target.
/// Seen red: the `latencies().record` in `fail_to_proxy` (proxy/mod.rs) removed: the batch stays
/// at 10 (no protected response is heard of, so the batch is left unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_timeout_moves_the_adaptive_batch_down() {
    let redis = RedisServer::start();
    let upstream = Recorder::start_slow(201, Duration::from_secs(10)).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr())
        .yaml(
            "admission: {interval: 100ms, batch_size: 10, adaptive: {target_p95: 100ms, min_batch: 1}}\n\
             limits: {upstream_timeout: 300ms}\nqueue: {capacity: 1000}",
        )
        .start()
        .await;
    let batch = || async { proxy.metric("waitroom_admission_batch").await };
    assert_eq!(batch().await, Some(10.0), "the batch starts at its ceiling:\n{}", proxy.metrics().await);
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut timeouts = 0;
    let mut i = 0;
    let moved = loop {
        if batch().await.is_some_and(|b| b < 10.0) {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        // A fresh user each time: a timed-out order's outcome is unknown, and spends the token.
        i += 1;
        let user = format!("t{i}");
        let token = proxy.until_ready(&user, Duration::from_secs(5)).await;
        let r = proxy.order(&user, Some(&token)).await;
        assert_eq!(r.status, 504, "{user}: {}", r.body);
        timeouts += 1;
    };
    println!("{timeouts} timed-out orders; batch now {:?}", batch().await);
    assert!(moved, "after {timeouts} upstream timeouts the adaptive batch is still {:?}", batch().await);
}

/// Section 16: "a request body to the proxy's own endpoints that stalls past `header_timeout`
/// gets 408". Each endpoint on `listen` gets a body that declares 10 bytes and sends 3.
/// Seen red: `own_body_refusal` (proxy/mod.rs) made to skip `Endpoint::Event` and
/// `EventDraw`: those two then answer without waiting for the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_on_every_own_endpoint() {
    let (_redis, _api, proxy) = room(&[], "limits: {header_timeout: 1s}\nevent: {opens_at: \"2020-01-01T00:00:00Z\", prequeue: 1m}").await;
    let endpoints = [
        ("POST", "/queue/enter"),
        ("GET", "/queue/status"),
        ("GET", "/queue/"),
        ("GET", "/queue/event"),
        ("GET", "/queue/event/draw"),
    ];
    let asks = endpoints.iter().map(|(method, path)| {
        let addr = proxy.addr();
        async move {
            let started = Instant::now();
            let head = format!("{method} {path} HTTP/1.1\r\nHost: waitroom\r\nX-User-Id: slow\r\nContent-Length: 10\r\n\r\nabc");
            let answer = raw_request(addr, head.as_bytes()).await;
            (*method, *path, answer, started.elapsed())
        }
    });
    for (method, path, answer, took) in futures::future::join_all(asks).await {
        println!("{method} {path}: {:?} after {took:?}", answer.lines().next());
        assert!(answer.starts_with("HTTP/1.1 408"), "{method} {path}: {answer}");
        assert!(answer.ends_with(r#"{"error":"the request body did not arrive in time"}"#), "{method} {path}: {answer}");
        assert!(took >= Duration::from_millis(950), "{method} {path}: 408 before header_timeout, after {took:?}");
    }
}

/// `n` status calls one after another as `user`; their times, sorted.
async fn status_times(proxy: &Proxy, user: &str, n: usize) -> Vec<Duration> {
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let (r, t) = timed(proxy.status(user)).await;
        assert_eq!(r.status, 200, "{user}: {}", r.body);
        took.push(t);
    }
    took.sort();
    took
}

fn ms(took: &[Duration]) -> Vec<u128> {
    took.iter().map(Duration::as_millis).collect()
}

/// Section 16: "with 1,000 connections trickling a request head one byte at a time, other
/// clients are answered as fast as before, each slow connection is closed once `header_timeout`
/// has passed, and the proxy's memory stays within the benchmarks' goal." Bounds, each over many
/// samples: another client's status calls, the 19th of 20, no slower than twice the 19th of 20
/// before the trickle plus 100 ms; every one of the 1,000 closed after `header_timeout` (3 s, less
/// 50 ms of timer slack) and within 2 s after it, each counted under
/// `limit="header_timeout"`; the proxy's RSS grown by at most 16 MiB for the 1,000 (16 KiB a
/// connection, against the benchmarks' goal of 64 MB for 10,000 idle ones, 6.4 KiB each, in a
/// release build; this is a debug one).
/// Seen red: the head deadline in the connection loop (src/limits.rs) made to count from the last
/// byte received instead of the first (a trickle then is never cut): none closed within the
/// bound; and 0.5 ms of blocking sleep per trickled byte in the connection loop: the other
/// client's calls over the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_trickling_connections_cost_others_nothing_and_are_cut_at_header_timeout() {
    const SLOW: usize = 1000;
    // 3 s: room to open the 1,000 and time the other client's calls before the first is cut.
    let header_timeout = Duration::from_secs(3);
    let (_redis, _api, proxy) = quiet_room("limits: {header_timeout: 3s}").await;
    assert_eq!(proxy.enter("fast").await.status, 200);
    let before = status_times(&proxy, "fast", 20).await;
    let rss_before = rss_kib(proxy.pid());

    let started = Instant::now();
    let slow: Vec<_> = (0..SLOW)
        .map(|i| {
            let addr = proxy.addr();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                // Timed from before the connect: the proxy's clock starts at its accept, which a
                // task scheduled late after its connect would otherwise see as early.
                let opened = Instant::now();
                let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect a slow client");
                let head = format!("GET /queue/status HTTP/1.1\r\nHost: waitroom\r\nX-User-Id: slow{i}\r\nX-Pad: ");
                let mut bytes = head.into_bytes().into_iter().chain(std::iter::repeat(b'a'));
                let mut buf = [0u8; 256];
                loop {
                    // One byte every 100 ms, staggered so the writes spread over the interval.
                    if s.write_all(&[bytes.next().unwrap()]).await.is_err() {
                        return opened.elapsed();
                    }
                    match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
                        Err(_) => {}
                        Ok(Ok(0)) | Ok(Err(_)) => return opened.elapsed(),
                        Ok(Ok(n)) => panic!("slow{i}: a trickled head was answered: {:?}", String::from_utf8_lossy(&buf[..n])),
                    }
                    if opened.elapsed() > Duration::from_secs(10) {
                        return opened.elapsed();
                    }
                }
            })
        })
        .collect();
    let opened = wait_until(Duration::from_secs(5), Duration::from_millis(20), || async {
        proxy.metric("waitroom_open_connections").await.is_some_and(|n| n >= SLOW as f64)
    })
    .await;
    assert!(opened, "the 1,000 slow connections never all opened: {:?}", proxy.metric("waitroom_open_connections").await);
    let rss_during = rss_kib(proxy.pid());
    let opened_by = started.elapsed();
    let during = status_times(&proxy, "fast", 20).await;
    println!("status before (ms): {:?}\nstatus with {SLOW} trickling (ms): {:?}", ms(&before), ms(&during));
    let bound = before[18] * 2 + Duration::from_millis(100);
    assert!(during[18] <= bound, "with {SLOW} trickling connections the 19th of 20 status calls took {:?}, over {bound:?}", during[18]);
    assert!(
        started.elapsed() < header_timeout,
        "the fast calls must run while the slow ones are open: done {:?} after the first connect (all open by {opened_by:?})",
        started.elapsed()
    );

    let mut closed_after = Vec::with_capacity(SLOW);
    for task in slow {
        closed_after.push(task.await.unwrap());
    }
    closed_after.sort();
    let (first, last) = (closed_after[0], closed_after[SLOW - 1]);
    let cut = proxy.counter("waitroom_connections_closed_total{limit=\"header_timeout\"}").await;
    println!(
        "slow connections closed after {first:?} .. {last:?} (median {:?}); counted {cut}\nRSS {rss_before} kB -> {rss_during} kB",
        closed_after[SLOW / 2]
    );
    assert!(first >= header_timeout - Duration::from_millis(50), "a slow connection was closed before header_timeout: {first:?}");
    assert!(last <= header_timeout + Duration::from_secs(2), "a slow connection was still open {last:?} after it opened");
    assert_eq!(cut, SLOW as f64, "each slow connection counted as cut by header_timeout");
    let grown = rss_during.saturating_sub(rss_before);
    assert!(grown <= 16 * 1024, "{SLOW} trickling connections grew the proxy's RSS by {grown} kB");
}
