//! Positions told without a Redis round trip (`src/line.rs`), checked from the outside: once a
//! waiting user's first status has been answered by Redis, later polls cost Redis no ZRANK, and
//! every answer still equals Redis's own rank after anything that moves the line: admissions
//! by another proxy (here, by hand), a place removed from the middle, a room reset, a Redis that
//! stopped. And when each poll must reach Redis (abandonment), every poll does.

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;

/// Nobody is admitted by the proxy itself while a test runs: the test moves the line.
const NO_ADMISSION: &str = "admission: {interval: 1h, batch_size: 1}";
/// Longer than the freshness of the proxy's line reading (50 ms), with room for a busy machine.
const SETTLE: Duration = Duration::from_millis(300);

async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Redis's own answer: 1-based rank, or None.
async fn rank(
    conn: &mut redis::aio::MultiplexedConnection,
    queue: &str,
    user: &str,
) -> Option<u64> {
    let r: Option<u64> = redis::cmd("ZRANK")
        .arg(queue)
        .arg(user)
        .query_async(conn)
        .await
        .unwrap();
    r.map(|r| r + 1)
}

/// Every user's status agrees with Redis: WAITING at its rank, or NOT_IN_QUEUE.
async fn assert_all_exact(
    proxy: &Proxy,
    conn: &mut redis::aio::MultiplexedConnection,
    queue: &str,
    users: &[String],
    ctx: &str,
) {
    for user in users {
        let want = rank(conn, queue, user).await;
        let body: Value = proxy.status(user).await.json();
        match want {
            Some(p) => {
                assert_eq!(body["status"], "WAITING", "{ctx}: {user}: {body}");
                assert_eq!(body["position"], p, "{ctx}: {user}: {body}");
            }
            None => assert_eq!(body["status"], "NOT_IN_QUEUE", "{ctx}: {user}: {body}"),
        }
    }
}

