//! When Redis loses writes (contract section 5): a restart from an older snapshot must not bring
//! back what the room already decided.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// A token spent by an order stays refused, even after Redis restarts from a snapshot taken
/// while it was still live (the delete is lost and the token is back in Redis).
#[tokio::test]
async fn a_spent_token_stays_refused_after_redis_restarts_from_an_older_snapshot() {
    let (mut redis, api, proxy) = room(&[], "admission: {interval: 20ms, batch_size: 50}").await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let back = spend_then_lose_the_spend(&mut redis, &[&proxy], &token).await;
    assert_eq!(back.as_deref(), Some(token.as_str()), "the snapshot brought the token back");
    assert_still_spent(&proxy, &api, &token).await;
}

/// Saves a snapshot, spends `alice`'s `token` through the first of `proxies`, then, with all of
/// them paused (none can make the spend again before the token is seen back), restarts Redis
/// from that snapshot. Returns what Redis holds under the token's key before they resume.
async fn spend_then_lose_the_spend(redis: &mut RedisServer, proxies: &[&Proxy], token: &str) -> Option<String> {
    let spender = proxies[0];
    let _: () = redis::cmd("SAVE").query_async(&mut redis.conn().await).await.unwrap();
    assert_eq!(spender.order("alice", Some(token)).await.status, 201);
    assert_eq!(spender.order("alice", Some(token)).await.status, 403, "spent");
    for proxy in proxies {
        proxy.signal("STOP");
    }
    redis.crash();
    redis.restart();
    let back: Option<String> =
        redis::cmd("GET").arg(keys(spender).token("alice")).query_async(&mut redis.conn().await).await.unwrap();
    for proxy in proxies {
        proxy.signal("CONT");
    }
    back
}

/// Once `proxy` reaches the restarted Redis, `token` is still refused as used, and the API saw
/// the one order.
async fn assert_still_spent(proxy: &Proxy, api: &DemoApi, token: &str) {
    // A user who never entered asks Redis on every poll: 200 once the proxy is reconnected.
    let answered = wait_until(Duration::from_secs(10), Duration::from_millis(50), || async {
        proxy.status("nobody").await.status == 200
    })
    .await;
    assert!(answered, "the proxy reaches the restarted Redis");
    let again = proxy.order("alice", Some(token)).await;
    assert_eq!(again.status, 403, "{}", again.body);
    assert_eq!(again.json(), serde_json::json!({"error": "the entry token has already been used"}));
    assert_eq!(api.stats().await["completed"], 1, "one order for one admission");
}

/// Redis took an order's claim but its reply never reached the proxy (here: Redis stalled past
/// `redis.timeout`, then ran the queued claim). The user got 503; once Redis answers again the
/// proxy ends that claim, so the user's retry is forwarded instead of meeting 409 until
/// `token.claim_timeout` (40 s here).
#[tokio::test]
async fn a_claim_whose_reply_was_lost_does_not_hold_the_users_retries() {
    let (redis, api, proxy) = room(
        &[],
        "admission: {interval: 20ms, batch_size: 50}\n\
         redis: {timeout: 200ms}\n\
         token: {claim_timeout: 40s}",
    )
    .await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;

    // The claim script is loaded: after the stall Redis runs the claim, not a NOSCRIPT.
    assert_eq!(proxy.order("alice", Some("not-the-token")).await.status, 403);
    // A stall longer than redis.timeout (a paused process, a long fork on a big snapshot): the
    // claim waits in Redis's socket buffer and runs once Redis is back.
    redis.freeze();
    let first = proxy.order("alice", Some(&token)).await;
    redis.thaw();
    assert_eq!(first.status, 503, "{}", first.body);
    // The release is retried every 200 ms; a second is ample, and far from claim_timeout.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let retry = proxy.order("alice", Some(&token)).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(api.stats().await["completed"], 1);
}

