//! Held polls (contract section 13), against a real Redis and real sockets: READY reaches a
//! held poll within 100 ms of the admission, whichever proxy admitted; a hold ends at `hold`
//! with `pollAfter: 0`; users far back, and every user with `hold: 0s`, are answered at once; a
//! client that goes away frees its hold; a second poll of a user already held is answered at
//! once; a place removed from the line never turns into READY; a close and a graceful stop
//! answer held polls; enforced polling and abandonment count a held poll as on time and as heard
//! from.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::io::AsyncWriteExt;

/// Contract section 13: READY reaches a held poll within this of the admission that made it.
const READY_WITHIN: Duration = Duration::from_millis(100);
/// A room whose first batch is 50 and which admits nobody after its first (empty) tick: every
/// user of the tests below is within the first batch (estimatedWaitTime 0), so within any hold.
const FRONT_ROOM: &str = "admission: {interval: 1h, batch_size: 50}";
const TTL_MS: u64 = 300_000;

/// A quiet room (nobody admitted unless a test does it by hand) with `yaml` merged in.
async fn front_room(yaml: &str) -> (RedisServer, DemoApi, Proxy) {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let builder = Proxy::builder(&redis.url(), api.addr()).yaml(FRONT_ROOM).yaml(yaml);
    let proxy = start_settled(&redis, &builder).await;
    (redis, api, proxy)
}

/// Admits `user` by hand as the admission script would: the place leaves the line's front and a
/// token is issued. Returns when Redis has done it.
async fn admit_by_hand(redis: &RedisServer, proxy: &Proxy, user: &str) -> String {
    let keys = keys(proxy);
    let token = uuid::Uuid::new_v4().to_string();
    let _: () = redis::pipe()
        .atomic()
        .cmd("ZREM")
        .arg(&keys.queue)
        .arg(user)
        .ignore()
        .cmd("SET")
        .arg(keys.token(user))
        .arg(&token)
        .arg("PX")
        .arg(TTL_MS)
        .ignore()
        .query_async(&mut redis.conn().await)
        .await
        .expect("admit by hand");
    token
}

/// Waits until `waitroom_held_polls` reads `n`.
async fn until_held(proxy: &Proxy, n: u64) {
    let held = wait_until(Duration::from_secs(5), Duration::from_millis(10), || async {
        proxy.metric("waitroom_held_polls").await == Some(n as f64)
    })
    .await;
    assert!(held, "waitroom_held_polls never read {n}: {:?}", proxy.metric("waitroom_held_polls").await);
}

/// Enters `users` one after another (their positions are their order) and checks each is told
/// to ask again at once: within the hold, the next poll is a held one.
async fn enter_all(proxy: &Proxy, users: &[String]) {
    for (i, user) in users.iter().enumerate() {
        let r = proxy.enter(user).await;
        assert_answer(&format!("enter {user}"), &r, 200, waiting(i as u64 + 1, 0, 0));
    }
}

