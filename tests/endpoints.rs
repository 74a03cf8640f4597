//! The proxy's own endpoints, `POST {prefix}/enter` and `GET {prefix}/status`, checked from the
//! outside against contract section 3: exact bodies (parsed JSON compared with whole expected
//! objects, so an extra key fails), exact status codes and headers, the identity rules, the cap
//! under a burst, and the answers while Redis is stopped or hangs.
//!
//! Each test owns its redis-server, its upstream and its proxies; several assertions share one
//! proxy start to keep the file fast.

mod common;

use common::*;
use futures::future::join_all;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

// ---- helpers --------------------------------------------------------------------------------

/// Each `(ctx, call, user, body)` in order: `call` ("enter" or "status") as `user` answers 200
/// with the JSON headers and exactly `body`.
async fn assert_answers<C: AsRef<str>, U: AsRef<str>>(
    proxy: &Proxy,
    cases: &[(C, &str, U, Value)],
) {
    for (ctx, call, user, body) in cases {
        let user = user.as_ref();
        let r = match *call {
            "enter" => proxy.enter(user).await,
            "status" => proxy.status(user).await,
            other => panic!("no such call: {other}"),
        };
        assert_answer(ctx.as_ref(), &r, 200, body.clone());
    }
}

/// A response read off a raw socket.
#[derive(Debug)]
struct RawResp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl RawResp {
    fn parse(raw: &str) -> RawResp {
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        RawResp {
            status,
            headers,
            body: body.to_owned(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn is_json(&self) -> bool {
        self.header("content-type")
            .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("application/json"))
    }
}

/// `method path` with `X-User-Id: <identity bytes>` written as they are.
async fn raw_with_identity(proxy: &Proxy, method: &str, path: &str, identity: &[u8]) -> RawResp {
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: waitroom.test\r\nX-User-Id: ").into_bytes();
    req.extend_from_slice(identity);
    req.extend_from_slice(b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    RawResp::parse(&raw_request(proxy.addr(), &req).await)
}

// ---- enter and status: WAITING, positions, estimated wait, pollAfter ------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_numbers_arrivals_and_status_agrees() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    // rate = 4 / 30 s. Positions 1..=4 are the first batch (eta 0 -> pollAfter 2); beyond it
    // eta = ceil(p * 30 / 4): 5 -> 38 (37.5 rounded up), 6 -> 45, 7 -> 53, all in the 5 s tier;
    // 8 -> 60 (exactly the 10 s tier's min_wait), 9 -> 68. The next tick is 30 s after start.
    let builder =
        Proxy::builder(&redis.url(), api.addr()).yaml("admission: {interval: 30s, batch_size: 4}");
    let proxy = start_settled(&redis, &builder).await;

    // (position, estimatedWaitTime, pollAfter) of user-1..=user-9.
    let expected: Vec<Value> = [(1, 0, 2), (2, 0, 2), (3, 0, 2), (4, 0, 2), (5, 38, 5)]
        .into_iter()
        .chain([(6, 45, 5), (7, 53, 5), (8, 60, 10), (9, 68, 10)])
        .map(|(p, eta, poll)| waiting(p, eta, poll))
        .collect();
    for (i, want) in expected.iter().enumerate() {
        let user = format!("user-{}", i + 1);
        let r = proxy.enter(&user).await;
        assert_answer(&format!("first enter of {user}"), &r, 200, want.clone());
    }

    // Entering again, after others joined, keeps the place; status says the same.
    for (i, want) in expected.iter().enumerate() {
        let user = format!("user-{}", i + 1);
        assert_answers(
            &proxy,
            &[
                (
                    format!("second enter of {user}"),
                    "enter",
                    &user,
                    want.clone(),
                ),
                (format!("status of {user}"), "status", &user, want.clone()),
            ],
        )
        .await;
    }

    // A newcomer goes to the back; nobody ahead moved.
    assert_answers(
        &proxy,
        &[
            ("newcomer", "enter", "user-10", waiting(10, 75, 10)),
            ("user-1 again", "enter", "user-1", waiting(1, 0, 2)),
        ],
    )
    .await;

    // Someone never seen.
    assert_answers(
        &proxy,
        &[("stranger", "status", "stranger", not_in_queue())],
    )
    .await;

    // The query string is ignored on both endpoints.
    let c = proxy.client();
    for (ctx, method, path_and_query, user, want) in [
        (
            "status?x=1",
            "GET",
            "/queue/status?x=1",
            "user-6",
            waiting(6, 45, 5),
        ),
        (
            "status?x=1 stranger",
            "GET",
            "/queue/status?x=1",
            "stranger",
            not_in_queue(),
        ),
        (
            "enter?x=1, waiting",
            "POST",
            "/queue/enter?from=ad&x=1",
            "user-3",
            waiting(3, 0, 2),
        ),
        (
            "enter?x=1, new",
            "POST",
            "/queue/enter?x=1",
            "user-11",
            waiting(11, 83, 10),
        ),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let r = send(
            c.request(method, proxy.url(path_and_query))
                .header("X-User-Id", user),
        )
        .await;
        assert_answer(ctx, &r, 200, want);
    }

    assert_eq!(queue_len(&redis, &proxy).await, 11, "one place per user");
}

// ---- READY ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_users_get_ready_from_status_and_enter() {
    let (redis, api, proxy) = room(&[], "admission: {interval: 100ms, batch_size: 10}\ntoken: {ttl: 60s}").await;

    let token = proxy.until_ready("reader", Duration::from_secs(10)).await;
    let status_token = assert_ready(
        "status of an admitted user",
        &proxy.status("reader").await,
        60,
    );
    assert_eq!(status_token, token, "status repeats the same token");

    // Entering while holding a live token answers the READY body of status, same token.
    let enter_token = assert_ready(
        "enter of an admitted user",
        &proxy.enter("reader").await,
        60,
    );
    assert_eq!(enter_token, token, "enter does not issue another token");
    assert_eq!(
        queue_len(&redis, &proxy).await,
        0,
        "a READY user is not queued again"
    );

    // A second admitted user gets a different token.
    let other = proxy.until_ready("reader-2", Duration::from_secs(10)).await;
    assert_ne!(other, token, "tokens are per user");
    assert_uuid_v4(&other);

    assert_answers(&proxy, &[("stranger", "status", "nobody", not_in_queue())]).await;

    // Once the token has expired the user is neither waiting nor admitted; enter queues anew.
    let short = Proxy::builder(&redis.url(), api.addr())
        .yaml("admission: {interval: 100ms, batch_size: 10}\ntoken: {ttl: 1s}")
        .start()
        .await;
    let token = short.until_ready("brief", Duration::from_secs(10)).await;
    assert_eq!(
        assert_ready("status with ttl 1s", &short.status("brief").await, 1),
        token
    );
    let expired = wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async { short.status("brief").await.json() == not_in_queue() },
    )
    .await;
    assert!(expired, "a 1 s token still READY after 5 s");
    assert_answers(
        &short,
        &[
            ("expired, status", "status", "brief", not_in_queue()),
            ("expired, enter again", "enter", "brief", waiting(1, 0, 2)),
        ],
    )
    .await;
}