/// The issue's reproduction: Redis restarts from a snapshot taken before u1 and u2 entered, and
/// the arrival counter, rolled back with it, hands their numbers to v1 and v2. The proxy had
/// learned u1's and u2's numbers; it must not answer them from memory (that would be v1's and
/// v2's positions): their next status that Redis answers says NOT_IN_QUEUE, within the
/// contract's second, and they may enter again, at the back.
#[tokio::test]
async fn places_lost_by_a_restart_from_an_older_snapshot_are_told_not_in_queue() {
    let (mut redis, _api, proxy) = quiet_room("").await;
    for (i, user) in ["a1", "a2", "a3"].into_iter().enumerate() {
        assert_waiting_at(&proxy.enter(user).await, i as u64 + 1);
    }
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    assert_waiting_at(&proxy.enter("u1").await, 4);
    assert_waiting_at(&proxy.enter("u2").await, 5);
    assert_waiting_at(&proxy.status("u1").await, 4);

    redis.crash();
    redis.restart();
    let back = Instant::now();
    // Another proxy of the room (here: the library) queues two newcomers at once, before this
    // proxy has even reconnected: the counter hands them u1's and u2's old numbers.
    let other = library_room(&redis, &proxy.key_prefix());
    for (user, position) in [("v1", 4), ("v2", 5)] {
        let entered = enter_room(&other, user, 100).await.unwrap();
        assert_eq!(entered, waitroom::store::EnterOutcome::Waiting { position, already: false });
    }

    for user in ["u1", "u2"] {
        let told = loop {
            let r = proxy.status(user).await;
            if r.status != 503 {
                break r;
            }
            assert!(back.elapsed() < Duration::from_secs(1), "{user}: still 503 a second after Redis came back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_answer(user, &told, 200, not_in_queue());
    }
    assert!(back.elapsed() <= Duration::from_secs(1), "told within the contract's second: {:?}", back.elapsed());
    for (user, position) in [("a1", 1), ("a3", 3), ("v1", 4), ("v2", 5)] {
        assert_waiting_at(&proxy.status(user).await, position);
    }
    assert_waiting_at(&proxy.enter("u1").await, 6);
    assert_waiting_at(&proxy.status("u1").await, 6);
}

/// A single-URL proxy reconnects by itself once Redis is back, not only after a request failed
/// on the dead connection: the first request after a restart is answered by Redis.
#[tokio::test]
async fn the_first_request_after_redis_came_back_is_answered() {
    let (mut redis, _api, proxy) = quiet_room("").await;
    assert_waiting_at(&proxy.enter("before").await, 1);
    redis.crash();
    redis.restart();
    // Redis has been back for a while (the contract gives readiness a second; this is more).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = proxy.status("someone").await;
    assert_answer("the first status", &status, 200, not_in_queue());
    let enter = proxy.enter("newcomer").await;
    assert_eq!(enter.status, 200, "{}", enter.body);
}

/// A room whose ticks keep running (and sweeping) but admit nobody past the holder of its one
/// active token; every tier says poll after 1 s.
const SWEEPING_ROOM: &str = "admission: {interval: 100ms, batch_size: 1, max_active: 1}\n\
                             poll_after: [{min_wait: 0s, poll_after: 1s}]";

/// Starts a room on `redis` whose one active token `holder` took: the others wait, and ticks go on.
async fn sweeping_room(redis: &RedisServer, api: &DemoApi, yaml: &str) -> Proxy {
    let proxy = Proxy::builder(&redis.url(), api.addr()).yaml(SWEEPING_ROOM).yaml(yaml).start().await;
    assert_eq!(proxy.enter("holder").await.status, 200);
    let admitted = key_appears(redis, &keys(&proxy).token("holder"), Duration::from_secs(10)).await;
    assert!(admitted, "the holder is admitted");
    proxy
}

/// Polls each of `users` as told (one round a second, each poll a second after the answer
/// before, through 503s too) for `time`; returns every answer that was neither WAITING nor a 503.
/// The first round comes a second after the call, less `since_answer`.
async fn poll_as_told(proxy: &Proxy, users: &[&str], time: Duration) -> Vec<String> {
    poll_as_told_after(proxy, users, time, Duration::ZERO).await
}

async fn poll_as_told_after(proxy: &Proxy, users: &[&str], time: Duration, since_answer: Duration) -> Vec<String> {
    let mut wrong = Vec::new();
    let until = Instant::now() + time;
    let mut pause = Duration::from_secs(1) - since_answer;
    while Instant::now() < until {
        tokio::time::sleep(pause).await;
        pause = Duration::from_secs(1);
        let answers = futures::future::join_all(users.iter().map(|u| proxy.status(u))).await;
        for (user, r) in users.iter().zip(answers) {
            if r.status != 503 && status_of(&r) != "WAITING" {
                wrong.push(format!("{user}: {} {}", r.status, r.body));
            }
        }
    }
    wrong
}

/// The issue's reproduction: users poll as told through a 5 s SIGSTOP of Redis (their polls get
/// 503). When it is back, none of them has lost the place (abandonment) or is refused as too
/// early (enforced polling), although 5 s is more than `abandon_after` and the polls Redis had
/// queued while frozen run only then. A user who really left is still dropped: the room's clock
/// stopped for the outage, it did not stop for good.
#[tokio::test]
async fn an_outage_is_never_counted_against_users_who_kept_polling() {
    let (redis, api) = (RedisServer::start(), DemoApi::start(&[]));
    let proxy = sweeping_room(&redis, &api, "queue: {abandon_after: 2s}\npolling: {enforce: true}").await;
    let users = ["w0", "w1", "w2", "w3"];
    for user in users {
        assert_eq!(proxy.enter(user).await.status, 200);
    }
    let wrong = poll_as_told(&proxy, &users, Duration::from_secs(2)).await;
    assert!(wrong.is_empty(), "before the outage: {wrong:?}");
    assert_eq!(proxy.enter("leaver").await.status, 200);

    redis.freeze();
    let wrong = poll_as_told(&proxy, &users, Duration::from_secs(5)).await;
    assert!(wrong.is_empty(), "during the outage: {wrong:?}");
    // Back half way to the users' next poll: the polls Redis queued while frozen run now, and
    // the users ask again half a second later, a second after their last (503) answer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.thaw();
    let wrong = poll_as_told_after(&proxy, &users, Duration::from_millis(2500), Duration::from_millis(500)).await;
    assert!(wrong.is_empty(), "after the outage: {wrong:?}");
    assert_eq!(proxy.counter("waitroom_abandoned_total").await, 1.0, "the leaver only");
    assert_answer("the leaver", &proxy.status("leaver").await, 200, not_in_queue());
}

/// Abandonment switched off by a reload remembers nothing while off: users who kept polling
/// meanwhile (unrecorded) are not dropped when it is switched on again, although their last
/// recorded poll is older than `abandon_after` by then. (Enforced polling keeps the room's
/// clock running meanwhile.)
#[tokio::test]
async fn switching_abandonment_back_on_drops_nobody_who_kept_polling() {
    let (redis, api) = (RedisServer::start(), DemoApi::start(&[]));
    let proxy = sweeping_room(&redis, &api, "queue: {abandon_after: 2s}
polling: {enforce: true}").await;
    let users = ["w0", "w1", "w2"];
    for user in users {
        assert_eq!(proxy.enter(user).await.status, 200);
    }
    let reloads = |n: f64| {
        let proxy = &proxy;
        async move {
            let done = wait_until(Duration::from_secs(10), Duration::from_millis(20), || async {
                proxy.counter(r#"waitroom_config_reloads_total{result="ok"}"#).await >= n
            })
            .await;
            assert!(done, "reload {n} applied");
        }
    };
    proxy.rewrite_config("queue: {abandon_after: 0s}");
    proxy.signal("HUP");
    reloads(1.0).await;
    let wrong = poll_as_told(&proxy, &users, Duration::from_secs(3)).await;
    assert!(wrong.is_empty(), "while off: {wrong:?}");
    proxy.rewrite_config("queue: {abandon_after: 2s}");
    proxy.signal("HUP");
    reloads(2.0).await;
    let wrong = poll_as_told(&proxy, &users, Duration::from_millis(1500)).await;
    assert!(wrong.is_empty(), "switched on again: {wrong:?}");
    assert_eq!(proxy.counter("waitroom_abandoned_total").await, 0.0);
}

/// A token spent through one proxy is refused by every proxy of the room, even after Redis
/// restarts from a snapshot taken while it was live: the spend was announced to the others.
#[tokio::test]
async fn a_token_spent_through_one_proxy_is_refused_by_the_others_after_redis_lost_the_spend() {
    let (mut redis, api) = (RedisServer::start(), DemoApi::start(&[]));
    let builder = Proxy::builder(&redis.url(), api.addr()).yaml("admission: {interval: 20ms, batch_size: 50}");
    let (a, b) = (builder.start().await, builder.start().await);
    let spent_channel = keys(&a).spent;
    let conn = redis.conn().await;
    let subscribed = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let (mut conn, channel) = (conn.clone(), spent_channel.clone());
        async move {
            let (_, n): (String, u64) =
                redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel).query_async(&mut conn).await.unwrap();
            n >= 2
        }
    })
    .await;
    assert!(subscribed, "both proxies listen for spent tokens");
    let token = a.until_ready("alice", Duration::from_secs(10)).await;
    let back = spend_then_lose_the_spend(&mut redis, &[&a, &b], &token).await;
    assert_eq!(back.as_deref(), Some(token.as_str()), "the snapshot brought the token back");
    assert_still_spent(&b, &api, &token).await;
}


/// A spend that Redis lost is made again by the proxies that remember it, once they notice the
/// restart: a proxy that starts only afterwards, and so never heard of the spend, refuses the
/// token too.
#[tokio::test]
async fn a_spend_redis_lost_is_made_again_when_the_proxies_notice_the_restart() {
    let (mut redis, api, a) = room(&[], "admission: {interval: 20ms, batch_size: 50}").await;
    let token = a.until_ready("alice", Duration::from_secs(10)).await;
    let back = spend_then_lose_the_spend(&mut redis, &[&a], &token).await;
    let token_key = keys(&a).token("alice");
    let get = || async {
        let value: Option<String> =
            redis::cmd("GET").arg(&token_key).query_async(&mut redis.conn().await).await.unwrap();
        value
    };
    assert_eq!(back.as_deref(), Some(token.as_str()), "the snapshot brought the token back");
    let deleted_again = wait_until(Duration::from_secs(5), Duration::from_millis(20), || async { get().await.is_none() }).await;
    assert!(deleted_again, "the token the snapshot brought back is deleted again");
    let later = Proxy::builder(&redis.url(), api.addr()).key_prefix(&a.key_prefix()).start().await;
    let again = later.order("alice", Some(&token)).await;
    assert_eq!(again.status, 403, "{}", again.body);
    assert_eq!(api.stats().await["completed"], 1, "one order for one admission");
}

// ---- a restart from an older snapshot, under load ------------------------------------------------

/// One answer a rider got: when the call was sent and answered, which call, and what came back.
#[derive(Debug, Clone)]
struct Heard {
    user: String,
    sent: Instant,
    got: Instant,
    enter: bool,
    code: u16,
    body: serde_json::Value,
}

impl Heard {
    fn status(&self) -> &str {
        self.body["status"].as_str().unwrap_or("-")
    }
}

type Journal = Arc<Mutex<Vec<Heard>>>;

/// One call through the proxy at `base`, written in the journal (a transport error as code 0).
async fn call(client: &reqwest::Client, base: &str, user: &str, enter: bool, journal: &Journal) -> Heard {
    let sent = Instant::now();
    let req = if enter {
        client.post(format!("{base}/queue/enter"))
    } else {
        client.get(format!("{base}/queue/status"))
    };
    let (code, body) = match try_send(req.header("X-User-Id", user)).await {
        Ok(r) => (r.status, serde_json::from_str(&r.body).unwrap_or(serde_json::Value::Null)),
        Err(_) => (0, serde_json::Value::Null),
    };
    let heard = Heard { user: user.to_owned(), sent, got: Instant::now(), enter, code, body };
    journal.lock().unwrap().push(heard.clone());
    heard
}

/// A user of the loaded room: enters (again after a 503), then polls every 80-120 ms through
/// the proxies in turn until `stop`; told NOT_IN_QUEUE, enters again once, at the back. A user
/// whose enter was made by another proxy of the room (`entered`) only polls.
async fn rider(bases: Arc<Vec<String>>, user: String, entered: bool, journal: Journal, stop: Arc<AtomicBool>) {
    let client = http_client();
    // Which proxy, and the jitter: a count that starts somewhere different for each rider.
    let mut n = user.bytes().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
    let enter_until_200 = async |n: &mut usize| {
        while !stop.load(Ordering::Relaxed) {
            *n += 1;
            if call(&client, &bases[*n % bases.len()], &user, true, &journal).await.code == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if !entered {
        enter_until_200(&mut n).await;
    }
    let mut reentered = false;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(80 + (n % 41) as u64)).await;
        n += 1;
        let heard = call(&client, &bases[n % bases.len()], &user, false, &journal).await;
        if heard.status() == "NOT_IN_QUEUE" && !reentered {
            reentered = true;
            enter_until_200(&mut n).await;
        }
    }
}

/// Contract section 5 under load: two proxies, riders entering and polling through them; Redis
/// `SAVE`s, more riders enter, and Redis is SIGKILLed and restarted from that older snapshot
/// while newcomers keep coming (the rolled-back counter hands them the lost riders' numbers).
/// Nobody is ever shown a position that is not their own place in the line (ZRANK + 1, in the
/// line before the crash or in the restored one after it; nobody is admitted in this room, so
/// places never move), every rider whose place was lost is told NOT_IN_QUEUE within 1 s of
/// Redis answering again and may enter again at the back, and nobody is admitted, let alone twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_a_restart_from_an_older_snapshot_shows_nobody_a_wrong_position() {
    const WAVE: usize = 20;

    let mut redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let builder = Proxy::builder(&redis.url(), api.addr()).yaml(NO_ADMISSION);
    let a = start_settled(&redis, &builder).await;
    let b = builder.start().await;
    let bases = Arc::new(vec![a.url(""), b.url("")]);
    let journal: Journal = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut riders = Vec::new();
    let mut ride = |user: String, entered: bool| {
        riders.push(tokio::spawn(rider(bases.clone(), user, entered, journal.clone(), stop.clone())));
    };
    let line_holds = |n: u64| {
        let (redis, a) = (&redis, &a);
        async move {
            let held = wait_until(Duration::from_secs(10), Duration::from_millis(20), || async {
                queue_len(redis, a).await == n
            })
            .await;
            assert!(held, "the line holds {n}");
        }
    };

    // Kept: the first wave, in the snapshot.
    let kept: Vec<String> = (0..WAVE).map(|i| format!("kept-{i:02}")).collect();
    kept.iter().for_each(|u| ride(u.clone(), false));
    line_holds(WAVE as u64).await;
    let _: () = redis::cmd("SAVE").query_async(&mut redis.conn().await).await.unwrap();
    // Lost: entered after the snapshot, polled long enough for both proxies to learn their numbers.
    let lost: Vec<String> = (0..WAVE).map(|i| format!("lost-{i:02}")).collect();
    lost.iter().for_each(|u| ride(u.clone(), false));
    line_holds(2 * WAVE as u64).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = zrange_all(&mut redis.conn().await, &keys(&a).queue).await;

    let crashed = Instant::now();
    tokio::task::block_in_place(|| {
        redis.crash();
        redis.restart();
    });
    let back = Instant::now();
    // Newcomers at once: a few through another proxy of the room (the library) before these
    // two have even reconnected, the rest through them. They take the lost riders' numbers.
    let other = library_room(&redis, &a.key_prefix());
    let new: Vec<String> = (0..WAVE).map(|i| format!("new-{i:02}")).collect();
    for (i, user) in new.iter().enumerate() {
        let by_library = i < 5;
        if by_library {
            let sent = Instant::now();
            let entered = enter_room(&other, user, 100_000).await.expect("the library enters");
            let waitroom::store::EnterOutcome::Waiting { position, .. } = entered else {
                panic!("{user}: {entered:?}")
            };
            // The restored counter hands out the lost riders' numbers again (to these, or to lost
            // riders already told and back in line).
            assert!((WAVE as u64 + 1..=3 * WAVE as u64).contains(&position), "{user} at {position}");
            journal.lock().unwrap().push(Heard {
                user: user.clone(),
                sent,
                got: Instant::now(),
                enter: true,
                code: 200,
                body: serde_json::json!({"status": "WAITING", "position": position}),
            });
        }
        ride(user.clone(), by_library);
    }
    // Everybody polls on for 2.5 s after Redis came back: the lost riders enter again meanwhile.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, Ordering::Relaxed);
    for r in riders {
        r.await.expect("rider");
    }

    // Places never move in this room: before the crash each rider's place is their rank in the
    // line then; after it, their rank in the line as it stands now (the restored line and
    // whoever entered since, at the back). A lost rider has no place from the crash until they
    // enter again.
    let after = zrange_all(&mut redis.conn().await, &keys(&a).queue).await;
    let rank = |line: &[String]| -> HashMap<String, u64> {
        line.iter().enumerate().map(|(i, u)| (u.clone(), i as u64 + 1)).collect()
    };
    let (place_before, place_after) = (rank(&before), rank(&after));
    let journal = journal.lock().unwrap().clone();
    let reentered_at: HashMap<&str, Instant> = journal
        .iter()
        .filter(|h| h.enter && h.code == 200 && h.sent >= crashed && h.user.starts_with("lost-"))
        .map(|h| (h.user.as_str(), h.sent))
        .collect();
    let mut wrong = Vec::new();
    let mut codes: HashMap<String, usize> = HashMap::new();
    for h in &journal {
        *codes.entry(format!("{} {} {}", if h.enter { "enter" } else { "status" }, h.code, h.status())).or_default() += 1;
        let at = |t: Instant| t.saturating_duration_since(crashed);
        match (h.code, h.status()) {
            (200, "WAITING") => {
                let shown = h.body["position"].as_u64();
                let own = if h.got < crashed {
                    place_before.get(&h.user)
                } else if h.sent < back && place_before.get(&h.user).copied() == shown {
                    // Sent before Redis answered again: perhaps answered from the line as it
                    // was before the crash (a local answer from the proxy's last reading, given
                    // before it noticed the crash). Nobody had taken the place yet.
                    place_before.get(&h.user)
                } else if h.user.starts_with("lost-") && reentered_at.get(h.user.as_str()).is_none_or(|t| h.sent < *t) {
                    None
                } else {
                    place_after.get(&h.user)
                };
                if shown != own.copied() {
                    wrong.push(format!(
                        "{} shown {shown:?}, own place {own:?} (before the crash {:?}), sent {:?} after the crash",
                        h.user,
                        place_before.get(&h.user),
                        at(h.sent)
                    ));
                }
            }
            (200, "NOT_IN_QUEUE") if h.sent >= crashed && h.user.starts_with("lost-") => {}
            (200, other) => wrong.push(format!("{}: {other} {} (sent {:?} after the crash)", h.user, h.body, at(h.sent))),
            // Redis away: answered after the crash, asked before the proxies are due to reach
            // it again (a second, like readiness).
            (503, _) if h.got >= crashed && h.sent < back + Duration::from_secs(1) => {}
            (code, _) => wrong.push(format!("{}: {code} {} (sent {:?} after the crash)", h.user, h.body, at(h.sent))),
        }
    }
    let mut codes: Vec<_> = codes.into_iter().collect();
    codes.sort();
    println!("restart from an older snapshot under load: Redis back {:?} after the crash; answers {codes:?}", back - crashed);
    assert!(wrong.is_empty(), "{} answers outside the contract, e.g. {:#?}", wrong.len(), &wrong[..wrong.len().min(20)]);

    // Every lost rider told NOT_IN_QUEUE within 1 s of Redis answering again, then back in line.
    let mut told_after = Vec::new();
    for user in &lost {
        let told = journal
            .iter()
            .filter(|h| &h.user == user && !h.enter && h.status() == "NOT_IN_QUEUE" && h.sent >= crashed)
            .map(|h| h.got.saturating_duration_since(back))
            .min();
        assert!(
            told.is_some_and(|t| t <= Duration::from_secs(1)),
            "{user}: told NOT_IN_QUEUE {told:?} after Redis came back (contract: within 1 s)"
        );
        told_after.push(told.unwrap());
        assert!(place_after.get(user).is_some_and(|p| *p > WAVE as u64), "{user} entered again, at the back");
    }
    println!("lost riders told NOT_IN_QUEUE {:?} after Redis came back at the latest", told_after.iter().max());
    assert_eq!(&after[..WAVE], &before[..WAVE], "the snapshot kept the first wave, in order");
    let everyone: HashSet<&String> = kept.iter().chain(&lost).chain(&new).collect();
    assert_eq!(after.len(), everyone.len(), "one place per rider: {after:?}");

    // Nobody admitted, so nobody twice: no READY answer, no token, the counter one place a rider.
    assert!(journal.iter().all(|h| h.status() != "READY"), "a READY in a room that admits nobody");
    assert_eq!(zcard(&mut redis.conn().await, &keys(&a).tokens).await, 0, "no live token");
    let seq: u64 = redis::cmd("GET").arg(keys(&a).seq).query_async(&mut redis.conn().await).await.unwrap();
    // The snapshot's WAVE numbers, then one for each newcomer and each lost rider back in line
    // (4 x WAVE had the counter not rolled back with the snapshot).
    assert_eq!(seq, 3 * WAVE as u64, "the counter rolled back, then one number per place");
}
