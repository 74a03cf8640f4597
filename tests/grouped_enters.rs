//! Grouped enters (`src/store/enter.rs`): concurrent enters travel in one script call, and each
//! still gets exactly the answer a call of its own would have given. Against a real
//! `redis-server`, through the library's `Room`, as the proxy calls it.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::future::join_all;
use waitroom::store::{EnterOutcome, EnterRequest, PollClock, RoomStore, RoomRules, StoreError, GROUP_MAX};

fn request(user: &str, capacity: u64) -> EnterRequest<'_> {
    EnterRequest { user, capacity, per_address: None, poll: PollClock::OFF }
}

async fn enter(room: &Arc<RoomStore>, user: &str, capacity: u64) -> Result<EnterOutcome, StoreError> {
    Ok(room.enter_grouped(request(user, capacity), &RoomRules::OFF).await?.outcome)
}

/// 200 users at once against a capacity of 150: the line holds exactly 150, each waiting user
/// is told the place Redis gave them, and the 200 enters took far fewer than 200 calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enters_share_calls_and_each_gets_its_own_answer() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    enter(&room, "warm-up", 1).await.unwrap(); // loads the script
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("DEL").arg(&room.keys().queue).query_async(&mut conn).await.unwrap();
    reset_stats(&redis).await;

    let users: Vec<String> = (0..200).map(|i| format!("user-{i}")).collect();
    let outcomes = join_all(users.iter().map(|user| {
        let room = Arc::clone(&room);
        async move { enter(&room, user, 150).await.unwrap() }
    }))
    .await;

    let calls = evalsha_calls(&redis).await;
    // In groups of up to GROUP_MAX, the first ones perhaps alone: about 200 / GROUP_MAX calls.
    assert!(calls <= 40, "200 enters took {calls} calls: not grouped (groups of up to {GROUP_MAX})");
    let line = zrange_all(&mut conn, &room.keys().queue).await;
    assert_eq!(line.len(), 150, "the capacity holds across groups");
    let mut positions = HashSet::new();
    let mut full = 0;
    for (user, outcome) in users.iter().zip(&outcomes) {
        match outcome {
            EnterOutcome::Waiting { position, already: false } => {
                let rank = line.iter().position(|u| u == user).expect("a waiting user is in the line");
                assert_eq!(*position, rank as u64 + 1, "{user} is told the place Redis gave them");
                assert!(positions.insert(*position), "{user}: position {position} given twice");
            }
            EnterOutcome::Full => {
                assert!(!line.contains(user), "{user} was told FULL but holds a place");
                full += 1;
            }
            other => panic!("{user}: {other:?}"),
        }
    }
    assert_eq!(full, 50);
    // Numbered as INCRs of their own would have: the warm-up took 1, the places 2 to 151, and
    // the counter stands at the last of them.
    let mut numbers: Vec<u64> = scores(&mut conn, &room.keys().queue).await;
    numbers.sort_unstable();
    assert_eq!(numbers, (2..=151).collect::<Vec<u64>>());
    assert_eq!(counter(&mut conn, &room).await, 151);
}