// ---- 405 ----------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_get_405_with_allow_whatever_the_headers() {
    let (redis, _api, proxy) = quiet_room("{}").await;
    let c = proxy.client();
    let long = "a".repeat(257);

    let cases: [(&str, &[&str], &str); 2] = [
        (
            "/queue/enter",
            &["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"],
            "POST",
        ),
        (
            "/queue/status",
            &["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"],
            "GET",
        ),
    ];
    // No identity, a good one, a bad one (too long): the method is checked first.
    let identities: [Option<&str>; 4] = [None, Some("alice"), Some(""), Some(&long)];
    for (path, methods, allow) in cases {
        for method in methods {
            for identity in identities {
                let ctx = format!("{method} {path} with identity {:?}", identity.map(str::len));
                let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
                let mut req = c.request(m, proxy.url(path));
                if let Some(id) = identity {
                    req = req.header("X-User-Id", id);
                }
                let r = send(req).await;
                assert_eq!(r.status, 405, "{ctx}: {}", r.body);
                assert_eq!(r.header("allow"), Some(allow), "{ctx}: Allow");
                assert_own_headers(&ctx, r.header("content-type"), r.header("cache-control"));
                if *method != "HEAD" {
                    assert_error_body(&ctx, &r.json());
                } else {
                    assert_eq!(r.body, "", "{ctx}: HEAD answers carry no body");
                }
            }
        }
    }
    // A query string does not dodge the check.
    let r = send(
        c.get(proxy.url("/queue/enter?x=1"))
            .header("X-User-Id", "alice"),
    )
    .await;
    assert_eq!(
        (r.status, r.header("allow")),
        (405, Some("POST")),
        "{}",
        r.body
    );

    // None of that queued anybody.
    assert_answers(
        &proxy,
        &[("alice after 405s", "status", "alice", not_in_queue())],
    )
    .await;
    assert_eq!(queue_len(&redis, &proxy).await, 0);
}