/// Starts each user's status poll through `proxy` at once, each in a task of its own; a task
/// ends with the answer and when it came.
fn poll_all<U: AsRef<str>>(proxy: &Proxy, users: &[U]) -> Vec<tokio::task::JoinHandle<(Resp, Instant)>> {
    users
        .iter()
        .map(|u| {
            let (url, client, user) = (proxy.url("/queue/status"), proxy.client().clone(), u.as_ref().to_owned());
            tokio::spawn(async move {
                let r = send(client.get(url).header("X-User-Id", &user)).await;
                (r, Instant::now())
            })
        })
        .collect()
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_reaches_held_polls_within_100ms_of_a_hand_admission() {
    const ADMITTED: usize = 20;
    let (redis, _api, proxy) = front_room("endpoints: {hold: 10s}").await;
    let users = names("h", ADMITTED + 4);
    enter_all(&proxy, &users).await;
    let polls = poll_all(&proxy, &users);
    until_held(&proxy, users.len() as u64).await;
    // The first twenty leave the front in order, a few milliseconds apart; the other four stay.
    let mut admitted = Vec::new();
    for user in &users[..ADMITTED] {
        let token = admit_by_hand(&redis, &proxy, user).await;
        admitted.push((token, Instant::now()));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let mut delays = Vec::new();
    let mut polls = polls.into_iter();
    for (user, (token, at)) in users.iter().zip(&admitted) {
        let (r, answered) = polls.next().unwrap().await.unwrap();
        assert_eq!(r.status, 200, "{user}: {}", r.body);
        assert_eq!(
            r.json(),
            json!({"status": "READY", "token": token, "expiresIn": TTL_MS / 1000, "pollAfter": null}),
            "{user}"
        );
        delays.push(answered.saturating_duration_since(*at));
    }
    // The contract's bound on all but one in twenty: one sample late by the test's own
    // scheduling on a loaded machine cannot fail it, a proxy late by design (a poll woken on a
    // timer, or by the next tick) fails nearly every sample.
    let (nineteenth, ms) = all_but_the_slowest(&mut delays);
    println!("READY after admission (ms, sorted): {ms:?}");
    assert!(nineteenth <= READY_WITHIN, "the 19th of {ADMITTED} held polls learned READY {nineteenth:?} after its admission, over {READY_WITHIN:?}; all (ms): {ms:?}");
    // The four still waiting were not woken by their neighbours' admissions.
    until_held(&proxy, 4).await;
    let delay_metric = proxy.metric("waitroom_held_ready_delay_seconds_count").await;
    assert_eq!(delay_metric, Some(ADMITTED as f64), "each READY of a held poll is timed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_reaches_held_polls_whichever_proxy_admitted() {
    // Two proxies of one room admit 2 users every 200 ms between them: 10 a second. Every user is
    // within the 10 s hold, so each one's poll is held and answered READY by its admission,
    // through either proxy, whichever proxy's tick admitted the user.
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let builder = Proxy::builder(&redis.url(), api.addr())
        .yaml("admission: {interval: 200ms, batch_size: 2}\nendpoints: {hold: 10s}");
    let a = builder.start().await;
    let b = builder.start().await;
    let users = names("two", 30);
    for user in &users {
        let r = a.enter(user).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let polls: Vec<_> = users
        .iter()
        .enumerate()
        .map(|(i, user)| {
            let proxy = if i % 2 == 0 { &a } else { &b };
            let (url, client, user) = (proxy.url("/queue/status"), proxy.client().clone(), user.clone());
            let redis_url = redis.url();
            let token_key = keys(&a).token(&user);
            tokio::spawn(async move {
                let client_redis = redis::Client::open(redis_url).unwrap();
                let mut conn = client_redis.get_multiplexed_async_connection().await.unwrap();
                loop {
                    let r = send(client.get(&url).header("X-User-Id", &user)).await;
                    let answered = Instant::now();
                    let body = r.json();
                    match body["status"].as_str() {
                        Some("WAITING") => {
                            assert_eq!(body["pollAfter"], 0, "{user}: a held poll ends with pollAfter 0: {body}");
                            continue;
                        }
                        Some("READY") => {
                            // How long ago Redis issued the token, less the time this reading took.
                            let pttl: i64 = redis::cmd("PTTL").arg(&token_key).query_async(&mut conn).await.unwrap();
                            let since_issue = Duration::from_millis(TTL_MS - pttl as u64);
                            return (user, since_issue.saturating_sub(answered.elapsed()));
                        }
                        _ => panic!("{user}: {body}"),
                    }
                }
            })
        })
        .collect();
    let mut delays = Vec::new();
    for poll in polls {
        delays.push(tokio::time::timeout(Duration::from_secs(20), poll).await.expect("READY in time").unwrap());
    }
    delays.sort_by_key(|(_, d)| *d);
    println!("READY after admission, two proxies: {delays:?}");
    let ticks_a = a.counter("waitroom_admission_ticks_total{result=\"admitted\"}").await;
    let ticks_b = b.counter("waitroom_admission_ticks_total{result=\"admitted\"}").await;
    assert!(ticks_a > 0.0 && ticks_b > 0.0, "both proxies admitted ({ticks_a}, {ticks_b}): the test covers both");
    // The bound is 100 ms; the test's own PTTL reading, two proxies, Redis and 30 clients share
    // two cores here, so the slowest may lag by its scheduling: 95 % at the bound, all within 3x.
    let within = delays.iter().filter(|(_, d)| *d <= READY_WITHIN).count();
    assert!(within * 100 >= delays.len() * 95, "{within} of {} within {READY_WITHIN:?}: {delays:?}", delays.len());
    assert!(delays.iter().all(|(_, d)| *d <= READY_WITHIN * 3), "{delays:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_ends_at_hold_with_the_place_and_poll_after_zero() {
    // A hold longer than limits.header_timeout: the head has arrived, so no head deadline runs.
    let (_redis, _api, proxy) = front_room("endpoints: {hold: 1500ms}\nlimits: {header_timeout: 1s}").await;
    enter_all(&proxy, &names("e", 2)).await;
    let (r, took) = timed(proxy.status("e2")).await;
    // "Rounded up to whole seconds" is the estimate's bound; the hold itself lasts as written.
    assert!(took >= Duration::from_millis(1500), "answered after {took:?}");
    assert!(took < Duration::from_millis(2500), "answered after {took:?}");
    assert_answer("end of the hold", &r, 200, waiting(2, 0, 0));
    assert_eq!(proxy.metric("waitroom_held_polls").await, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_far_back_and_rooms_without_hold_are_answered_at_once() {
    // One user an hour: the second in line waits 7200 s, far past the default 2 s hold.
    let (_redis, _api, proxy) = quiet_room("endpoints: {hold: ~}").await;
    for (i, user) in ["f1", "f2"].iter().enumerate() {
        assert_eq!(proxy.enter(user).await.status, 200, "{i}");
    }
    let (r, took) = timed(proxy.status("f2")).await;
    assert_answer("far back", &r, 200, waiting(2, 7200, 10));
    assert!(took < Duration::from_millis(500), "far back, answered after {took:?}");
    // The first is within the default hold: held.
    let (r, took) = timed(proxy.status("f1")).await;
    assert_answer("front, default hold", &r, 200, waiting(1, 0, 0));
    assert!(took >= Duration::from_secs(2), "the default hold is 2 s: answered after {took:?}");

    let (_redis, _api, proxy) = quiet_room("endpoints: {hold: 0s}").await;
    assert_answer("enter, hold 0", &proxy.enter("z1").await, 200, waiting(1, 0, 2));
    let (r, took) = timed(proxy.status("z1")).await;
    assert_answer("hold 0 never holds", &r, 200, waiting(1, 0, 2));
    assert!(took < Duration::from_millis(500), "hold 0, answered after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_frees_its_hold() {
    let (_redis, _api, proxy) = front_room("endpoints: {hold: 30s}").await;
    enter_all(&proxy, &names("d", 1)).await;
    let mut socket = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    socket
        .write_all(b"GET /queue/status HTTP/1.1\r\nHost: room\r\nX-User-Id: d1\r\n\r\n")
        .await
        .unwrap();
    until_held(&proxy, 1).await;
    drop(socket);
    let (_, took) = timed(until_held(&proxy, 0)).await;
    assert!(took < Duration::from_millis(500), "the hold outlived its client by {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_poll_of_a_user_already_held_is_answered_at_once() {
    let (_redis, _api, proxy) = front_room("endpoints: {hold: 5s}").await;
    enter_all(&proxy, &names("o", 2)).await;
    let first = poll_all(&proxy, &["o1"]).remove(0);
    until_held(&proxy, 1).await;
    // o1 again, on a second connection (the client's first one waits for the held answer):
    // the tier's pollAfter (2 s by default), not 0, or such a client would ask in a loop.
    let (r, took) = timed(proxy.status("o1")).await;
    assert_answer("o1's second poll", &r, 200, waiting(1, 0, 2));
    assert!(took < Duration::from_secs(1), "o1's second poll answered after {took:?}");
    assert!(!first.is_finished(), "o1's first poll is still held");
    assert_eq!(proxy.metric("waitroom_held_polls").await, Some(1.0));
    // Another identity is held as before.
    let other = poll_all(&proxy, &["o2"]).remove(0);
    until_held(&proxy, 2).await;
    let (r, _) = first.await.unwrap();
    assert_answer("o1's first poll at the end of the hold", &r, 200, waiting(1, 0, 0));
    let (r, _) = other.await.unwrap();
    assert_answer("o2's poll at the end of the hold", &r, 200, waiting(2, 0, 0));
    // The ended hold let o1 go: the next poll is held again.
    let _next = poll_all(&proxy, &["o1"]).remove(0);
    until_held(&proxy, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_removed_from_the_line_is_never_told_ready() {
    let (redis, _api, proxy) = front_room("endpoints: {hold: 10s}").await;
    let users = names("g", 4);
    enter_all(&proxy, &users).await;
    let sent = Instant::now();
    let polls = poll_all(&proxy, &users);
    until_held(&proxy, 4).await;
    // g1 and g2 removed by hand (the front passes them, but nobody issued them a token), and g3
    // from the middle of what is left: a gap.
    let queue = keys(&proxy).queue;
    let removed: i64 = redis::cmd("ZREM")
        .arg(&queue)
        .arg(&["g1", "g2"][..])
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    assert_eq!(removed, 2);
    let mut polls = polls.into_iter();
    for user in ["g1", "g2"] {
        let (r, answered) = polls.next().unwrap().await.unwrap();
        let took = answered.saturating_duration_since(sent);
        assert_answer(&format!("{user} removed"), &r, 200, not_in_queue());
        assert!(took < Duration::from_secs(5), "{user} learned it at the front's passing, after {took:?}");
    }
    until_held(&proxy, 2).await;
    let _: i64 = redis::cmd("ZREM").arg(&queue).arg("g4").query_async(&mut redis.conn().await).await.unwrap();
    admit_by_hand(&redis, &proxy, "g3").await;
    let (g3, _) = polls.next().unwrap().await.unwrap();
    assert_status_is(&g3, 200, "READY");
    let (g4, _) = polls.next().unwrap().await.unwrap();
    assert_answer("g4 removed behind the front", &g4, 200, not_in_queue());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_answers_held_polls_within_a_second() {
    const TOKEN_ENV: &str = "WAITROOM_TEST_ADMIN_TOKEN";
    let (_redis, _api, proxy) = {
        let redis = RedisServer::start();
        let api = DemoApi::start(&[]);
        let builder = Proxy::builder(&redis.url(), api.addr())
            .yaml(FRONT_ROOM)
            .yaml(&format!("endpoints: {{hold: 30s}}\nadmin: {{token_env: {TOKEN_ENV}}}"))
            .env(TOKEN_ENV, "close-me");
        let proxy = start_settled(&redis, &builder).await;
        (redis, api, proxy)
    };
    // Twenty held polls, so the second is asserted on all but one of them (a statistic, not
    // one sample the loaded machine may leave unscheduled); every one must answer CLOSED.
    const HELD: usize = 20;
    let users = names("c", HELD);
    enter_all(&proxy, &users).await;
    let polls = poll_all(&proxy, &users);
    until_held(&proxy, HELD as u64).await;
    let at = Instant::now();
    let closed = send(proxy.client().post(proxy.metrics_url("/admin/room/close")).bearer_auth("close-me")).await;
    assert_eq!(closed.status, 200, "{}", closed.body);
    let mut took = Vec::new();
    for (user, poll) in users.iter().zip(polls) {
        let (r, answered) = poll.await.unwrap();
        assert_answer(&format!("{user} held through a close"), &r, 200, json!({"status": "CLOSED", "pollAfter": null}));
        took.push(answered.saturating_duration_since(at));
    }
    let (nineteenth, ms) = all_but_the_slowest(&mut took);
    println!("CLOSED reached the held polls after (ms, sorted, from the close call): {ms:?}");
    assert!(nineteenth <= Duration::from_secs(1), "the 19th of {HELD} held polls learned CLOSED {nineteenth:?} after the close; all (ms): {ms:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_answers_held_polls_instead_of_cutting_them() {
    let (_redis, _api, proxy) = front_room("endpoints: {hold: 30s}\nshutdown: {grace: 10s}").await;
    enter_all(&proxy, &names("s", 3)).await;
    let polls = poll_all(&proxy, &["s1", "s2", "s3"]);
    until_held(&proxy, 3).await;
    proxy.signal("TERM");
    let at = Instant::now();
    for (i, poll) in polls.into_iter().enumerate() {
        let (r, _) = poll.await.unwrap();
        assert_answer("held through a stop", &r, 200, waiting(i as u64 + 1, 0, 0));
    }
    assert!(at.elapsed() < Duration::from_secs(2), "answered {:?} after SIGTERM", at.elapsed());
    let exit = proxy.wait_exit(Duration::from_secs(5)).await.expect("exited");
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforced_polling_takes_the_poll_after_a_zero_as_on_time() {
    let (_redis, _api, proxy) = front_room("endpoints: {hold: 1s}\npolling: {enforce: true, grace: 0%}").await;
    enter_all(&proxy, &names("p", 1)).await;
    // Straight after the enter's pollAfter 0, then straight after each hold's end.
    for round in 0..3 {
        let (r, took) = timed(proxy.status("p1")).await;
        assert_answer(&format!("round {round}"), &r, 200, waiting(1, 0, 0));
        assert!(took >= Duration::from_secs(1), "round {round}: held {took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_poll_counts_as_hearing_from_the_user_for_its_whole_length() {
    // abandon_after 2 s (twice the only pollAfter, 1 s) and a 5 s hold: a poll held for 5 s must
    // not cost the place it is waiting with.
    let (redis, _api, proxy) = front_room(
        "endpoints: {hold: 5s}\npoll_after: [{min_wait: 0s, poll_after: 1s}]\nqueue: {abandon_after: 2s}",
    )
    .await;
    enter_all(&proxy, &names("a", 1)).await;
    let (r, took) = timed(proxy.status("a1")).await;
    assert!(took >= Duration::from_secs(5), "held {took:?}");
    assert_answer("after a 5 s hold", &r, 200, waiting(1, 0, 0));
    assert_eq!(queue_len(&redis, &proxy).await, 1, "the place is still there");
    assert_eq!(proxy.counter("waitroom_abandoned_total").await, 0.0);
}
