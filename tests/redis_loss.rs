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