// ---- identity: 401 / 400 ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_is_required_and_checked_on_both_endpoints() {
    let (redis, _api, proxy) = quiet_room("{}").await;
    let c = proxy.client();
    let endpoints = [("POST", "/queue/enter"), ("GET", "/queue/status")];

    for (method, path) in endpoints {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        // Missing.
        let r = send(c.request(m.clone(), proxy.url(path))).await;
        assert_error(&format!("{method} {path} without identity"), &r, 401);
        // Empty.
        let r = send(
            c.request(m.clone(), proxy.url(path))
                .header("X-User-Id", ""),
        )
        .await;
        assert_error(&format!("{method} {path} with empty identity"), &r, 401);
        // Empty on the wire, and only blanks (which the parser strips as surrounding space).
        for id in [&b""[..], b"   ", b" \t "] {
            let raw = raw_with_identity(&proxy, method, path, id).await;
            let ctx = format!(
                "{method} {path} raw identity {:?}",
                String::from_utf8_lossy(id)
            );
            assert_eq!(raw.status, 401, "{ctx}: {raw:?}");
            assert!(raw.is_json(), "{ctx}: {raw:?}");
            assert_error_body(&ctx, &serde_json::from_str(&raw.body).unwrap());
        }

        // 257 bytes: too long (reqwest sends it fine).
        let r = send(
            c.request(m.clone(), proxy.url(path))
                .header("X-User-Id", "a".repeat(257)),
        )
        .await;
        assert_error(&format!("{method} {path} with 257-byte identity"), &r, 400);

        // Bytes outside printable ASCII that HTTP parsers accept in a header value (a tab inside
        // the value, obs-text 0xe9) reach the proxy: its own JSON 400.
        for (name, id) in [
            ("257 bytes", vec![b'a'; 257]),
            ("a tab inside", b"ab\tcd".to_vec()),
            ("0xe9", b"caf\xe9".to_vec()),
        ] {
            let raw = raw_with_identity(&proxy, method, path, &id).await;
            let ctx = format!("{method} {path} raw identity with {name}");
            assert_eq!(raw.status, 400, "{ctx}: {raw:?}");
            assert!(raw.is_json(), "{ctx}: not JSON: {raw:?}");
            assert!(
                raw.header("cache-control")
                    .is_some_and(|v| v.contains("no-store")),
                "{ctx}: Cache-Control: {raw:?}"
            );
            assert_error_body(&ctx, &serde_json::from_str(&raw.body).unwrap());
        }

        // Control bytes the parser may refuse itself: a 400 either way (ours in JSON, or the
        // parser's plain one), and the proxy stays up.
        for (name, id) in [("0x01", b"a\x01b".to_vec()), ("0x7f", b"a\x7fb".to_vec())] {
            let raw = raw_with_identity(&proxy, method, path, &id).await;
            let ctx = format!("{method} {path} raw identity with {name}");
            assert_eq!(raw.status, 400, "{ctx}: {raw:?}");
            if raw.is_json() {
                assert_error_body(&ctx, &serde_json::from_str(&raw.body).unwrap());
            }
            println!("{ctx}: json={} body={:?}", raw.is_json(), raw.body);
            assert_answers(
                &proxy,
                &[(format!("after {ctx}"), "status", "alive", not_in_queue())],
            )
            .await;
        }
    }

    // Exactly 256 bytes, all printable (space and ~ included), is a fine identity.
    let id256 = format!("a b~!{}", "z".repeat(251));
    assert_eq!(id256.len(), 256);
    assert_answers(
        &proxy,
        &[
            ("enter with 256 bytes", "enter", &id256, waiting(1, 0, 2)),
            ("status with 256 bytes", "status", &id256, waiting(1, 0, 2)),
        ],
    )
    .await;
    let max = "a".repeat(256);
    assert_answers(
        &proxy,
        &[("enter with 256 'a's", "enter", &max, waiting(2, 7200, 10))],
    )
    .await;

    assert_eq!(
        queue_len(&redis, &proxy).await,
        2,
        "refused identities queued nobody"
    );
}