async fn scores(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<u64> {
    let line: Vec<(String, f64)> =
        redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES").query_async(conn).await.unwrap();
    line.into_iter().map(|(_, score)| score as u64).collect()
}

async fn counter(conn: &mut redis::aio::MultiplexedConnection, room: &RoomStore) -> u64 {
    redis::cmd("GET").arg(&room.keys().seq).query_async(conn).await.unwrap()
}

/// A member whose command fails (here its address's counter is a key of the wrong type) fails
/// its whole group, and the places its group took before it stay in the line: the counter still
/// stands past their numbers, so no later enter is given a number that is already in the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_leaves_no_number_to_be_given_again() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    // Each from an address of its own, counted: the broken member's count cannot be read.
    let enter = |room: &Arc<RoomStore>, user: &str| {
        let (room, user) = (Arc::clone(room), user.to_owned());
        async move {
            let request = EnterRequest { per_address: Some((user.as_str(), 1000)), ..request(&user, 100) };
            Ok::<_, StoreError>(room.enter_grouped(request, &RoomRules::OFF).await?.outcome)
        }
    };
    enter(&room, "warm-up").await.unwrap();
    let mut conn = redis.conn().await;
    let broken = room.keys().abuse_counter("broken");
    let _: () = redis::cmd("RPUSH").arg(broken).arg("x").query_async(&mut conn).await.unwrap();
    // One call out and hanging, so the twenty-one enters behind it gather in one group, in the
    // order they are made.
    redis.freeze();
    let first = {
        let room = Arc::clone(&room);
        tokio::spawn(async move { enter(&room, "first").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let users: Vec<String> =
        (0..10).map(|i| format!("u{i}")).chain(["broken".to_owned()]).chain((10..20).map(|i| format!("u{i}"))).collect();
    let group = join_all(users.iter().map(|user| enter(&room, user)));
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.thaw();
    };
    let (outcomes, ()) = tokio::join!(group, thaw);
    assert!(first.await.unwrap().is_ok());
    assert!(outcomes.iter().all(Result::is_err), "the group failed as one: {outcomes:?}");

    let taken = scores(&mut conn, &room.keys().queue).await;
    assert_eq!(taken.len(), 12, "warm-up, first, and the ten before the broken member");
    assert_eq!(counter(&mut conn, &room).await, *taken.iter().max().unwrap());
    enter(&room, "late").await.unwrap();
    let mut numbers = scores(&mut conn, &room.keys().queue).await;
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), 13, "a number given twice: {numbers:?}");
}

/// Users whose places were lost (abandonment) and new users, entering together: each place
/// lost and taken again at the back moves everyone behind up, and every waiting user is still
/// told the place Redis gave them, as in calls of their own. The script keeps the line's
/// length as a group's members change it, so a miscount would show here as a wrong position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_places_and_new_ones_in_one_group_each_get_their_place() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    let rules = RoomRules { abandon_after: Duration::from_secs(60), ..RoomRules::OFF };
    let enter = |user: String| {
        let (room, rules) = (Arc::clone(&room), rules.clone());
        async move { (user.clone(), room.enter_grouped(request(&user, 1000), &rules).await.unwrap().outcome) }
    };
    for i in 0..20 {
        enter(format!("old-{i}")).await;
    }
    // Every other one of them not heard from since the room's time began: their places are lost.
    let mut conn = redis.conn().await;
    for i in (0..20).step_by(2) {
        let _: () = redis::cmd("ZADD").arg(&room.keys().heard).arg(0).arg(format!("old-{i}")).query_async(&mut conn).await.unwrap();
    }
    reset_stats(&redis).await;
    let users = (0..20).map(|i| format!("old-{i}")).chain((0..20).map(|i| format!("new-{i}")));
    let outcomes = join_all(users.map(enter)).await;
    assert!(evalsha_calls(&redis).await <= 10, "the enters were not grouped");

    // The line as calls of their own, one after another in the order the enters were made,
    // would have moved it: what each was told, and where everyone stands at the end.
    let mut model: Vec<String> = (0..20).map(|i| format!("old-{i}")).collect();
    for (user, outcome) in &outcomes {
        let lost = user.starts_with("old-") && user[4..].parse::<usize>().unwrap() % 2 == 0;
        let kept = user.starts_with("old-") && !lost;
        if !kept {
            model.retain(|u| u != user);
            model.push(user.clone());
        }
        let place = model.iter().position(|u| u == user).unwrap() as u64 + 1;
        assert_eq!(*outcome, EnterOutcome::Waiting { position: place, already: kept }, "{user}");
    }
    assert_eq!(zrange_all(&mut conn, &room.keys().queue).await, model);
}

