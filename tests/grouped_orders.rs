//! Grouped claims and settles (`src/store/consume.rs`, `src/store/group.rs`): an order's two Redis
//! calls travel in groups as enters do, and each member still gets exactly the answer a call of
//! its own would have given: one claim per token however many parallel requests present it, a
//! spend only of the token that was used. Against a real `redis-server`, through the library's
//! `Room`, as the proxy calls it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::future::join_all;
use waitroom::store::{Claim, RoomStore};

const HOLD: Duration = Duration::from_secs(30);

/// Gives each user a live token straight in Redis, as an admission would.
async fn mint(redis: &RedisServer, room: &RoomStore, users: &[String]) -> Vec<String> {
    let mut conn = redis.conn().await;
    let mut tokens = Vec::new();
    for user in users {
        let token = format!("token-of-{user}");
        let _: () = redis::cmd("SET")
            .arg(room.keys().token(user))
            .arg(&token)
            .arg("PX")
            .arg(300_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("ZADD").arg(&room.keys().tokens).arg(1).arg(user).query_async(&mut conn).await.unwrap();
        tokens.push(token);
    }
    tokens
}

async fn get(redis: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(&mut redis.conn().await).await.unwrap()
}

/// `user-0` .. `user-{n-1}`.
fn users(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user-{i}")).collect()
}

/// A fresh Redis and the library's room on it, where each of `users` holds a live token: the
/// tokens, in the users' order.
async fn minted_room(users: &[String]) -> (RedisServer, Arc<RoomStore>, Vec<String>) {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    let tokens = mint(&redis, &room, users).await;
    (redis, room, tokens)
}

/// [`minted_room`] with each token claimed by its user's order `{user}/r`, and a subscription to
/// the channel spends are announced on.
async fn claimed_room(users: &[String]) -> (RedisServer, Arc<RoomStore>, Vec<String>, redis::aio::PubSub) {
    let (redis, room, tokens) = minted_room(users).await;
    for (user, token) in users.iter().zip(&tokens) {
        assert_eq!(room.claim(user, token, &format!("{user}/r"), HOLD).await.unwrap(), Claim::Claimed);
    }
    let mut announced = redis::Client::open(redis.url()).unwrap().get_async_pubsub().await.unwrap();
    announced.subscribe(&room.keys().spent).await.unwrap();
    (redis, room, tokens, announced)
}

/// 60 users, each with three parallel requests presenting their token and one presenting a
/// forged one, all at once: exactly one claim per user is taken, with the id of the request
/// that got it; the others are told IN_USE, the forged ones INVALID; and the 240 claims took far
/// fewer than 240 calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_claims_share_calls_and_each_token_is_claimed_once() {
    let users = users(60);
    let (redis, room, tokens) = minted_room(&users).await;
    room.claim("warm-up", "none", "r", HOLD).await.unwrap(); // loads the script
    reset_stats(&redis).await;

    let mut requests = Vec::new();
    for (user, token) in users.iter().zip(&tokens) {
        for copy in 0..3 {
            requests.push((user.clone(), token.clone(), format!("{user}/{copy}")));
        }
        requests.push((user.clone(), format!("{token}-forged"), format!("{user}/forged")));
    }
    let claims = join_all(requests.iter().map(|(user, token, id)| {
        let room = Arc::clone(&room);
        async move { room.claim_grouped(user, token, id, HOLD).await.unwrap() }
    }))
    .await;

    let calls = evalsha_calls(&redis).await;
    assert!(calls <= 40, "240 claims took {calls} calls: not grouped");
    for (user, token) in users.iter().zip(&tokens) {
        let mine: Vec<(&String, Claim)> = requests
            .iter()
            .zip(&claims)
            .filter(|((u, t, _), _)| u == user && t == token)
            .map(|((_, _, id), claim)| (id, *claim))
            .collect();
        let winners: Vec<&String> = mine.iter().filter(|(_, c)| *c == Claim::Claimed).map(|(id, _)| *id).collect();
        assert_eq!(winners.len(), 1, "{user}: {mine:?}");
        assert!(mine.iter().all(|(_, c)| matches!(c, Claim::Claimed | Claim::InUse)), "{user}: {mine:?}");
        assert_eq!(get(&redis, &room.keys().claim(user)).await.as_ref(), Some(winners[0]), "{user}'s claim is the winner's");
    }
    let forged = requests.iter().zip(&claims).filter(|((_, t, _), _)| t.ends_with("-forged"));
    for ((user, _, _), claim) in forged {
        assert_eq!(*claim, Claim::Invalid, "{user}'s forged token");
    }
}

/// Claims under different holds (a reload between them) never share a call's terms: each claim
/// is held for its own claim_timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_under_different_holds_keep_their_own() {
    let users = users(40);
    let (redis, room, tokens) = minted_room(&users).await;
    let hold = |i: usize| Duration::from_secs(if i % 2 == 0 { 20 } else { 200 });
    let claims = join_all(users.iter().zip(&tokens).enumerate().map(|(i, (user, token))| {
        let room = Arc::clone(&room);
        async move { room.claim_grouped(user, token, "r", hold(i)).await.unwrap() }
    }))
    .await;
    assert!(claims.iter().all(|c| *c == Claim::Claimed), "{claims:?}");
    let mut conn = redis.conn().await;
    for (i, user) in users.iter().enumerate() {
        let left: i64 = redis::cmd("PTTL").arg(room.keys().claim(user)).query_async(&mut conn).await.unwrap();
        let hold = hold(i).as_millis() as i64;
        assert!((hold - 5_000..=hold).contains(&left), "{user}: held {left} ms, not {hold}");
    }
}