// ---- FULL -------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_room_answers_429_with_retry_after() {
    let (redis, api, proxy) = quiet_room("queue: {capacity: 3}").await;

    for (i, user) in ["a", "b", "c"].iter().enumerate() {
        let p = i as u64 + 1;
        let eta = if p <= 1 { 0 } else { p * 3600 };
        assert_answer(
            user,
            &proxy.enter(user).await,
            200,
            waiting(p, eta, if p <= 1 { 2 } else { 10 }),
        );
    }
    for _ in 0..2 {
        let r = proxy.enter("d").await;
        assert_full("4th user", &r, 30);
    }
    // Users already waiting still get their place when the room is full.
    assert_answers(
        &proxy,
        &[
            ("a when full", "enter", "a", waiting(1, 0, 2)),
            ("c when full", "enter", "c", waiting(3, 10800, 10)),
            ("status of the refused user", "status", "d", not_in_queue()),
        ],
    )
    .await;
    assert_eq!(queue_len(&redis, &proxy).await, 3);

    // queue.retry_after sets R in both places.
    let builder7 = Proxy::builder(&redis.url(), api.addr())
        .yaml(NO_ADMISSION)
        .yaml("queue: {capacity: 1, retry_after: 7s}");
    let proxy7 = start_settled(&redis, &builder7).await;
    assert_answers(&proxy7, &[("first of one", "enter", "x", waiting(1, 0, 2))]).await;
    let r = proxy7.enter("y").await;
    assert_full("second of one", &r, 7);
}

// ---- concurrency --------------------------------------------------------------------------------

