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
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    assert_eq!(proxy.order("alice", Some(&token)).await.status, 201);
    assert_eq!(proxy.order("alice", Some(&token)).await.status, 403, "spent");

    redis.crash();
    redis.restart();
    let mut conn = redis.conn().await;
    let back: Option<String> = redis::cmd("GET")
        .arg(waitroom::store::Keys::new(&proxy.key_prefix()).token("alice"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(back.as_deref(), Some(token.as_str()), "the snapshot brought the token back");
    // A user who never entered asks Redis on every poll: 200 once the proxy is reconnected.
    let answered = wait_until(Duration::from_secs(10), Duration::from_millis(50), || async {
        proxy.status("nobody").await.status == 200
    })
    .await;
    assert!(answered, "the proxy reaches the restarted Redis");
    let again = proxy.order("alice", Some(&token)).await;
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

/// The reproduction: Redis restarts from a snapshot taken before u1 and u2 entered, and
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
