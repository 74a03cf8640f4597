//! When Redis loses writes (contract section 5): a restart from an older snapshot must not bring
//! back what the room already decided.

mod common;

use std::time::Duration;

use common::*;

/// A token spent by an order stays refused, even after Redis restarts from a snapshot taken
/// while it was still live (the delete is lost and the token is back in Redis).
#[tokio::test]
async fn a_spent_token_stays_refused_after_redis_restarts_from_an_older_snapshot() {
    let mut redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .yaml("admission: {interval: 20ms, batch_size: 50}")
        .start()
        .await;
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