/// Moves the line behind the proxy's back with `cmd` (as another proxy or the scripts would),
/// waits for the proxy's line reading to catch up, and checks every user's answer (`ctx`).
async fn move_line(
    proxy: &Proxy,
    conn: &mut redis::aio::MultiplexedConnection,
    users: &[String],
    cmd: &mut redis::Cmd,
    ctx: &str,
) {
    let _: redis::Value = cmd.query_async(conn).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    let queue = keys(proxy).queue;
    assert_all_exact(proxy, conn, &queue, users, ctx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_users_are_answered_locally_and_exactly() {
    let (redis, _api, proxy) = quiet_room("{}").await;
    let mut conn = redis.conn().await;
    let queue = keys(&proxy).queue;
    let users: Vec<String> = (1..=30).map(|i| format!("u{i}")).collect();
    for user in &users {
        assert_eq!(proxy.enter(user).await.status, 200);
    }
    tokio::time::sleep(SETTLE).await;
    // First polls: Redis answers, and the proxy learns each user's arrival number.
    assert_all_exact(&proxy, &mut conn, &queue, &users, "first polls").await;

    // Second polls: exact, and not one ZRANK (the checks' own ZRANKs are counted out).
    let before = command_calls(&mut conn, "zrank").await;
    for (i, user) in users.iter().enumerate() {
        let body: Value = proxy.status(user).await.json();
        assert_eq!(body["status"], "WAITING", "{user}: {body}");
        assert_eq!(body["position"], i as u64 + 1, "{user}: {body}");
    }
    let after = command_calls(&mut conn, "zrank").await;
    // A poll falls back to Redis when the line watcher was starved of CPU for 50 ms (the tests
    // of this file run side by side on two cores): allow a few, never most.
    assert!(
        after - before <= 3,
        "{} of 30 second polls reached Redis",
        after - before
    );

    // Another proxy admits five (ZPOPMIN, as the admit script does); a place is removed from
    // the middle (by hand; abandonment does this too): a gap the arrival numbers cannot see, so
    // positions come from Redis until admission passes it; then admission passes it.
    for (command, args, ctx) in [
        ("ZPOPMIN", ["5"], "after five admitted"),
        ("ZREM", ["u15"], "after a place left the middle"),
        ("ZPOPMIN", ["10"], "gap admitted"),
    ] {
        let mut cmd = redis::cmd(command);
        cmd.arg(&queue).arg(&args);
        move_line(&proxy, &mut conn, &users, &mut cmd, ctx).await;
    }
    let before = command_calls(&mut conn, "zrank").await;
    for _ in 0..5 {
        let body: Value = proxy.status("u30").await.json();
        assert_eq!(body["position"], 14, "{body}");
    }
    let fallbacks = command_calls(&mut conn, "zrank").await - before;
    assert!(
        fallbacks <= 2,
        "local again once the gap is gone: {fallbacks} of 5 reached Redis"
    );

    // The room reset (Redis flushed), then refilled past the old numbers by other users: the
    // old users are not in line, whatever their old numbers say.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    for i in 1..=40 {
        assert_eq!(proxy.enter(&format!("new{i}")).await.status, 200);
    }
    tokio::time::sleep(SETTLE).await;
    assert_all_exact(&proxy, &mut conn, &queue, &users, "after a reset").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_teaches_the_number_and_entering_again_is_answered_locally() {
    let (redis, _api, proxy) = quiet_room("{}").await;
    let mut conn = redis.conn().await;
    let queue = keys(&proxy).queue;
    // The room gets its epoch from the line watcher before the first enter.
    tokio::time::sleep(SETTLE).await;
    let users: Vec<String> = (1..=10).map(|i| format!("u{i}")).collect();
    for user in &users {
        assert_eq!(proxy.enter(user).await.status, 200);
    }
    tokio::time::sleep(SETTLE).await;
    let (zrank, evalsha) = (
        command_calls(&mut conn, "zrank").await,
        command_calls(&mut conn, "evalsha").await,
    );
    for (i, user) in users.iter().enumerate() {
        for answer in [proxy.enter(user).await, proxy.status(user).await] {
            let body: Value = answer.json();
            assert_eq!(body["status"], "WAITING", "{user}: {body}");
            assert_eq!(body["position"], i as u64 + 1, "{user}: {body}");
        }
    }
    // 20 calls; a few may fall back when the watcher was starved of CPU (see above).
    let zrank = command_calls(&mut conn, "zrank").await - zrank;
    let evalsha = command_calls(&mut conn, "evalsha").await - evalsha;
    assert!(
        zrank <= 3 && evalsha <= 3,
        "{zrank} ZRANK and {evalsha} script calls for 20 answers"
    );
    // Admitted meanwhile (by hand): entering again is Redis's answer, never a stale place.
    let _: Vec<(String, f64)> = redis::cmd("ZPOPMIN")
        .arg(&queue)
        .arg(3)
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(SETTLE).await;
    let again: Value = proxy.enter("u1").await.json();
    assert_eq!(again["position"], 8, "u1 re-queued at the back: {again}");
    assert_eq!(proxy.enter("u4").await.json()["position"], 1);
}

/// READY once admitted (section 3), with no allowance for the proxy that admitted: a line
/// reading read just before its own tick is still fresh (50 ms) when the tick is counted, and
/// its admitted users must not be told WAITING from it. Each admission is watched through the
/// proxy's own counter, and the admitted user's poll follows at once: a proxy that leaves its
/// own admissions to its next reading tells most of them WAITING at position 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_this_proxy_admitted_is_ready_at_the_next_poll() {
    const USERS: u64 = 12;
    let (_redis, _api, proxy) = room(&[], "admission: {interval: 150ms, batch_size: 1}").await;
    // The room gets its epoch from the line watcher before the first enter, which then teaches
    // each user's number: the polls below are answered locally until their user is admitted.
    tokio::time::sleep(SETTLE).await;
    for i in 1..=USERS {
        assert_eq!(proxy.enter(&format!("u{i}")).await.status, 200);
    }
    for k in 1..=USERS {
        let counted = wait_until(Duration::from_secs(5), Duration::ZERO, || async {
            proxy.metric("waitroom_admitted_total").await.unwrap_or(0.0) >= k as f64
        })
        .await;
        assert!(counted, "u{k} not admitted within 5 s");
        let r = proxy.status(&format!("u{k}")).await;
        assert_eq!(status_of(&r), "READY", "u{k}, counted admitted by this proxy: {}", r.body);
    }
}

/// A proxy (redis.timeout 300 ms) whose user "u1" waits at position 1 and has been answered
/// locally once.
async fn known_waiting_user(redis: &RedisServer, api: &DemoApi) -> Proxy {
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .yaml(NO_ADMISSION)
        .yaml("redis: {timeout: 300ms}")
        .start_settled(&redis.conn().await)
        .await;
    assert_eq!(proxy.enter("u1").await.status, 200);
    tokio::time::sleep(SETTLE).await;
    assert_eq!(proxy.status("u1").await.json()["position"], 1);
    assert_eq!(proxy.status("u1").await.json()["position"], 1);
    proxy
}

/// Both of u1's calls meet Redis's absence: every one a 503, never a position from memory, and
/// within `redis.timeout` + 100 ms (section 3) on all but one in twenty: twenty of each, asked
/// five at a time, so one call the loaded machine left unscheduled cannot fail the test and a
/// proxy that waits past the bound on purpose fails nearly every call.
async fn assert_unavailable_for_u1(proxy: &Proxy) {
    const SAMPLES: usize = 20;
    let bound = Duration::from_millis(300 + 100);
    let (mut status_took, mut enter_took) = (Vec::new(), Vec::new());
    for _ in 0..SAMPLES / 5 {
        let round = (0..5).map(|_| async { (timed(proxy.status("u1")).await, timed(proxy.enter("u1")).await) });
        for ((status, s_took), (enter, e_took)) in futures::future::join_all(round).await {
            assert_eq!(status.status, 503, "status: {}", status.body);
            assert_eq!(enter.status, 503, "enter: {}", enter.body);
            status_took.push(s_took);
            enter_took.push(e_took);
        }
    }
    for (call, mut took) in [("status", status_took), ("enter", enter_took)] {
        let (nineteenth, ms) = all_but_the_slowest(&mut took);
        println!("{call} 503 after (ms, sorted): {ms:?}");
        assert!(nineteenth <= bound, "{call}: the 19th of {SAMPLES} 503s took {nineteenth:?}, over redis.timeout + 100 ms; all (ms): {ms:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_ends_local_answers_at_once() {
    let mut redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = known_waiting_user(&redis, &api).await;
    redis.stop();
    // The watcher's pub/sub subscription ends when the server closes its connections, which
    // usually ends local answers before `stop` returns; but on a loaded machine the proxy may
    // not have read that close yet (seen once in the full suite: one WAITING from memory). What
    // the proxy promises is the reading's freshness: none is trusted FRESH_FOR (50 ms) after the
    // last one Redis answered, as with a freeze.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_unavailable_for_u1(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_ends_local_answers_within_tens_of_milliseconds() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = known_waiting_user(&redis, &api).await;
    redis.freeze();
    // The reading sent at most 10 ms after the freeze is suspect 20 ms later.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_unavailable_for_u1(&proxy).await;
    redis.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_the_watch_subscription_still_gets_local_answers() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    // An ACL without channel rights: SUBSCRIBE answers NOPERM.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("resetchannels")
        .query_async(&mut conn)
        .await
        .unwrap();
    let api = DemoApi::start(&[]);
    let proxy = known_waiting_user(&redis, &api).await;
    let before = command_calls(&mut conn, "zrank").await;
    for _ in 0..5 {
        assert_eq!(proxy.status("u1").await.json()["position"], 1);
    }
    let fallbacks = command_calls(&mut conn, "zrank").await - before;
    assert!(fallbacks <= 2, "{fallbacks} of 5 polls reached Redis");
    let logs = proxy.logs();
    assert!(
        logs.contains("refused the line watcher's subscription"),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_abandonment_every_poll_reaches_redis() {
    let (redis, _api, proxy) = quiet_room("queue: {abandon_after: 60s}").await;
    let mut conn = redis.conn().await;
    for i in 1..=5 {
        assert_eq!(proxy.enter(&format!("u{i}")).await.status, 200);
    }
    tokio::time::sleep(SETTLE).await;
    for i in 1..=5 {
        assert_eq!(proxy.status(&format!("u{i}")).await.json()["position"], i);
    }
    let before = command_calls(&mut conn, "zrank").await;
    for i in 1..=5 {
        assert_eq!(proxy.status(&format!("u{i}")).await.json()["position"], i);
    }
    // Each poll counts as heard from: it must run the status script.
    assert_eq!(command_calls(&mut conn, "zrank").await - before, 5);
}