/// `users` concurrent enters of distinct users, spread round-robin over `proxies` (all of one
/// `NO_ADMISSION` room of `capacity`): exactly `capacity` places, numbered 1..=capacity with no
/// number given twice, everyone else FULL, and the line in Redis holding exactly `capacity`.
async fn assert_burst_fills_to_capacity(
    redis: &RedisServer,
    proxies: &[Proxy],
    users: usize,
    capacity: u64,
) {
    let burst = Instant::now();
    let answers = join_all((0..users).map(|i| {
        let proxy = &proxies[i % proxies.len()];
        let req = proxy
            .client()
            .post(proxy.url("/queue/enter"))
            .header("X-User-Id", format!("burst-{i}"));
        tokio::spawn(send(req))
    }))
    .await;
    println!(
        "{users} concurrent enters through {} proxies took {:?}",
        proxies.len(),
        burst.elapsed()
    );

    let mut positions = BTreeSet::new();
    let mut full = 0;
    for a in answers {
        let r = a.expect("task");
        match r.status {
            200 => {
                assert_own_headers(
                    "burst 200",
                    r.header("content-type"),
                    r.header("cache-control"),
                );
                let body = r.json();
                let p = body["position"].as_u64().expect("position");
                assert_eq!(body, waiting_no_admission(p, 2, 10));
                assert!(positions.insert(p), "position {p} given twice");
            }
            429 => {
                assert_full("burst 429", &r, 30);
                full += 1;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    assert_eq!(
        positions,
        (1..=capacity).collect::<BTreeSet<u64>>(),
        "exactly capacity users got a place, numbered 1..=capacity"
    );
    assert_eq!(
        full,
        users - capacity as usize,
        "everyone else was told FULL"
    );
    assert_eq!(
        queue_len(redis, &proxies[0]).await,
        capacity,
        "the line in Redis holds capacity users"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_enters_never_exceeds_capacity_or_shares_a_number() {
    let (redis, _api, proxy) = quiet_room("queue: {capacity: 500}").await;
    assert_burst_fills_to_capacity(&redis, &[proxy], 1000, 500).await;
}

/// The cap is the room's, not each proxy's (section 5): three proxies sharing one room, each
/// taking a third of a concurrent burst, still give out exactly `capacity` places between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enters_through_three_proxies_never_exceed_the_rooms_capacity() {
    let (redis, _api, room) = quiet_builder("queue: {capacity: 200}");
    let mut proxies = Vec::new();
    for _ in 0..3 {
        proxies.push(start_settled(&redis, &room).await);
    }
    assert_burst_fills_to_capacity(&redis, &proxies, 600, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enters_by_one_user_make_one_place() {
    let (redis, _api, proxy) = quiet_room("{}").await;

    assert_answers(&proxy, &[("first", "enter", "first", waiting(1, 0, 2))]).await;
    let url = proxy.url("/queue/enter");
    let answers = join_all((0..50).map(|_| {
        let c = proxy.client().clone();
        let url = url.clone();
        tokio::spawn(async move { send(c.post(url).header("X-User-Id", "dup")).await })
    }))
    .await;
    for a in answers {
        assert_answer(
            "concurrent enter of dup",
            &a.expect("task"),
            200,
            waiting(2, 7200, 10),
        );
    }
    assert_eq!(queue_len(&redis, &proxy).await, 2, "one place for dup");
    assert_answers(
        &proxy,
        &[
            ("status of dup", "status", "dup", waiting(2, 7200, 10)),
            ("after dup", "enter", "last", waiting(3, 10800, 10)),
        ],
    )
    .await;
}

// ---- Redis unavailable, health ----------------------------------------------------------------

/// Enter and status of `user` while Redis is unreachable: 503, `{"error"}`, `Retry-After: R`, and
/// within `redis.timeout` + 100 ms (section 3). Five calls of each: all but the slowest must meet
/// the contract's bound, the slowest only "never a hang" (timeout + 1 s). Measured on this shared
/// 2-core machine (10 runs of this file and 10 of the frozen test alone, load average about 3):
/// stopped Redis 55-62 ms, frozen Redis (300 ms timeout) 302-364 ms, and once 407 ms. While
/// another engineer's benchmark ran beside it (load average 18) single calls took up to 983 ms,
/// mostly one of five, and this file's burst tests met 503s too: the test process and the
/// proxy were starved of CPU, not slow by themselves. A proxy slow on two calls of five fails.
async fn assert_unavailable(
    proxy: &Proxy,
    user: &str,
    timeout: Duration,
    retry_after: &str,
    what: &str,
) {
    for (name, call) in [("enter", true), ("status", false)] {
        let mut took = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let r = if call {
                proxy.enter(user).await
            } else {
                proxy.status(user).await
            };
            took.push(started.elapsed());
            assert_error(&format!("{what}: {name}"), &r, 503);
            assert_eq!(
                r.header("retry-after"),
                Some(retry_after),
                "{what}: {name} Retry-After"
            );
        }
        println!("{what}: {name} answered 503 in {took:?}");
        let mut sorted = took.clone();
        sorted.sort();
        assert!(
            sorted[3] <= timeout + Duration::from_millis(100),
            "{what}: {name} took {took:?} (contract: a 503 within redis.timeout {timeout:?} + 100 ms; \
             only the slowest call of five may miss it)"
        );
        assert!(
            sorted[4] <= timeout + Duration::from_secs(1),
            "{what}: {name} took {took:?}: a hang"
        );
    }
}

/// Everything a proxy must still do while its Redis is unreachable: 503 for a waiting user and
/// a newcomer alike, pass-through untouched, /healthz 200.
async fn assert_down(proxy: &Proxy, timeout: Duration, retry_after: &str, what: &str) {
    assert_unavailable(proxy, "early", timeout, retry_after, what).await;
    assert_unavailable(proxy, "newcomer", timeout, retry_after, what).await;
    let r = proxy.get("/hello?x=1").await;
    assert_eq!(r.status, 200, "{what}: pass-through: {}", r.body);
    let echo = r.json();
    assert_eq!(echo["path"], "/hello", "{what}: echo {echo}");
    assert_eq!(echo["query"], "x=1", "{what}: echo {echo}");
    assert_eq!(healthz(proxy).await, 200, "{what}: healthz");
}

async fn healthz(proxy: &Proxy) -> u16 {
    send(proxy.client().get(proxy.metrics_url("/healthz")))
        .await
        .status
}

/// How long after `since` the first `/readyz` call that answered `want` was sent (a call sent
/// before the change may answer after it, so the send time is the fair measure); None if none
/// did within 3 s. Polls every 10 ms.
async fn readyz_turns(proxy: &Proxy, want: u16, since: Instant) -> Option<Duration> {
    while since.elapsed() < Duration::from_secs(3) {
        let sent = since.elapsed();
        if proxy.readyz().await == want {
            return Some(sent);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// `/readyz` follows Redis within 1 s (section 4).
async fn assert_readyz_turns(proxy: &Proxy, want: u16, since: Instant, what: &str) {
    let took = readyz_turns(proxy, want, since).await;
    println!("readyz {want} {took:?} after {what}");
    let took = took.unwrap_or_else(|| panic!("readyz not {want} within 3 s of {what}"));
    assert!(
        took <= Duration::from_secs(1),
        "readyz {want} only {took:?} after {what} (contract: within 1 s)"
    );
}

/// A `NO_ADMISSION` room with `yaml` merged in: healthy, ready, and with "early" waiting first.
async fn room_with_early(redis: &RedisServer, api: &DemoApi, yaml: &str) -> Proxy {
    let builder = Proxy::builder(&redis.url(), api.addr())
        .yaml(NO_ADMISSION)
        .yaml(yaml);
    let proxy = start_settled(redis, &builder).await;
    assert_eq!(healthz(&proxy).await, 200);
    assert!(proxy.until_readyz(200, Duration::from_secs(3)).await, "readyz 200 with Redis up");
    assert_answers(&proxy, &[("before", "enter", "early", waiting(1, 0, 2))]).await;
    proxy
}

/// Redis came back at `since` (`what`): /readyz 200 within 1 s, and an enter of `user` answered
/// 200 within 10 s.
async fn assert_recovers(proxy: &Proxy, since: Instant, what: &str, user: &str) {
    assert_readyz_turns(proxy, 200, since, what).await;
    let recovered = wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { proxy.enter(user).await.status == 200 },
    )
    .await;
    println!("enter answered 200 {:?} after {what}", since.elapsed());
    assert!(
        recovered,
        "enter not 200 within 10 s of {what}:\n{}",
        proxy.logs()
    );
}

/// Stops (or freezes) Redis under `proxy`: /readyz 503 within 1 s, 503s within `timeout` + 100 ms
/// with `Retry-After: retry_after`, pass-through and /healthz unharmed; then restarts (or thaws)
/// it: /readyz 200 within 1 s and `user_after` can enter again.
async fn through_an_outage(
    redis: &mut RedisServer,
    proxy: &Proxy,
    timeout: Duration,
    retry_after: &str,
    frozen: bool,
    user_after: &str,
) {
    let (down, up) = if frozen {
        redis.freeze();
        ("Redis frozen", "thaw")
    } else {
        redis.stop();
        ("Redis stopped", "Redis restarted")
    };
    assert_readyz_turns(proxy, 503, Instant::now(), down).await;
    assert_down(proxy, timeout, retry_after, down).await;
    if frozen {
        redis.thaw();
    } else {
        redis.restart();
    }
    assert_recovers(proxy, Instant::now(), up, user_after).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_redis_gives_fast_503_and_readyz_follows() {
    let mut redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let timeout = Duration::from_millis(500);
    let proxy = room_with_early(&redis, &api, "redis: {timeout: 500ms}").await;

    through_an_outage(&mut redis, &proxy, timeout, "30", false, "after").await;
    // The restarted Redis is empty (no persistence): a fresh line.
    assert_answers(
        &proxy,
        &[("status after restart", "status", "after", waiting(1, 0, 2))],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_gives_503_within_timeout_and_the_proxy_recovers() {
    let mut redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let timeout = Duration::from_millis(300);
    // retry_after 7s: the 503's Retry-After follows queue.retry_after too.
    let proxy = room_with_early(
        &redis,
        &api,
        "redis: {timeout: 300ms}\nqueue: {retry_after: 7s}",
    )
    .await;

    through_an_outage(&mut redis, &proxy, timeout, "7", true, "late").await;
    // The data survived the freeze: places are where they were. The newcomer's enters were
    // answered 503 but had already been written to the hung socket, so Redis may run them on
    // thaw: a 503 means "not known", not "not queued" (a retry then finds the place).
    assert_answers(
        &proxy,
        &[("early after thaw", "status", "early", waiting(1, 0, 2))],
    )
    .await;
    let newcomer = proxy.status("newcomer").await.json();
    println!("newcomer after thaw: {newcomer}");
    let late_at = if newcomer == not_in_queue() {
        2
    } else {
        assert_eq!(
            newcomer,
            waiting(2, 7200, 10),
            "newcomer, if queued, is right behind early"
        );
        3
    };
    assert_answers(
        &proxy,
        &[(
            "late after thaw",
            "status",
            "late",
            waiting(late_at, late_at * 3600, 10),
        )],
    )
    .await;
}

// ---- endpoints.prefix, poll_after, identity.header -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_tiers_and_identity_header_come_from_the_config() {
    let (redis, _api, proxy) = quiet_room(
        "endpoints: {prefix: /wr}\n\
         poll_after: [{min_wait: 2h, poll_after: 7s}, {min_wait: 0s, poll_after: 1s}]\n\
         identity: {header: X-Customer}",
    )
    .await;
    let c = proxy.client();

    // Only the configured identity header names the user.
    let r = send(c.post(proxy.url("/wr/enter")).header("X-User-Id", "p1")).await;
    assert_error("X-User-Id when X-Customer is configured", &r, 401);

    // Configured tiers: eta 0 -> 1 s; position 2 waits 7200 s = 2 h exactly -> 7 s.
    let r = send(c.post(proxy.url("/wr/enter")).header("X-Customer", "p1")).await;
    assert_answer("POST /wr/enter", &r, 200, waiting(1, 0, 1));
    let r = send(
        c.get(proxy.url("/wr/status?x=1"))
            .header("x-customer", "p1"),
    )
    .await;
    assert_answer("GET /wr/status", &r, 200, waiting(1, 0, 1));
    let r = send(c.post(proxy.url("/wr/enter")).header("X-Customer", "p3")).await;
    assert_answer("POST /wr/enter, second", &r, 200, waiting(2, 7200, 7));
    for (wrong, path, allow) in [("GET", "/wr/enter", "POST"), ("POST", "/wr/status", "GET")] {
        let m = reqwest::Method::from_bytes(wrong.as_bytes()).unwrap();
        let r = send(c.request(m, proxy.url(path))).await;
        assert_eq!(
            (r.status, r.header("allow")),
            (405, Some(allow)),
            "{wrong} {path}: {}",
            r.body
        );
    }

    // The default paths are now the upstream's.
    for (method, path) in [("POST", "/queue/enter"), ("GET", "/queue/status")] {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let r = send(c.request(m, proxy.url(path)).header("X-Customer", "p2")).await;
        assert_eq!(r.status, 200, "{method} {path} passes through: {}", r.body);
        let echo = r.json();
        assert_eq!(echo["method"], method, "echo {echo}");
        assert_eq!(echo["path"], path, "echo {echo}");
    }
    assert_eq!(
        queue_len(&redis, &proxy).await,
        2,
        "the pass-throughs queued nobody"
    );
}

// ---- connection reuse -------------------------------------------------------------------------

/// Reads one response (Content-Length or chunked framing) off `s`; None when the server closed
/// before sending anything.
async fn read_one_response(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<RawResp> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = RawResp::parse(&String::from_utf8_lossy(&buf[..head_end + 4]));
            let body_start = head_end + 4;
            if let Some(len) = head
                .header("content-length")
                .and_then(|v| v.parse::<usize>().ok())
            {
                if buf.len() >= body_start + len {
                    let body =
                        String::from_utf8_lossy(&buf[body_start..body_start + len]).into_owned();
                    buf.drain(..body_start + len);
                    return Some(RawResp { body, ..head });
                }
            } else if head
                .header("transfer-encoding")
                .is_some_and(|v| v.contains("chunked"))
            {
                if let Some(end) = buf[body_start..].windows(5).position(|w| w == b"0\r\n\r\n") {
                    let body =
                        String::from_utf8_lossy(&buf[body_start..body_start + end]).into_owned();
                    buf.drain(..body_start + end + 5);
                    return Some(RawResp { body, ..head });
                }
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("no response within 10 s")
            .unwrap_or(0);
        if n == 0 {
            assert!(
                buf.is_empty(),
                "connection closed mid-response: {:?}",
                String::from_utf8_lossy(buf)
            );
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_requests_with_bodies_leave_the_connection_usable() {
    use tokio::io::AsyncWriteExt;
    let (redis, _api, proxy) = quiet_room("{}").await;

    // Each request in turn on one keep-alive connection: a request body the proxy did not need
    // must not be read as the next request. Ending the connection instead is fine when the
    // answer announces it (`Connection: close`); the next request then goes on a fresh one.
    let body = r#"{"from":"the waiting page"}"#;
    let requests: Vec<(String, u16, Option<Value>)> = vec![
        (
            format!("POST /queue/enter HTTP/1.1\r\nHost: t\r\nX-User-Id: u1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
            200,
            Some(waiting(1, 0, 2)),
        ),
        ("GET /queue/status HTTP/1.1\r\nHost: t\r\nX-User-Id: u1\r\n\r\n".into(), 200, Some(waiting(1, 0, 2))),
        (
            format!("POST /queue/status HTTP/1.1\r\nHost: t\r\nX-User-Id: u1\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
            405,
            None,
        ),
        (
            format!("POST /queue/enter HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
            401,
            None,
        ),
        (
            "POST /queue/enter HTTP/1.1\r\nHost: t\r\nX-User-Id: u2\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".into(),
            200,
            Some(waiting(2, 7200, 10)),
        ),
        ("GET /queue/status HTTP/1.1\r\nHost: t\r\nX-User-Id: u2\r\n\r\n".into(), 200, Some(waiting(2, 7200, 10))),
        ("GET /hello HTTP/1.1\r\nHost: t\r\n\r\n".into(), 200, None),
    ];
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let mut buf = Vec::new();
    let mut reconnects = 0;
    for (req, status, want) in &requests {
        let first_line = req.lines().next().unwrap().to_owned();
        s.write_all(req.as_bytes()).await.unwrap();
        let r = read_one_response(&mut s, &mut buf)
            .await
            .unwrap_or_else(|| {
                panic!("{first_line}: closed without an answer (and without announcing it)")
            });
        assert_eq!(r.status, *status, "{first_line}: {r:?}");
        if let Some(want) = want {
            assert!(r.is_json(), "{first_line}: {r:?}");
            assert_eq!(
                serde_json::from_str::<Value>(&r.body).unwrap(),
                *want,
                "{first_line}"
            );
        }
        // A server may end the connection, but says so; otherwise the next request reuses it.
        if r.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            reconnects += 1;
            s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
            buf.clear();
        }
    }
    println!(
        "connection reuse: {reconnects} reconnects over {} requests",
        requests.len()
    );
    assert_eq!(queue_len(&redis, &proxy).await, 2);
}
