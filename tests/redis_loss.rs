//! When Redis loses writes (contract section 5): a restart from an older snapshot must not bring
//! back what the room already decided.

mod common;

use std::time::Duration;

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
    let back = std::time::Instant::now();
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
    let until = std::time::Instant::now() + time;
    let mut pause = Duration::from_secs(1) - since_answer;
    while std::time::Instant::now() < until {
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
