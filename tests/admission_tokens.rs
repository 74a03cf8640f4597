//! Admission and entry tokens, black-box: the proxy binary in front of the demo order API, with a
//! private Redis per test (contract sections 3 and 5).
//!
//! When each user was admitted is read in two ways. From outside, by polling `status` (what a
//! client sees, coarse). And exactly, from Redis: a token is written with `PX ttl` at the instant
//! of its admission, so `ttl - PTTL`, read for every user in one atomic script together with
//! Redis's clock, gives each admission's time in Redis milliseconds. The key names come from the
//! library's `store::Keys`, so these tests follow the layout rather than restate it.
//!
//! Timing assertions are loose (lower bounds from the schedule, upper bounds several times the
//! expected value): the CI machines have two cores, shared by every process of every test.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const LONG_TTL_MS: i64 = 300_000;

// ---- helpers ----------------------------------------------------------------------------------

fn users(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i:03}")).collect()
}

/// For each user, when (Redis ms) their live token was issued; None without a token.
async fn admission_times(
    redis: &RedisServer,
    prefix: &str,
    users: &[String],
    ttl_ms: i64,
) -> Vec<Option<i64>> {
    let keys = Keys::new(prefix);
    let script = redis::Script::new(
        r"local t = redis.call('TIME')
          local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
          for _, k in ipairs(KEYS) do out[#out + 1] = redis.call('PTTL', k) end
          return out",
    );
    let mut call = script.prepare_invoke();
    for u in users {
        call.key(keys.token(u));
    }
    let reply: Vec<i64> = call
        .invoke_async(&mut redis.conn().await)
        .await
        .expect("PTTLs");
    let now = reply[0];
    reply[1..]
        .iter()
        .map(|&pttl| (pttl > 0).then(|| now - (ttl_ms - pttl)))
        .collect()
}

/// Admission instants sorted, grouped into batches: (time of the batch, users in it). One
/// admission is one script run, so its tokens share one instant (give or take the 1 ms of PTTL
/// rounding); a late tick followed by an on-time one can come only a few ms apart, so anything
/// wider than that is another batch.
fn batches(times: &[i64]) -> Vec<(i64, usize)> {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(i64, usize)> = Vec::new();
    for t in sorted {
        match out.last_mut() {
            Some((last, n)) if t - *last <= 2 => *n += 1,
            _ => out.push((t, 1)),
        }
    }
    out
}

/// The most admissions within any window of `window_ms` (half-open).
fn max_in_window(times: &[i64], window_ms: i64) -> usize {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    (0..sorted.len())
        .map(|i| {
            sorted[i..]
                .iter()
                .take_while(|&&t| t < sorted[i] + window_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// No batch over `batch`, and never more than two batches' worth within any 100 ms (the
/// interval in these tests): admission never bursts, not even to catch up.
#[track_caller]
fn assert_paced(times: &[i64], groups: &[(i64, usize)], batch: usize) {
    assert!(
        groups.iter().all(|g| g.1 <= batch),
        "a batch over {batch}: {groups:?}"
    );
    assert!(
        max_in_window(times, 100) <= 2 * batch,
        "more than two batches within 100 ms: {groups:?}"
    );
}

/// The line drained within `ms` (milliseconds): not faster than the rate, nor far slower.
#[track_caller]
fn assert_drained(drained: Duration, ms: std::ops::RangeInclusive<u64>, what: &str) {
    let bounds = Duration::from_millis(*ms.start())..=Duration::from_millis(*ms.end());
    assert!(
        bounds.contains(&drained),
        "{what}: drained in {drained:?}, not within {bounds:?}"
    );
}

fn gaps(batches: &[(i64, usize)]) -> Vec<i64> {
    batches.windows(2).map(|w| w[1].0 - w[0].0).collect()
}

async fn polled(proxy: &Proxy, user: &str) -> Value {
    let r = proxy.status(user).await;
    assert_eq!(r.status, 200, "status {user}: {}", r.body);
    r.json()
}

/// Polls `user`'s status every 10 ms until READY; returns the body and when it was seen.
async fn await_ready(proxy: &Proxy, user: &str, timeout: Duration) -> (Value, Instant) {
    let deadline = Instant::now() + timeout;
    loop {
        let body = polled(proxy, user).await;
        if body["status"] == "READY" {
            return (body, Instant::now());
        }
        assert!(
            Instant::now() < deadline,
            "{user} not READY within {timeout:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn enter_waiting(proxy: &Proxy, user: &str) -> Value {
    let r = proxy.enter(user).await;
    assert_eq!(r.status, 200, "enter {user}: {}", r.body);
    let body = r.json();
    assert_eq!(body["status"], "WAITING", "enter {user}: {body}");
    body
}

/// Queues `users` in the room of `prefix` straight in Redis, in order, as proxies would have.
async fn seed_line<U: AsRef<str>>(redis: &RedisServer, prefix: &str, users: &[U]) {
    let seed = library_room(redis, prefix);
    for u in users {
        enter_room(&seed, u.as_ref(), 100_000).await.expect("seed");
    }
}

/// A fresh Redis and `fast_api`, a room prefix, and a builder of proxies for that room.
fn prefixed_room(yaml: &str) -> (RedisServer, DemoApi, String, ProxyBuilder) {
    let redis = RedisServer::start();
    let api = fast_api();
    let prefix = unique_prefix();
    let builder = Proxy::builder(&redis.url(), api.addr())
        .key_prefix(&prefix)
        .yaml(yaml);
    (redis, api, prefix, builder)
}

/// A room admitting `batch` every 100 ms (tokens living 5 min) and `n` users `tag-000`.. who
/// entered it in order, each told WAITING; with when the first enter was sent.
async fn line_of(
    n: usize,
    tag: &str,
    batch: usize,
) -> (RedisServer, DemoApi, Proxy, Vec<String>, Instant) {
    let yaml = format!("admission: {{interval: 100ms, batch_size: {batch}}}\ntoken: {{ttl: 5m}}");
    let (redis, api, proxy) = room_with(&yaml).await;
    let line = users(tag, n);
    let t0 = Instant::now();
    for u in &line {
        enter_waiting(&proxy, u).await;
    }
    (redis, api, proxy, line, t0)
}

/// A request on a protected route (or any path) with identity and token as given.
fn request(
    proxy: &Proxy,
    method: reqwest::Method,
    path: &str,
    user: Option<&str>,
    token: Option<&str>,
) -> reqwest::RequestBuilder {
    let mut req = proxy.client().request(method, proxy.url(path));
    if let Some(user) = user {
        req = req.header("X-User-Id", user);
    }
    if let Some(token) = token {
        req = req.header("X-Entry-Token", token);
    }
    req
}

fn order(proxy: &Proxy, user: Option<&str>, token: Option<&str>) -> reqwest::RequestBuilder {
    request(proxy, reqwest::Method::POST, "/api/orders", user, token)
        .header("content-type", "application/json")
        .body(r#"{"item":"widget","quantity":1}"#)
}

/// Orders the demo API has seen (completed + failed).
async fn orders_seen(api: &DemoApi) -> u64 {
    let s = api.stats().await;
    s["completed"].as_u64().unwrap()
        + s["failed"].as_u64().unwrap()
        + s["inFlight"].as_u64().unwrap()
}

/// Orders of 20 ms, and a test may make one slower with `X-Demo-Delay-Ms`.
const FAST_API: [&str; 3] = ["--service-time-ms", "20", "--client-delays"];

fn fast_api() -> DemoApi {
    DemoApi::start(&FAST_API)
}

/// A running proxy configured with `yaml`, on a fresh Redis, in front of `fast_api`.
async fn room_with(yaml: &str) -> (RedisServer, DemoApi, Proxy) {
    room(&FAST_API, yaml).await
}

async fn tokens_room() -> (RedisServer, DemoApi, Proxy) {
    room_with(TOKENS_YAML).await
}

/// When (Redis ms) each of `users` was admitted; every one of them must hold a token.
async fn issued_times(redis: &RedisServer, prefix: &str, users: &[String]) -> Vec<i64> {
    admission_times(redis, prefix, users, LONG_TTL_MS)
        .await
        .into_iter()
        .zip(users)
        .map(|(t, u)| t.unwrap_or_else(|| panic!("{u} holds no token")))
        .collect()
}

/// Protected: the orders route, and an echoing one so that a test can see what reached the API.
const TOKENS_YAML: &str = "admission: {interval: 50ms, batch_size: 10}\n\
    protected: [{method: POST, path: /api/orders}, {method: POST, path: /api/checkout}]";

// ---- the rate, the order, the spacing ---------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_is_fifo_at_the_configured_rate() {
    let (redis, _api, proxy, line, t0) = line_of(60, "fifo", 5).await;
    let enqueued = t0.elapsed();

    // Sweeps in reverse arrival order: a user polled later in a sweep arrived earlier, so once
    // someone is READY, everybody polled after them must be too, and a waiting user's position
    // must be below that of every (later-arrived) user polled before them.
    let mut first_ready: Vec<Option<Duration>> = vec![None; line.len()];
    let mut violations = Vec::new();
    let mut sweeps = 0;
    while first_ready.iter().any(Option::is_none) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "line not drained: {first_ready:?}"
        );
        sweeps += 1;
        let mut ready_later: Option<usize> = None;
        let mut waiting_later: Option<(usize, u64)> = None;
        for i in (0..line.len()).rev() {
            let body = polled(&proxy, &line[i]).await;
            match body["status"].as_str() {
                Some("READY") => {
                    first_ready[i].get_or_insert(t0.elapsed());
                    ready_later.get_or_insert(i);
                }
                Some("WAITING") => {
                    let pos = body["position"].as_u64().unwrap();
                    if let Some(j) = ready_later {
                        violations
                            .push(format!("{} READY while {} still waiting", line[j], line[i]));
                    }
                    if let Some((j, pj)) = waiting_later {
                        if pos >= pj {
                            violations
                                .push(format!("{} at {pos}, later {} at {pj}", line[i], line[j]));
                        }
                    }
                    waiting_later = Some((i, pos));
                }
                _ => violations.push(format!("{}: {body}", line[i])),
            }
        }
    }
    assert!(
        violations.is_empty(),
        "admission out of arrival order: {violations:?}"
    );
    let drained = first_ready.iter().flatten().max().copied().unwrap();

    let times: Vec<i64> = issued_times(&redis, &proxy.key_prefix(), &line).await;
    // Batches are ~100 ms apart; 2 ms of slack absorbs the PTTL rounding within one batch.
    for i in 1..times.len() {
        assert!(
            times[i - 1] <= times[i] + 2,
            "{} admitted {} ms after {}",
            line[i - 1],
            times[i - 1] - times[i],
            line[i]
        );
    }
    let groups = batches(&times);
    let span = times[times.len() - 1] - times[0];
    println!(
        "fifo: 60 users entered in {enqueued:?}; all READY after {drained:?} ({sweeps} sweeps); \
         Redis: {} batches over {span} ms, sizes {:?}, gaps {:?}",
        groups.len(),
        groups.iter().map(|g| g.1).collect::<Vec<_>>(),
        gaps(&groups)
    );
    assert_paced(&times, &groups, 5);
    assert!(groups.len() >= 12, "{groups:?}");
    // 60 users at 50/s: twelve batches, eleven intervals at least between the first and the last.
    assert_drained(drained, 1100..=4800, "60 users at 50/s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_evenly_spaced_never_a_burst() {
    let (redis, _api, proxy, line, t0) = line_of(100, "even", 10).await;
    let (_, last_ready) = await_ready(&proxy, &line[99], Duration::from_secs(20)).await;
    let drained = last_ready - t0;

    let times: Vec<i64> = issued_times(&redis, &proxy.key_prefix(), &line).await;
    let groups = batches(&times);
    let g = gaps(&groups);
    let mut sorted = g.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    println!(
        "even: 100 users drained in {drained:?}; {} batches, sizes {:?}, gaps {g:?} (median {median} ms)",
        groups.len(),
        groups.iter().map(|g| g.1).collect::<Vec<_>>()
    );
    assert_paced(&times, &groups, 10);
    assert!(
        (80..=150).contains(&median),
        "batches not ~100 ms apart: {g:?}"
    );
    // Ten batches, nine intervals; the first may come early in its interval (the schedule was
    // set by the start-up tick before anybody entered), hence 800 ms.
    assert_drained(drained, 800..=4000, "100 users at 100/s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intervals_missed_while_no_proxy_ran_are_not_made_up() {
    let (redis, _api, prefix, builder) =
        prefixed_room("admission: {interval: 100ms, batch_size: 5}\ntoken: {ttl: 5m}");

    // The room has run (its schedule is in Redis), then its only proxy died.
    let first = builder.start().await;
    first.until_ready("early", Duration::from_secs(5)).await;
    first.kill();

    // Forty users wait through ten missed intervals with no proxy at all.
    let line = users("missed", 40);
    seed_line(&redis, &prefix, &line).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let second = builder.start().await;
    await_ready(&second, &line[39], Duration::from_secs(20)).await;
    let times: Vec<i64> = issued_times(&redis, &prefix, &line).await;
    let groups = batches(&times);
    println!(
        "resume: sizes {:?}, gaps {:?}",
        groups.iter().map(|g| g.1).collect::<Vec<_>>(),
        gaps(&groups)
    );
    assert_paced(&times, &groups, 5);
    let span = times[39] - times[0];
    assert!(
        span >= 690,
        "40 users at 50/s took only {span} ms (eight batches, seven intervals)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_batch_leaves_within_one_interval_of_start() {
    let redis = RedisServer::start();
    let api = fast_api();
    let interval = Duration::from_secs(1);

    // A line that formed before any proxy ran.
    let prefix = unique_prefix();
    seed_line(&redis, &prefix, &["pre-1", "pre-2"]).await;
    let spawned = Instant::now();
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .key_prefix(&prefix)
        .yaml("admission: {interval: 1s, batch_size: 1}\ntoken: {ttl: 5m}")
        .start()
        .await;
    let ready = Instant::now();
    let (_, first) = await_ready(&proxy, "pre-1", Duration::from_secs(5)).await;
    assert_eq!(
        polled(&proxy, "pre-2").await["status"],
        "WAITING",
        "batch_size is 1"
    );
    let (_, second) = await_ready(&proxy, "pre-2", Duration::from_secs(5)).await;
    println!(
        "seeded line: proxy up after {:?}, first READY {:?} after start-up, second {:?} later",
        ready - spawned,
        first - ready,
        second - first
    );
    assert!(
        first - ready <= interval + Duration::from_millis(200),
        "first batch {:?}",
        first - ready
    );
    let times = admission_times(
        &redis,
        &prefix,
        &["pre-1".into(), "pre-2".into()],
        LONG_TTL_MS,
    )
    .await;
    let between = times[1].unwrap() - times[0].unwrap();
    assert!(
        (950..=1600).contains(&between),
        "second batch {between} ms after the first"
    );

    // An empty room: the first user to enter after start-up leaves within one interval of it.
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .yaml("admission: {interval: 1s, batch_size: 1}\ntoken: {ttl: 5m}")
        .start()
        .await;
    let ready = Instant::now();
    enter_waiting(&proxy, "first").await;
    let (_, admitted) = await_ready(&proxy, "first", Duration::from_secs(5)).await;
    println!(
        "empty room: first user READY {:?} after start-up",
        admitted - ready
    );
    assert!(
        admitted - ready <= interval + Duration::from_millis(200),
        "{:?}",
        admitted - ready
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_restarted_with_a_shorter_interval_admits_within_it() {
    let redis = RedisServer::start();
    let api = fast_api();
    let prefix = unique_prefix();
    let room = Proxy::builder(&redis.url(), api.addr()).key_prefix(&prefix);
    // The room ran slowly (one user per 30 s): its start-up tick admitted the one waiting user,
    // so the next admission is scheduled 30 s later. Then its operator restarts it faster.
    seed_line(&redis, &prefix, &["waiting-before"]).await;
    let slow = room
        .clone()
        .yaml("admission: {interval: 30s, batch_size: 1}")
        .start()
        .await;
    await_ready(&slow, "waiting-before", Duration::from_secs(5)).await;
    slow.kill();
    let fast = room
        .yaml("admission: {interval: 100ms, batch_size: 1}")
        .start()
        .await;
    let started = Instant::now();
    enter_waiting(&fast, "eager").await;
    let deadline = started + Duration::from_secs(3);
    let (admitted, last) = loop {
        let body = polled(&fast, "eager").await;
        if body["status"] == "READY" || Instant::now() >= deadline {
            break (body["status"] == "READY", body);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!(
        "after restart with interval 100ms: READY={admitted} after {:?}",
        started.elapsed()
    );
    // "The first batch leaves within one interval of start": the schedule the slow proxy left
    // in Redis (next admission 30 s later) must not hold back the new rate.
    assert!(
        admitted,
        "not admitted within 3 s of a restart with interval 100ms: {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_admit_at_the_rate_of_one_room_and_go_on_when_one_dies() {
    let redis = RedisServer::start();
    let api = fast_api();
    let builder = Proxy::builder(&redis.url(), api.addr())
        .yaml("admission: {interval: 100ms, batch_size: 5}\ntoken: {ttl: 5m}");
    let a = builder.start().await;
    let b = builder.start().await;
    let prefix = a.key_prefix();
    assert_eq!(prefix, b.key_prefix());

    let line = users("pair", 150);
    let t0 = Instant::now();
    for (i, u) in line.iter().enumerate() {
        enter_waiting(if i % 2 == 0 { &a } else { &b }, u).await;
    }
    let (_, hundredth) = await_ready(&b, &line[99], Duration::from_secs(20)).await;
    a.kill();
    let killed_at = redis_now_ms(&mut redis.conn().await).await;
    let after_kill = Instant::now();
    let (_, last) = await_ready(&b, &line[149], Duration::from_secs(20)).await;

    let times: Vec<i64> = issued_times(&redis, &prefix, &line).await;
    // Both proxies: from the first batch to the batch of user 100.
    let both: Vec<i64> = times.iter().copied().filter(|&t| t <= times[99]).collect();
    let first_batch = batches(&both)[0].1;
    let rate_both = (both.len() - first_batch) as f64 / ((times[99] - times[0]) as f64 / 1000.0);
    // One proxy: admissions after the kill, over the time since the kill.
    let alone: Vec<i64> = times.iter().copied().filter(|&t| t > killed_at).collect();
    let rate_alone = alone.len() as f64 / ((times[149] - killed_at) as f64 / 1000.0);
    let groups = batches(&times);
    println!(
        "two proxies: 100 users READY after {:?} -> {rate_both:.1}/s (Redis); after the kill {} \
         users in {:?} -> {rate_alone:.1}/s; expected 50/s; batch sizes {:?}",
        hundredth - t0,
        alone.len(),
        last - after_kill,
        groups.iter().map(|g| g.1).collect::<Vec<_>>()
    );
    assert!(
        groups.iter().all(|g| g.1 <= 5),
        "two proxies admitted together: {groups:?}"
    );
    assert!(max_in_window(&times, 100) <= 10, "{groups:?}");
    assert!(
        rate_both < 75.0,
        "two proxies admit {rate_both:.1}/s, the room's rate is 50/s"
    );
    assert!(rate_both > 12.5, "two proxies admit only {rate_both:.1}/s");
    assert!(
        alone.len() >= 20,
        "too few admissions after the kill to measure: {}",
        alone.len()
    );
    assert!(rate_alone < 75.0, "after the kill {rate_alone:.1}/s");
    assert!(
        rate_alone > 25.0,
        "the surviving proxy admits only {rate_alone:.1}/s, not 50/s"
    );
}

// ---- entry tokens on protected requests -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_token_passes_the_request_through_unchanged_and_is_spent_on_2xx() {
    let (_redis, api, proxy) = tokens_room().await;

    // The echoing protected route shows what reached the API: exactly what the API would have
    // seen without the proxy.
    let token = proxy.until_ready("alice", Duration::from_secs(5)).await;
    let checkout = |client: &reqwest::Client, base: &str| {
        client
            .post(format!("{base}/api/checkout?cart=7&x=a%20b"))
            .header("X-User-Id", "alice")
            .header("X-Entry-Token", &token)
            .header("X-Custom", "kept as is")
            .header("X-Echo-Status", "202")
            .header("content-type", "text/plain")
            .body("line one\nline two")
    };
    let r = send(checkout(proxy.client(), &proxy.url(""))).await;
    let direct = send(checkout(&http_client(), &api.url(""))).await;
    assert_eq!(r.status, 202, "the upstream's status: {}", r.body);
    assert_same_upstream_headers(&r, &direct);
    assert_eq!(
        echo_without_host(&r),
        echo_without_host(&direct),
        "the request changed on the way"
    );
    let echo = r.json();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/api/checkout");
    assert_eq!(echo["query"], "cart=7&x=a%20b");
    assert_eq!(echo["body"], "line one\nline two");
    let headers: Vec<(String, String)> = serde_json::from_value(echo["headers"].clone()).unwrap();
    for (name, value) in [
        ("x-user-id", "alice"),
        ("x-entry-token", token.as_str()),
        ("x-custom", "kept as is"),
        ("x-echo-status", "202"),
        ("content-type", "text/plain"),
    ] {
        assert!(
            headers.iter().any(|(n, v)| n == name && v == value),
            "{name}: {value} did not reach the upstream: {headers:?}"
        );
    }
    // Spent on the 2xx, before the client got it.
    let again = send(order(&proxy, Some("alice"), Some(&token))).await;
    assert_error("403", &again, 403);
    assert_eq!(polled(&proxy, "alice").await["status"], "NOT_IN_QUEUE");

    // The orders route: 201 and the API's body, unchanged.
    let token = proxy.until_ready("bob", Duration::from_secs(5)).await;
    let before = api.stats().await["completed"].as_u64().unwrap();
    let r = send(order(&proxy, Some("bob"), Some(&token))).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    assert_eq!(body.as_object().unwrap().len(), 2, "{body}");
    assert_eq!(body["user"], "bob");
    assert!(body["orderId"].as_u64().is_some(), "{body}");
    assert_eq!(api.stats().await["completed"].as_u64().unwrap(), before + 1);

    let again = send(order(&proxy, Some("bob"), Some(&token))).await;
    assert_error("403", &again, 403);
    assert_eq!(
        api.stats().await["completed"].as_u64().unwrap(),
        before + 1,
        "repeat forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_keep_the_token_for_a_retry() {
    let (_redis, api, proxy) = tokens_room().await;
    let token = proxy.until_ready("carol", Duration::from_secs(5)).await;

    for fail in ["409", "500", "503"] {
        let r = send(order(&proxy, Some("carol"), Some(&token)).header("X-Demo-Fail", fail)).await;
        assert_eq!(r.status.to_string(), fail, "{}", r.body);
        assert_eq!(
            r.json(),
            serde_json::json!({"error": "forced failure"}),
            "the API's body"
        );
        let s = polled(&proxy, "carol").await;
        assert_eq!(
            (s["status"].as_str(), s["token"].as_str()),
            (Some("READY"), Some(&*token)),
            "after {fail}"
        );
    }
    for echo_status in ["404", "502"] {
        let r = send(
            request(
                &proxy,
                reqwest::Method::POST,
                "/api/checkout",
                Some("carol"),
                Some(&token),
            )
            .header("X-Echo-Status", echo_status),
        )
        .await;
        assert_eq!(r.status.to_string(), echo_status, "{}", r.body);
        assert_eq!(r.header("x-echo"), Some("yes"));
        assert_eq!(
            polled(&proxy, "carol").await["token"],
            token,
            "after echo {echo_status}"
        );
    }
    let stats = api.stats().await;
    assert_eq!(stats["failed"], 3, "{stats}");

    // The retry goes through, and spends it.
    let r = send(order(&proxy, Some("carol"), Some(&token))).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_error(
        "403",
        &send(order(&proxy, Some("carol"), Some(&token))).await,
        403,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_json_502_and_keeps_the_token() {
    let redis = RedisServer::start();
    let api = fast_api();
    let builder = Proxy::builder(&redis.url(), api.addr()).yaml(TOKENS_YAML);
    let good = builder.start().await;
    // Same room, but its upstream is a port that refuses connections (checked, not assumed).
    let closed = refused_addr();
    let broken = builder
        .clone()
        .yaml(&format!("upstream: \"{closed}\""))
        .start()
        .await;

    let token = good.until_ready("dave", Duration::from_secs(5)).await;
    let started = Instant::now();
    let r = send(order(&broken, Some("dave"), Some(&token))).await;
    println!("502 after {:?}", started.elapsed());
    assert_error("502", &r, 502);
    assert_eq!(
        polled(&good, "dave").await["token"],
        token,
        "token kept after 502"
    );
    let r = send(order(&broken, Some("dave"), Some(&token))).await;
    assert_error("502", &r, 502);
    // Both count as upstream responses of class "error" (section 4), and as nothing else.
    let errors = "waitroom_upstream_responses_total{class=\"error\"}";
    let counted = wait_until(
        Duration::from_secs(3),
        Duration::from_millis(20),
        || async { broken.counter(errors).await == 2.0 },
    )
    .await;
    assert!(counted, "{errors}:\n{}", broken.metrics().await);
    for class in ["2xx", "3xx", "4xx", "5xx"] {
        let series = format!("waitroom_upstream_responses_total{{class=\"{class}\"}}");
        assert_eq!(broken.counter(&series).await, 0.0, "{series}");
    }

    assert_eq!(orders_seen(&api).await, 0);
    let r = send(order(&good, Some("dave"), Some(&token))).await;
    assert_eq!(
        r.status, 201,
        "the retry through a working proxy: {}",
        r.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_the_users_current_token_are_refused_and_never_forwarded() {
    let (_redis, api, proxy) = tokens_room().await;
    let erin = proxy.until_ready("erin", Duration::from_secs(5)).await;
    let frank = proxy.until_ready("frank", Duration::from_secs(5)).await;
    assert_ne!(erin, frank);

    // X-Demo-Fail makes a forwarded order fail at once, so the API's counters show any leak.
    let attempt = |path: &str, user: Option<&str>, token: Option<&str>| {
        let req = request(&proxy, reqwest::Method::POST, path, user, token)
            .header("content-type", "application/json")
            .header("X-Demo-Fail", "500")
            .body(r#"{"item":"widget","quantity":1}"#);
        async move { send(req).await }
    };
    let mut wrong_token = erin.clone();
    wrong_token.replace_range(0..1, if erin.starts_with('0') { "1" } else { "0" });
    let made_up = uuid::Uuid::new_v4().to_string();
    let longer = format!("{erin}0");
    let too_long = "e".repeat(257);
    let orders = "/api/orders";
    // (what, path, identity, token, expected status)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, Option<&'a str>, u16);
    let cases: Vec<Case> = vec![
        ("no token header", orders, Some("erin"), None, 403),
        ("empty token", orders, Some("erin"), Some(""), 403),
        (
            "another user's token",
            orders,
            Some("erin"),
            Some(&frank),
            403,
        ),
        ("a made-up token", orders, Some("erin"), Some(&made_up), 403),
        (
            "one character off",
            orders,
            Some("erin"),
            Some(&wrong_token),
            403,
        ),
        (
            "a prefix of the token",
            orders,
            Some("erin"),
            Some(&erin[..35]),
            403,
        ),
        (
            "the token and more",
            orders,
            Some("erin"),
            Some(&longer),
            403,
        ),
        (
            "a user never admitted",
            orders,
            Some("ghost"),
            Some(&erin),
            403,
        ),
        (
            "no token, with a query string",
            "/api/orders?coupon=1",
            Some("erin"),
            None,
            403,
        ),
        ("no identity", orders, None, Some(&erin), 401),
        ("empty identity", orders, Some(""), Some(&erin), 401),
        // Section 3: a bad identity is 400, before the token is even looked at.
        (
            "identity of 257 bytes",
            orders,
            Some(&too_long),
            Some(&erin),
            400,
        ),
        (
            "identity with a tab",
            orders,
            Some("er\tin"),
            Some(&erin),
            400,
        ),
    ];
    for (what, path, user, token, expected) in cases {
        let r = attempt(path, user, token).await;
        assert_eq!(r.status, expected, "{what}: {}", r.body);
        assert_error(what, &r, expected);
    }
    let stats = api.stats().await;
    assert_eq!(
        orders_seen(&api).await,
        0,
        "a refused request reached the API: {stats}"
    );

    // The refusals spent nothing.
    assert_eq!(polled(&proxy, "erin").await["token"], erin);
    assert_eq!(
        send(order(&proxy, Some("erin"), Some(&erin))).await.status,
        201
    );
    assert_eq!(
        send(order(&proxy, Some("frank"), Some(&frank)))
            .await
            .status,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_requests_fail_closed_while_redis_is_down() {
    // Persistent, so that the token is still there when Redis comes back.
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let api = fast_api();
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .yaml(TOKENS_YAML)
        .yaml("redis: {timeout: 300ms}")
        .start()
        .await;
    let token = proxy.until_ready("gina", Duration::from_secs(5)).await;

    // Hanging Redis: refused once the Redis call times out.
    // Then a gone one.
    for frozen in [true, false] {
        if frozen {
            redis.freeze();
        } else {
            redis.stop();
        }
        // Section 3: within redis.timeout + 100 ms. Asserted on all but one in twenty samples, so
        // one request a starved scheduler delays cannot fail it, and a real delay cannot pass.
        let mut took = Vec::new();
        for _ in 0..20 {
            let (r, t) = timed(send(order(&proxy, Some("gina"), Some(&token)))).await;
            assert_error("503", &r, 503);
            assert_eq!(r.header("retry-after"), Some("30"));
            took.push(t);
        }
        let (nineteenth, ms) = all_but_the_slowest(&mut took);
        println!("503s in ms (frozen: {frozen}), sorted: {ms:?}");
        let bound = Duration::from_millis(300 + 100);
        assert!(
            nineteenth <= bound,
            "frozen: {frozen}: the 19th of 20 503s took {nineteenth:?}, over redis.timeout + 100 ms; all (ms): {ms:?}"
        );
    }
    assert_eq!(
        orders_seen(&api).await,
        0,
        "forwarded without a token check"
    );

    // Redis back: the same token works again (the refusals spent nothing).
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        let status = send(order(&proxy, Some("gina"), Some(&token))).await.status;
        if status != 503 || Instant::now() >= deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(status, 503, "still 503 five seconds after Redis came back");
    assert_eq!(status, 201, "the token did not survive the outage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_whose_token_was_used_enters_again_at_the_back() {
    let redis = RedisServer::start();
    let api = fast_api();
    // One user per 1.5 s: nobody leaves the line while the test looks at it.
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .yaml("admission: {interval: 1500ms, batch_size: 1}")
        .start()
        .await;
    let token = proxy.until_ready("alice", Duration::from_secs(5)).await;
    let others = users("behind", 5);
    for u in &others {
        enter_waiting(&proxy, u).await;
    }
    assert_eq!(
        send(order(&proxy, Some("alice"), Some(&token)).header("X-Demo-Delay-Ms", "0"))
            .await
            .status,
        201
    );

    let back = enter_waiting(&proxy, "alice").await;
    let mut positions = Vec::new();
    for u in &others {
        positions.push(polled(&proxy, u).await["position"].as_u64());
    }
    let alice = polled(&proxy, "alice").await;
    assert_eq!(
        positions,
        (1..=5).map(Some).collect::<Vec<_>>(),
        "no admission in between"
    );
    assert_eq!(back["position"], 6, "alice re-entered at the back: {back}");
    assert_eq!(alice["position"], 6, "{alice}");
    // The old token is gone for good.
    assert_error(
        "403",
        &send(order(&proxy, Some("alice"), Some(&token))).await,
        403,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spending_an_expired_token_never_deletes_the_users_newer_one() {
    let (_redis, _api, proxy) =
        room_with("admission: {interval: 50ms, batch_size: 10}\ntoken: {ttl: 2s}").await;
    let old = proxy.until_ready("ines", Duration::from_secs(5)).await;
    let started = Instant::now();
    // A slow order with the old token: checked now, answered (201) after the token expired and
    // the user was admitted again with a new one.
    let slow = tokio::spawn(send(
        order(&proxy, Some("ines"), Some(&old)).header("X-Demo-Delay-Ms", "3000"),
    ));
    let expired = wait_until(
        Duration::from_secs(4),
        Duration::from_millis(20),
        || async { polled(&proxy, "ines").await["status"] == "NOT_IN_QUEUE" },
    )
    .await;
    assert!(expired, "the old token never expired");
    enter_waiting(&proxy, "ines").await;
    let (ready, _) = await_ready(&proxy, "ines", Duration::from_secs(2)).await;
    let newer = ready["token"].as_str().unwrap().to_owned();
    assert_ne!(newer, old);
    assert!(
        started.elapsed() < Duration::from_millis(2900),
        "too slow to test the race"
    );

    let r = slow.await.unwrap();
    assert_eq!(r.status, 201, "the slow order: {}", r.body);
    let after = polled(&proxy, "ines").await;
    assert_eq!(
        after["token"], newer,
        "the old order's success deleted the newer token: {after}"
    );
    assert_eq!(
        send(order(&proxy, Some("ines"), Some(&newer))).await.status,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_expire_after_their_ttl() {
    let (_redis, api, proxy) =
        room_with("admission: {interval: 50ms, batch_size: 10}\ntoken: {ttl: 2s}").await;
    enter_waiting(&proxy, "hank").await;
    let (first, admitted) = await_ready(&proxy, "hank", Duration::from_secs(5)).await;
    let token = first["token"].as_str().unwrap().to_owned();
    let first_expires = first["expiresIn"].as_u64().unwrap();
    assert!(
        matches!(first_expires, 1 | 2),
        "right after admission: {first}"
    );
    assert_eq!(first["pollAfter"], Value::Null);

    // Enter while READY answers the READY body.
    let r = proxy.enter("hank").await.json();
    assert_eq!(
        (r["status"].as_str(), r["token"].as_str()),
        (Some("READY"), Some(&*token)),
        "{r}"
    );

    let mut seen = vec![first_expires];
    let gone = loop {
        let body = polled(&proxy, "hank").await;
        match body["status"].as_str() {
            Some("READY") => {
                assert_eq!(body["token"], token);
                seen.push(body["expiresIn"].as_u64().unwrap());
            }
            Some("NOT_IN_QUEUE") => break admitted.elapsed(),
            _ => panic!("{body}"),
        }
        assert!(
            admitted.elapsed() < Duration::from_secs(5),
            "token never expired: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("expired {gone:?} after READY; expiresIn seen {:?}", {
        let mut d = seen.clone();
        d.dedup();
        d
    });
    assert!(
        seen.windows(2).all(|w| w[0] >= w[1]),
        "expiresIn went up: {seen:?}"
    );
    assert!(seen.iter().all(|s| (1..=2).contains(s)), "{seen:?}");
    assert!(seen.contains(&1), "never counted down to 1: {seen:?}");
    assert!(
        gone >= Duration::from_millis(1500) && gone <= Duration::from_secs(3),
        "{gone:?}"
    );

    assert_error(
        "403",
        &send(order(&proxy, Some("hank"), Some(&token))).await,
        403,
    );
    assert_eq!(orders_seen(&api).await, 0);
    // An expired user may queue again.
    enter_waiting(&proxy, "hank").await;
}

// ---- everything else passes through -----------------------------------------------------------

/// The echo as the API returned it, without `host` (the address each client connected to).
fn echo_without_host(r: &Resp) -> Value {
    let mut echo = r.json();
    let headers = echo["headers"].as_array_mut().expect("echo headers");
    headers.retain(|h| h[0] != "host");
    echo
}

/// The `host` the API saw.
fn echoed_host(r: &Resp) -> String {
    let echo = r.json();
    let host = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h[0] == "host")
        .cloned();
    host.and_then(|h| h[1].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Every response header of the API's direct answer (but `date`) came back through the proxy.
fn assert_same_upstream_headers(via_proxy: &Resp, direct: &Resp) {
    for (name, value) in &direct.headers {
        if name == "date" {
            continue;
        }
        assert_eq!(
            via_proxy.headers.get(name),
            Some(value),
            "{name} changed on the way back: {:?} vs {:?}",
            via_proxy.headers,
            direct.headers
        );
    }
}

fn pass_through_requests(
    client: &reqwest::Client,
    base: &str,
) -> Vec<(&'static str, reqwest::RequestBuilder)> {
    let url = |p: &str| format!("{base}{p}");
    vec![
        (
            "GET with query",
            client
                .get(url("/search?q=red%20shoes&page=2&q=x"))
                .header("X-Custom", "one"),
        ),
        (
            "PUT with body",
            client
                .put(url("/api/items/7"))
                .header("content-type", "application/json")
                .header("X-Custom", "two")
                .header("X-User-Id", "ivy")
                .body(r#"{"quantity":3}"#),
        ),
        (
            "DELETE",
            client
                .delete(url("/api/items/7?hard=1"))
                .header("X-Entry-Token", "not-checked"),
        ),
        (
            "POST elsewhere",
            client.post(url("/api/other")).body("payload"),
        ),
        (
            "GET on the protected path",
            client.get(url("/api/orders?page=1")),
        ),
        (
            "POST to a longer path",
            client.post(url("/api/orders/42")).body("x"),
        ),
        (
            "the upstream's status",
            client.get(url("/teapot")).header("X-Echo-Status", "418"),
        ),
    ]
}

/// Every pass-through request reaches the upstream, answered in under 500 ms whatever Redis does.
async fn assert_passes_quickly(proxy: &Proxy, redis_state: &str) {
    for (what, req) in pass_through_requests(proxy.client(), &proxy.url("")) {
        let (r, took) = timed(send(req)).await;
        let echoed = r.header("x-echo") == Some("yes");
        assert!(echoed, "{what} with {redis_state}: {}", r.body);
        assert!(
            took < Duration::from_millis(500),
            "{what} with {redis_state}: {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_else_passes_through_unchanged_without_redis() {
    let mut redis = RedisServer::start();
    let api = fast_api();
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .yaml("redis: {timeout: 1s}")
        .start()
        .await;
    let direct = http_client();

    let via_proxy = pass_through_requests(proxy.client(), &proxy.url(""));
    let straight = pass_through_requests(&direct, &api.url(""));
    for ((what, p), (_, d)) in via_proxy.into_iter().zip(straight) {
        let (p, d) = (send(p).await, send(d).await);
        assert_eq!(p.status, d.status, "{what}: {}", p.body);
        assert_eq!(p.header("x-echo"), Some("yes"), "{what}: {:?}", p.headers);
        assert_same_upstream_headers(&p, &d);
        assert_eq!(
            echo_without_host(&p),
            echo_without_host(&d),
            "{what}: request changed on the way"
        );
        assert_eq!(
            echoed_host(&p),
            proxy.addr().to_string(),
            "{what}: the client's Host"
        );
    }
    assert_eq!(orders_seen(&api).await, 0);

    // No Redis call on the way: a hanging Redis (1 s timeout) does not slow pass-through down...
    redis.freeze();
    assert_passes_quickly(&proxy, "Redis frozen").await;
    // ...while a request that needs Redis does wait for it.
    let started = Instant::now();
    assert_eq!(proxy.enter("ivy").await.status, 503);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "enter did not ask Redis?"
    );
    // ...and a stopped one does not break it.
    redis.stop();
    assert_passes_quickly(&proxy, "Redis stopped").await;
}

// ---- a crash loses nothing --------------------------------------------------------------------

/// Each user's (status, position, token) as `proxy` answers them.
async fn room_as_seen<'a>(
    proxy: &Proxy,
    users: &[&'a str],
) -> BTreeMap<&'a str, (Value, Value, Value)> {
    let mut seen = BTreeMap::new();
    for &u in users {
        let s = polled(proxy, u).await;
        seen.insert(
            u,
            (
                s["status"].clone(),
                s["position"].clone(),
                s["token"].clone(),
            ),
        );
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_proxy_loses_no_queued_user_and_no_token() {
    // One admission of two at start-up, then none for an hour: the room holds still.
    let (redis, _api, prefix, builder) = prefixed_room("admission: {interval: 1h, batch_size: 2}");
    seed_line(&redis, &prefix, &["k1", "k2", "k3"]).await;
    let first = builder.start().await;
    await_ready(&first, "k2", Duration::from_secs(5)).await;
    for u in ["k4", "k5", "k6"] {
        enter_waiting(&first, u).await;
    }
    let all = ["k1", "k2", "k3", "k4", "k5", "k6"];
    let before = room_as_seen(&first, &all).await;
    assert_eq!(before["k1"].0, "READY");
    assert_eq!(before["k3"].1, 1);
    assert_eq!(before["k6"].1, 4);

    first.kill();
    let second = builder.start().await;
    let after = room_as_seen(&second, &all).await;
    assert_eq!(after, before, "the room changed across a crash");
    let again = enter_waiting(&second, "k3").await;
    assert_eq!(again["position"], 1, "k3 kept the place");
    let token = before["k1"].2.as_str().unwrap();
    assert_eq!(
        send(order(&second, Some("k1"), Some(token))).await.status,
        201
    );
}