/// A token given in a group is seen by the members after it: the group reads its members'
/// tokens once, before any of them runs, so a user who comes again in the same call reads again.
/// The instant pass admits alice (the line is empty and the interval has room); alice once more
/// is READY with the same token, and so is dave, who held one before the group; carol, queued
/// by the group, is already waiting when she comes again in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_given_in_a_group_is_seen_by_the_members_after_it() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    let rules = RoomRules { instant: true, ..RoomRules::fixed(Duration::from_secs(3600), 1, Duration::from_secs(60)) };
    let enter = |user: &'static str| {
        let room = Arc::clone(&room);
        async move { room.enter_grouped(request(user, 100), &rules).await.unwrap().outcome }
    };
    let mut conn = redis.conn().await;
    for holder in ["bob", "dave"] {
        let _: () = redis::cmd("SET")
            .arg(room.keys().token(holder))
            .arg(format!("{holder}s-token"))
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    enter("bob").await; // loads the script
    reset_stats(&redis).await;
    // One call out and hanging (bob's, who spends no admission), so the enters behind it gather
    // in one group, in the order they are made.
    redis.freeze();
    let first = tokio::spawn(enter("bob"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let group = join_all(["alice", "alice", "dave", "carol", "alice", "carol"].map(enter));
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.thaw();
    };
    let (outcomes, ()) = tokio::join!(group, thaw);
    assert!(matches!(first.await.unwrap(), EnterOutcome::Ready { .. }));
    assert_eq!(evalsha_calls(&redis).await, 2, "bob's call and the group's");

    let EnterOutcome::Instant { token, .. } = &outcomes[0] else { panic!("alice: {:?}", outcomes[0]) };
    for again in [&outcomes[1], &outcomes[4]] {
        assert!(matches!(again, EnterOutcome::Ready { token: t, .. } if t == token), "alice again: {again:?}");
    }
    assert!(matches!(&outcomes[2], EnterOutcome::Ready { token, .. } if token == "daves-token"), "{:?}", outcomes[2]);
    // The interval's one admission is spent: carol waits, first in the line.
    assert_eq!(outcomes[3], EnterOutcome::Waiting { position: 1, already: false });
    assert_eq!(outcomes[5], EnterOutcome::Waiting { position: 1, already: true });
    assert_eq!(zrange_all(&mut conn, &room.keys().queue).await, ["carol"]);
}

/// The same user entering many times at once (a double click, a retrying client), in one group:
/// one place, and only the first enter is the one that queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_twice_in_a_group_holds_one_place() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    enter(&room, "someone-else", 100).await.unwrap();
    let outcomes = join_all((0..20).map(|_| enter(&room, "alice", 100))).await;
    let mut queued = 0;
    for outcome in outcomes {
        match outcome.unwrap() {
            EnterOutcome::Waiting { position: 2, already } => queued += usize::from(!already),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(queued, 1, "exactly one of the enters queued alice");
    assert_eq!(zcard(&mut redis.conn().await, &room.keys().queue).await, 2);
}

/// Enters under different terms (a reload between them: another capacity) never share a call's
/// terms: each is held to its own capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enters_under_other_terms_keep_their_own() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    let users: Vec<String> = (0..120).map(|i| format!("u{i}")).collect();
    let outcomes = join_all(users.iter().enumerate().map(|(i, user)| {
        let room = Arc::clone(&room);
        let capacity = if i % 2 == 0 { 10 } else { 1000 };
        async move { (capacity, enter(&room, user, capacity).await.unwrap()) }
    }))
    .await;
    let mut waiting = 0;
    for (capacity, outcome) in outcomes {
        match (capacity, outcome) {
            (1000, EnterOutcome::Waiting { .. }) => waiting += 1,
            (10, EnterOutcome::Waiting { position, .. }) => {
                assert!(position <= 10, "position {position} past 10");
                waiting += 1;
            }
            (10, EnterOutcome::Full) => {}
            (capacity, outcome) => panic!("capacity {capacity}: {outcome:?}"),
        }
    }
    assert_eq!(zcard(&mut redis.conn().await, &room.keys().queue).await, waiting);
}

/// An enter whose caller stopped waiting while its group had not gone out yet is never sent:
/// the user was answered (503 at the timeout, or nothing: the client left) and holds no place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enter_nobody_waits_for_is_never_sent() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    enter(&room, "warm-up", 100).await.unwrap();
    redis.freeze();
    // a's call out, hanging, and b's behind it (or beside it, were more calls allowed out);
    // c waits for them.
    // One after the other, so that the line's order is known.
    let mut out = Vec::new();
    for user in ["a", "b"] {
        let room = Arc::clone(&room);
        out.push(tokio::spawn(async move { enter(&room, user, 100).await }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gave_up = tokio::time::timeout(Duration::from_millis(100), enter(&room, "c", 100)).await;
    assert!(gave_up.is_err(), "c's enter cannot be answered while Redis hangs");
    redis.thaw();
    for call in out {
        assert!(matches!(call.await.unwrap(), Ok(EnterOutcome::Waiting { .. })));
    }
    // A later enter goes out after the queue was looked at again: c was dropped there, or c's
    // place would be the one before it.
    assert_eq!(enter(&room, "d", 100).await.unwrap(), EnterOutcome::Waiting { position: 4, already: false });
    let line = zrange_all(&mut redis.conn().await, &room.keys().queue).await;
    assert_eq!(line, ["warm-up", "a", "b", "d"]);
}

/// A Redis that hangs fails every member of every group at the timeout: nobody waits longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_redis_fails_every_member_at_the_timeout() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g").with_timeout(Duration::from_millis(300)));
    enter(&room, "warm-up", 100).await.unwrap();
    redis.freeze();
    let started = std::time::Instant::now();
    let outcomes = join_all((0..40).map(|i| {
        let room = Arc::clone(&room);
        async move { enter(&room, &format!("u{i}"), 100).await }
    }))
    .await;
    let took = started.elapsed();
    redis.thaw();
    for outcome in outcomes {
        let error = outcome.expect_err("no answer from a frozen Redis");
        assert!(error.to_string().contains("did not answer within 300ms"), "{error}");
    }
    assert!(took < Duration::from_secs(2), "the enters waited {took:?}");
}

/// Every switch that sends something per member on at once (enforced polls: a poll clock key;
/// a per-address limit: the address's counter; the instant pass: a fresh token), in one group:
/// each member's keys and arguments are its own. One instant pass (the interval's one
/// admission), then waiting places; each member's poll clock started, each address counted its
/// own user, and a second identity from a full address is LIMITED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_reads_its_own_keys_with_every_switch_on() {
    let redis = RedisServer::start();
    let room = Arc::new(library_room(&redis, "g"));
    let rules = RoomRules { instant: true, ..RoomRules::fixed(Duration::from_secs(3600), 1, Duration::from_secs(60)) };
    let thresholds = [(1, Duration::from_secs(10))];
    let enter = |user: String, address: String| {
        let room = Arc::clone(&room);
        async move {
            let poll = PollClock { on_time_factor: Some(0.8), thresholds: &thresholds };
            let request = EnterRequest { user: &user, capacity: 100, per_address: Some((&address, 1)), poll };
            (user.clone(), address.clone(), room.enter_grouped(request, &rules).await.unwrap().outcome)
        }
    };
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("SET").arg(room.keys().token("holder")).arg("t").arg("PX").arg(60_000)
        .query_async(&mut conn).await.unwrap();
    enter("holder".into(), "a-holder".into()).await; // loads the script
    reset_stats(&redis).await;
    redis.freeze();
    let first = tokio::spawn(enter("holder".into(), "a-holder".into()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let members = (0..6).map(|i| (format!("u{i}"), format!("a{i}"))).chain([("second".to_owned(), "a3".to_owned())]);
    let group = join_all(members.map(|(user, address)| enter(user, address)));
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis.thaw();
    };
    let (outcomes, ()) = tokio::join!(group, thaw);
    first.await.unwrap();
    assert_eq!(evalsha_calls(&redis).await, 2, "the holder's call and the group's");

    assert!(matches!(outcomes[0].2, EnterOutcome::Instant { .. }), "{:?}", outcomes[0]);
    for (place, (user, address, outcome)) in outcomes[1..6].iter().enumerate() {
        assert_eq!(*outcome, EnterOutcome::Waiting { position: place as u64 + 1, already: false }, "{user}");
        let clock: Option<String> = redis::cmd("GET").arg(room.keys().poll_clock(user)).query_async(&mut conn).await.unwrap();
        assert!(clock.is_some(), "{user}'s poll clock started");
        let counted: Vec<String> = zrange_all(&mut conn, &room.keys().abuse_counter(address)).await;
        assert_eq!(counted, [user.clone()], "{address} counted {user}");
    }
    assert!(matches!(outcomes[6].2, EnterOutcome::Limited { .. }), "{:?}", outcomes[6]);
    let clock: Option<String> = redis::cmd("GET").arg(room.keys().poll_clock("u0")).query_async(&mut conn).await.unwrap();
    assert_eq!(clock, None, "READY enforces nothing");
    assert_eq!(zrange_all(&mut conn, &room.keys().queue).await, ["u1", "u2", "u3", "u4", "u5"]);
}