/// 60 claimed tokens settled at once, every other one after a successful order: exactly those
/// are spent (token, live-token entry and claim gone, announced on the spent channel), the others
/// keep their token with the claim ended; a settle for a token that is no longer the user's
/// (entered and admitted again) removes nothing. Far fewer calls than settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_settles_share_calls_and_spend_only_the_used_tokens() {
    let users = users(60);
    let (redis, room, tokens, mut announced) = claimed_room(&users).await;
    reset_stats(&redis).await;

    // user-0 was admitted again meanwhile: the token its order used is no longer its current one.
    let _: () = redis::cmd("SET").arg(room.keys().token("user-0")).arg("newer").query_async(&mut redis.conn().await).await.unwrap();
    let spent = join_all(users.iter().zip(&tokens).enumerate().map(|(i, (user, token))| {
        let room = Arc::clone(&room);
        async move { room.consume_grouped(user, token, &format!("{user}/r"), i % 2 == 0).await.unwrap() }
    }))
    .await;

    let calls = evalsha_calls(&redis).await;
    assert!(calls <= 20, "60 settles took {calls} calls: not grouped");
    let live: Vec<String> = zrange_all(&mut redis.conn().await, &room.keys().tokens).await;
    for (i, (user, token)) in users.iter().zip(&tokens).enumerate() {
        assert_eq!(get(&redis, &room.keys().claim(user)).await, None, "{user}'s claim ended");
        let current = get(&redis, &room.keys().token(user)).await;
        if i == 0 {
            assert!(!spent[i], "a newer token is never removed");
            assert_eq!(current.as_deref(), Some("newer"));
        } else if i % 2 == 0 {
            assert!(spent[i], "{user}'s order succeeded");
            assert_eq!(current, None, "{user}'s token is spent");
            assert!(!live.contains(user), "{user} is no longer among the live tokens");
        } else {
            assert!(!spent[i], "{user}'s order failed");
            assert_eq!(current.as_ref(), Some(token), "{user} keeps the token to retry");
            assert!(live.contains(user));
        }
    }
    let mut messages = announced.on_message();
    let mut heard = Vec::new();
    for _ in 0..29 {
        let message = tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut messages))
            .await
            .expect("every spend is announced")
            .unwrap();
        let text: String = message.get_payload().unwrap();
        let (_, rest) = text.split_once(' ').unwrap();
        heard.push(rest.to_owned());
    }
    heard.sort();
    let mut expected: Vec<String> =
        (2..60).step_by(2).map(|i| format!("{} {}", tokens[i], users[i])).collect();
    expected.sort();
    assert_eq!(heard, expected);
}

/// Two settles of one user in the same group (a double submit whose two answers came back
/// together): the group reads its members' claims and tokens once, before any of them runs, so
/// the second reads again and finds what the first did. The token is spent once, announced
/// once, and the second settle is told it removed nothing, as a call of its own would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_settled_twice_in_a_group_is_spent_once() {
    let users: Vec<String> = ["holder", "alice", "bob"].map(String::from).to_vec();
    let (redis, room, tokens, mut announced) = claimed_room(&users).await;
    assert!(!room.consume("nobody", "none", "", true).await.unwrap()); // loads the script
    reset_stats(&redis).await;

    let settle = |i: usize| {
        let (room, user, token) = (Arc::clone(&room), users[i].clone(), tokens[i].clone());
        async move { room.consume_grouped(&user, &token, &format!("{user}/r"), true).await.unwrap() }
    };
    // One call out and hanging (the holder's), so the settles behind it gather in one group.
    redis.freeze();
    let first = tokio::spawn(settle(0));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let group = join_all([1, 1, 2, 1].map(settle));
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.thaw();
    };
    let (spent, ()) = tokio::join!(group, thaw);
    assert!(first.await.unwrap());
    assert_eq!(evalsha_calls(&redis).await, 2, "the holder's call and the group's");
    assert_eq!(spent, [true, false, true, false]);
    for user in &users {
        assert_eq!(get(&redis, &room.keys().token(user)).await, None, "{user}'s token is spent");
        assert_eq!(get(&redis, &room.keys().claim(user)).await, None, "{user}'s claim ended");
    }
    assert!(zrange_all(&mut redis.conn().await, &room.keys().tokens).await.is_empty());
    let mut messages = announced.on_message();
    let mut heard = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(1), futures::StreamExt::next(&mut messages)).await {
        let text: String = message.get_payload().unwrap();
        heard.push(text.split_once(' ').unwrap().1.to_owned());
    }
    heard.sort();
    let mut expected: Vec<String> = users.iter().zip(&tokens).map(|(user, token)| format!("{token} {user}")).collect();
    expected.sort();
    assert_eq!(heard, expected, "each spend announced once");
}
