//! Every Lua script of `lua/` against a real `redis-server`, through the library's `store::Room`
//! (style rule 3): enter, status, admit, adapt, consume and stats, plus the key layout they share.
//!
//! Each test gets its own Redis and its own room. Redis is inspected directly to check what the
//! scripts wrote (scores, TTLs, the key names), with the names taken from `store::Keys` so the
//! tests follow the layout rather than restate it.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use redis::aio::MultiplexedConnection;
use redis::FromRedisValue;
use waitroom::config::Config;
use waitroom::rules::{ControlState, Latencies};
use waitroom::store::{
    AdmitOutcome, Claim, EnterOutcome, EnterRequest, Keys, PollClock, RoomStore, RoomRules, StatusOutcome,
    StoreError, ADAPT_PERIOD,
};

const CAPACITY: u64 = 100_000;
const LONG: Duration = Duration::from_secs(3600);
const TTL: Duration = Duration::from_secs(60);

/// A room on `redis` named `prefix`, built the way the proxy builds it: from parsed configuration.
fn open_room(redis: &RedisServer, prefix: &str) -> RoomStore {
    let yaml = format!(
        "upstream: 127.0.0.1:1\nredis: {{url: \"{}\", key_prefix: \"{prefix}\", timeout: 2s}}\n",
        redis.url()
    );
    let config = Config::parse(&yaml).expect("test config is valid");
    RoomStore::new(&config.redis).expect("room")
}

/// `enter` as the proxy calls it with every admission switch off.
async fn enter(room: &RoomStore, request: EnterRequest<'_>) -> Result<EnterOutcome, StoreError> {
    Ok(room.enter(request, &RoomRules::OFF).await?.outcome)
}

/// Who enters, without the per-address limit (tested on its own below), under `poll`.
fn request<'a>(user: &'a str, capacity: u64, poll: PollClock<'a>) -> EnterRequest<'a> {
    EnterRequest {
        user,
        capacity,
        per_address: None,
        poll,
    }
}

/// The user's live token, which `why` says there must be.
async fn live_token(room: &RoomStore, user: &str, why: &str) -> String {
    room.current_token(user).await.unwrap().expect(why)
}

/// A room on `redis`, its key names, and a connection to inspect what the scripts wrote.
async fn open(redis: &RedisServer, prefix: &str) -> (RoomStore, Keys, MultiplexedConnection) {
    let room = open_room(redis, prefix);
    let keys = room.keys().clone();
    (room, keys, redis.conn().await)
}

/// What enter answers a waiting user.
fn waiting(position: u64, already: bool) -> EnterOutcome {
    EnterOutcome::Waiting { position, already }
}

/// `status` as the proxy calls it without abandonment.
async fn status(room: &RoomStore, user: &str, poll: PollClock<'_>) -> Result<StatusOutcome, StoreError> {
    Ok(room.status(user, poll, &RoomRules::OFF).await?.outcome)
}

async fn status_room(room: &RoomStore, user: &str) -> Result<StatusOutcome, StoreError> {
    status(room, user, PollClock::OFF).await
}

/// One admission tick at the fixed rate.
async fn admit(
    room: &RoomStore,
    interval: Duration,
    batch: u32,
    ttl: Duration,
) -> Result<AdmitOutcome, StoreError> {
    room.admit_within(&RoomRules::fixed(interval, batch, ttl), None, None).await
}

/// The room's numbers at the fixed rate: (users waiting, live tokens).
async fn counts(room: &RoomStore) -> (u64, u64) {
    let watch = room.watch(&RoomRules::OFF).await.expect("stats");
    (watch.waiting, watch.live_tokens)
}

fn user(i: usize) -> String {
    format!("user-{i:03}")
}

async fn enter_all(room: &RoomStore, users: &[String]) {
    for u in users {
        let outcome = enter_room(room, u, CAPACITY).await.expect("enter");
        assert!(
            matches!(outcome, EnterOutcome::Waiting { already: false, .. }),
            "{u}: {outcome:?}"
        );
    }
}

/// One Redis command on one argument (a key, mostly), as the tests inspect what the scripts wrote.
async fn query<T: FromRedisValue>(conn: &mut MultiplexedConnection, command: &str, arg: &str) -> T {
    let reply = redis::cmd(command).arg(arg).query_async(conn).await;
    reply.unwrap_or_else(|error| panic!("{command} {arg}: {error}"))
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    query(conn, "GET", key).await
}

/// A sorted set's members with their scores, lowest first.
async fn zrange_withscores(conn: &mut MultiplexedConnection, key: &str) -> Vec<(String, f64)> {
    let reply = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await;
    reply.expect("ZRANGE")
}

/// A sorted set's members, lowest score first.
async fn members(conn: &mut MultiplexedConnection, key: &str) -> Vec<String> {
    let scored = zrange_withscores(conn, key).await;
    scored.into_iter().map(|(member, _)| member).collect()
}

fn is_uuid_v4(token: &str) -> bool {
    let Ok(parsed) = uuid::Uuid::parse_str(token) else {
        return false;
    };
    // The canonical lowercase hyphenated form, version 4, RFC 4122 variant.
    token.len() == 36
        && parsed.hyphenated().to_string() == token
        && parsed.get_version_num() == 4
        && parsed.get_variant() == uuid::Variant::RFC4122
}

// ---- enter ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_numbers_arrivals_with_a_redis_counter_and_keeps_places() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "enter").await;

    // Names that sort differently from their arrival: only the counter may decide the order.
    let users = ["zoe", "adam", "mia", "bob"];
    for (i, u) in users.iter().enumerate() {
        let outcome = enter_room(&room, u, CAPACITY).await.unwrap();
        assert_eq!(outcome, waiting(i as u64 + 1, false), "{u}");
    }
    let line = zrange_withscores(&mut conn, &keys.queue).await;
    assert_eq!(
        line,
        vec![
            ("zoe".to_string(), 1.0),
            ("adam".to_string(), 2.0),
            ("mia".to_string(), 3.0),
            ("bob".to_string(), 4.0)
        ],
        "scores are the INCR counter, in arrival order"
    );
    assert_eq!(get(&mut conn, &keys.seq).await.as_deref(), Some("4"));

    // Entering again keeps the place (and the score), and draws no number.
    for (i, u) in users.iter().enumerate() {
        let outcome = enter_room(&room, u, CAPACITY).await.unwrap();
        assert_eq!(outcome, waiting(i as u64 + 1, true));
    }
    assert_eq!(
        zrange_withscores(&mut conn, &keys.queue).await,
        line,
        "no place moved"
    );
    assert_eq!(
        get(&mut conn, &keys.seq).await.as_deref(),
        Some("4"),
        "no number drawn"
    );

    // After the front leaves, numbering carries on from the counter, never reusing a number.
    let admitted = admit(&room, LONG, 1, TTL).await.unwrap();
    assert_eq!(admitted.admitted, 1);
    let late = enter_room(&room, "carl", CAPACITY).await.unwrap();
    assert_eq!(late, waiting(4, false));
    let line = zrange_withscores(&mut conn, &keys.queue).await;
    assert_eq!(line.last(), Some(&("carl".to_string(), 5.0)), "{line:?}");
    assert_eq!(line.len(), 4);

    // A counter far ahead (e.g. a long-lived room) still numbers the next arrival after it.
    let _: () = redis::cmd("SET")
        .arg(&keys.seq)
        .arg(1_000_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    enter_room(&room, "dora", CAPACITY).await.unwrap();
    let line = zrange_withscores(&mut conn, &keys.queue).await;
    assert_eq!(line.last(), Some(&("dora".to_string(), 1_000_001.0)));
    assert_eq!(
        status_room(&room, "dora").await.unwrap(),
        StatusOutcome::Waiting { position: 5 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_is_full_at_capacity_but_still_answers_those_already_waiting() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "full").await;

    for i in 0..3 {
        assert_eq!(
            enter_room(&room, &user(i), 3).await.unwrap(),
            waiting(i as u64 + 1, false)
        );
    }
    assert_eq!(
        enter_room(&room, "late", 3).await.unwrap(),
        EnterOutcome::Full
    );
    assert_eq!(
        enter_room(&room, "late", 3).await.unwrap(),
        EnterOutcome::Full
    );
    assert_eq!(
        members(&mut conn, &keys.queue).await.len(),
        3,
        "FULL inserts nobody"
    );
    assert_eq!(
        get(&mut conn, &keys.seq).await.as_deref(),
        Some("3"),
        "FULL draws no number"
    );
    assert_eq!(
        status_room(&room, "late").await.unwrap(),
        StatusOutcome::NotInQueue
    );

    // A waiting user at capacity keeps the place rather than being told FULL.
    assert_eq!(
        enter_room(&room, &user(2), 3).await.unwrap(),
        waiting(3, true)
    );

    // Once one leaves, one more fits, and only one.
    assert_eq!(admit(&room, LONG, 1, TTL).await.unwrap().admitted, 1);
    assert_eq!(
        enter_room(&room, "late", 3).await.unwrap(),
        waiting(3, false)
    );
    assert_eq!(
        enter_room(&room, "later", 3).await.unwrap(),
        EnterOutcome::Full
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enters_never_exceed_capacity_or_share_a_number() {
    let redis = RedisServer::start();
    let room = Arc::new(open_room(&redis, "burst"));
    let keys = room.keys().clone();
    let mut conn = redis.conn().await;

    let capacity = 50;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let room = room.clone();
            tokio::spawn(async move { enter_room(&room, &user(i), capacity).await.unwrap() })
        })
        .collect();
    let mut waiting = 0;
    let mut positions = HashSet::new();
    for t in tasks {
        match t.await.unwrap() {
            EnterOutcome::Waiting {
                position,
                already: false,
            } => {
                waiting += 1;
                assert!(
                    positions.insert(position),
                    "position {position} given twice"
                );
            }
            EnterOutcome::Full => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(waiting, capacity, "exactly capacity users got in");
    assert_eq!(positions, (1..=capacity).collect::<HashSet<_>>());
    let line = zrange_withscores(&mut conn, &keys.queue).await;
    let scores: HashSet<u64> = line.iter().map(|(_, s)| *s as u64).collect();
    assert_eq!(scores.len(), capacity as usize, "no shared number");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_answers_ready_while_a_token_is_live() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "ready").await;

    enter_room(&room, "alice", CAPACITY).await.unwrap();
    assert_eq!(admit(&room, LONG, 10, TTL).await.unwrap().admitted, 1);
    let token = get(&mut conn, &keys.token("alice"))
        .await
        .expect("token written");

    match enter_room(&room, "alice", CAPACITY).await.unwrap() {
        EnterOutcome::Ready {
            token: t,
            remaining_ms,
        } => {
            assert_eq!(t, token);
            assert!(
                remaining_ms > TTL.as_millis() as u64 - 2_000
                    && remaining_ms <= TTL.as_millis() as u64,
                "remaining {remaining_ms} ms"
            );
        }
        other => panic!("expected READY, got {other:?}"),
    }
    assert_eq!(
        members(&mut conn, &keys.queue).await.len(),
        0,
        "a READY user is not queued again"
    );
    assert_eq!(get(&mut conn, &keys.seq).await.as_deref(), Some("1"));
}

// ---- status -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_answers_waiting_ready_or_not_in_queue() {
    let redis = RedisServer::start();
    let room = open_room(&redis, "status");

    assert_eq!(
        status_room(&room, "ghost").await.unwrap(),
        StatusOutcome::NotInQueue
    );
    assert_eq!(room.current_token("ghost").await.unwrap(), None);

    let users: Vec<String> = (0..4).map(user).collect();
    enter_all(&room, &users).await;
    for (i, u) in users.iter().enumerate() {
        assert_eq!(
            status_room(&room, u).await.unwrap(),
            StatusOutcome::Waiting {
                position: i as u64 + 1
            }
        );
    }

    let ttl = Duration::from_secs(30);
    assert_eq!(admit(&room, LONG, 1, ttl).await.unwrap().admitted, 1);
    match status_room(&room, &users[0]).await.unwrap() {
        StatusOutcome::Ready {
            token,
            remaining_ms,
        } => {
            assert!(is_uuid_v4(&token), "{token}");
            assert_eq!(room.current_token(&users[0]).await.unwrap(), Some(token));
            assert!(
                remaining_ms > 28_000 && remaining_ms <= 30_000,
                "{remaining_ms}"
            );
        }
        other => panic!("expected READY, got {other:?}"),
    }
    for (i, u) in users.iter().enumerate().skip(1) {
        assert_eq!(
            status_room(&room, u).await.unwrap(),
            StatusOutcome::Waiting { position: i as u64 }
        );
    }
    assert_eq!(
        status_room(&room, "ghost").await.unwrap(),
        StatusOutcome::NotInQueue
    );
    // Asking never enqueues.
    assert_eq!(counts(&room).await.0, 3);
}

// ---- admit ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admit_pops_the_front_in_order_and_writes_one_fresh_token_each() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "admit").await;

    let users: Vec<String> = (0..12).map(user).collect();
    enter_all(&room, &users).await;

    let interval = Duration::from_secs(10);
    let first = admit(&room, interval, 5, TTL).await.unwrap();
    assert_eq!(first.admitted, 5);
    assert_eq!(first.passed, Some(5.0), "the last place popped: the fifth arrival's");
    assert!(first.was_due, "the first call of a fresh room is due");
    assert!(
        first.next_due <= interval && first.next_due > interval - Duration::from_secs(1),
        "next admission in {:?}",
        first.next_due
    );

    let mut tokens = HashSet::new();
    for u in &users[..5] {
        let key = keys.token(u);
        let token = get(&mut conn, &key)
            .await
            .unwrap_or_else(|| panic!("no token for {u}"));
        assert!(is_uuid_v4(&token), "{u}: {token:?} is not a UUID v4");
        assert!(tokens.insert(token.clone()), "token {token} issued twice");
        let left = query::<i64>(&mut conn, "PTTL", &key).await;
        assert!(left > 58_000 && left <= 60_000, "{u}: PTTL {left}");
        assert!(
            matches!(status_room(&room, u).await.unwrap(), StatusOutcome::Ready { token: t, .. } if t == token)
        );
    }
    for u in &users[5..] {
        assert_eq!(
            get(&mut conn, &keys.token(u)).await,
            None,
            "{u} got a token out of turn"
        );
    }
    let live: Vec<String> = members(&mut conn, &keys.tokens).await;
    assert_eq!(
        live.iter().collect::<HashSet<_>>(),
        users[..5].iter().collect::<HashSet<_>>()
    );
    let line: Vec<String> = members(&mut conn, &keys.queue).await;
    assert_eq!(line, users[5..].to_vec(), "the rest keep their order");

    // Within the interval: nothing, and how long to wait.
    let early = admit(&room, interval, 5, TTL).await.unwrap();
    assert_eq!((early.admitted, early.passed), (0, None));
    assert!(!early.was_due);
    assert!(
        early.next_due <= first.next_due && early.next_due > interval - Duration::from_secs(2),
        "{early:?}"
    );
    assert_eq!(counts(&room).await, (7, 5));

    // The next due tick takes the next five in order, then the last two: never more than asked.
    let short = Duration::from_millis(1);
    query::<()>(&mut conn, "DEL", &keys.next_admission).await;
    assert_eq!(admit(&room, short, 5, TTL).await.unwrap().admitted, 5);
    let line: Vec<String> = members(&mut conn, &keys.queue).await;
    assert_eq!(line, users[10..].to_vec());
    query::<()>(&mut conn, "DEL", &keys.next_admission).await;
    let last = admit(&room, short, 5, TTL).await.unwrap();
    assert_eq!((last.admitted, last.passed), (2, Some(12.0)));
    assert!(last.was_due);
    for u in &users {
        let token = get(&mut conn, &keys.token(u))
            .await
            .expect("everyone admitted");
        tokens.insert(token);
    }
    assert_eq!(tokens.len(), 12, "all tokens distinct");

    // An empty line: a due tick admits nobody.
    query::<()>(&mut conn, "DEL", &keys.next_admission).await;
    let idle = admit(&room, short, 5, TTL).await.unwrap();
    assert_eq!((idle.admitted, idle.was_due, idle.passed), (0, true, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_admit_calls_admit_exactly_one_batch_per_interval() {
    let redis = RedisServer::start();
    // Ten proxies: ten rooms on one prefix, each with its own connection.
    let rooms: Vec<Arc<RoomStore>> = std::iter::repeat_with(|| Arc::new(open_room(&redis, "many")))
        .take(10)
        .collect();
    let users: Vec<String> = (0..400).map(user).collect();
    enter_all(&rooms[0], &users).await;
    let batch = 5;

    // Round 1 and 2: ten simultaneous calls (released together) for one due interval.
    let interval = Duration::from_millis(300);
    for round in 0..2 {
        let barrier = Arc::new(tokio::sync::Barrier::new(rooms.len()));
        let tasks: Vec<_> = rooms
            .iter()
            .map(|r| {
                let (r, barrier) = (r.clone(), barrier.clone());
                tokio::spawn(async move {
                    counts(&r).await; // connect before the race starts
                    barrier.wait().await;
                    admit(&r, interval, batch, TTL).await.unwrap()
                })
            })
            .collect();
        let mut outcomes: Vec<AdmitOutcome> = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap());
        }
        let due: Vec<_> = outcomes.iter().filter(|o| o.was_due).collect();
        assert_eq!(
            due.len(),
            1,
            "round {round}: exactly one due call: {outcomes:?}"
        );
        let total: u64 = outcomes.iter().map(|o| o.admitted).sum();
        assert_eq!(
            total, batch as u64,
            "round {round}: one batch in total: {outcomes:?}"
        );
        // Everybody else is told to wait for the same next interval.
        let wait = outcomes.iter().map(|o| o.next_due).max().unwrap();
        assert!(wait <= interval, "{outcomes:?}");
        tokio::time::sleep(wait + Duration::from_millis(5)).await;
    }

    // Hammering: ten tasks calling in a tight loop for ~1 s at 100 ms intervals, from a fresh
    // schedule so that the first call is due at once.
    let keys = rooms[0].keys().clone();
    let mut conn = redis.conn().await;
    query::<()>(&mut conn, "DEL", &keys.next_admission).await;
    let interval = Duration::from_millis(100);
    let started = Instant::now();
    let run_for = Duration::from_millis(1000);
    let tasks: Vec<_> = rooms
        .iter()
        .map(|r| {
            let r = r.clone();
            tokio::spawn(async move {
                let (mut due, mut admitted) = (0u64, 0u64);
                while started.elapsed() < run_for {
                    let o = admit(&r, interval, batch, TTL).await.unwrap();
                    due += o.was_due as u64;
                    admitted += o.admitted;
                }
                (due, admitted)
            })
        })
        .collect();
    let (mut due, mut admitted) = (0, 0);
    for t in tasks {
        let (d, a) = t.await.unwrap();
        due += d;
        admitted += a;
    }
    let elapsed = started.elapsed();
    let max_due = (elapsed.as_millis() / interval.as_millis()) as u64 + 1;
    println!(
        "hammering for {elapsed:?}: {due} due calls, {admitted} admitted (at most {max_due} due)"
    );
    assert!(
        due <= max_due,
        "{due} due calls in {elapsed:?}, at most {max_due} expected"
    );
    assert!(
        due >= 5,
        "admission stalled under contention: {due} due calls in {elapsed:?}"
    );
    assert_eq!(
        admitted,
        due * batch as u64,
        "each due call admits one full batch, no more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admit_skips_missed_intervals_instead_of_catching_up() {
    let redis = RedisServer::start();
    let room = open_room(&redis, "missed");
    let users: Vec<String> = (0..40).map(user).collect();
    enter_all(&room, &users).await;
    let interval = Duration::from_millis(100);
    let batch = 2;

    assert_eq!(
        admit(&room, interval, batch, TTL).await.unwrap().admitted,
        2
    );
    // Three whole intervals pass with no tick (no proxy ran).
    tokio::time::sleep(interval * 3 + Duration::from_millis(50)).await;
    let resumed = admit(&room, interval, batch, TTL).await.unwrap();
    assert_eq!(
        resumed.admitted, 2,
        "one batch, not a catch-up of three: {resumed:?}"
    );
    assert!(resumed.was_due);
    assert!(
        resumed.next_due > interval / 2 && resumed.next_due <= interval,
        "the schedule restarts from now: {resumed:?}"
    );
    let again = admit(&room, interval, batch, TTL).await.unwrap();
    assert_eq!((again.admitted, again.was_due), (0, false), "{again:?}");

    // From then on, at most one batch per interval however often it is called.
    let started = Instant::now();
    let mut admitted = 0;
    while started.elapsed() < interval * 3 {
        admitted += admit(&room, interval, batch, TTL).await.unwrap().admitted;
    }
    assert!(
        (4..=8).contains(&admitted),
        "{admitted} admitted in three intervals after resuming (expected 3-4 batches of {batch})"
    );
    assert_eq!(counts(&room).await.0, 40 - 4 - admitted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_interval_is_not_held_back_by_a_schedule_made_with_a_longer_one() {
    let redis = RedisServer::start();
    let room = open_room(&redis, "faster");
    enter_all(&room, &(0..4).map(user).collect::<Vec<_>>()).await;

    // The room ran at one batch per hour (its last tick set the next one an hour ahead); then a
    // proxy restarts, or reloads, with 100 ms.
    assert_eq!(admit(&room, LONG, 1, TTL).await.unwrap().admitted, 1);
    let interval = Duration::from_millis(100);
    let first = admit(&room, interval, 1, TTL).await.unwrap();
    assert!(
        first.next_due <= interval,
        "told to wait {:?} with a 100 ms interval: the old schedule holds the room back",
        first.next_due
    );
    tokio::time::sleep(first.next_due).await;
    let next = admit(&room, interval, 1, TTL).await.unwrap();
    assert_eq!(next.admitted, 1, "{next:?}");
}

// ---- claim and consume ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_holds_the_current_token_for_one_request() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "claim").await;
    enter_all(&room, &["alice".to_string()]).await;
    assert_eq!(admit(&room, LONG, 1, TTL).await.unwrap().admitted, 1);
    let token = live_token(&room, "alice", "alice's token").await;
    let hold = Duration::from_secs(30);

    assert_eq!(room.claim("alice", "forged", "r0", hold).await.unwrap(), Claim::Invalid);
    assert_eq!(room.claim("bob", &token, "r0", hold).await.unwrap(), Claim::Invalid, "another user's");
    assert_eq!(get(&mut conn, &keys.claim("alice")).await, None, "a refused claim writes nothing");
    assert_eq!(room.claim("alice", &token, "r1", hold).await.unwrap(), Claim::Claimed);
    assert_eq!(room.claim("alice", &token, "r2", hold).await.unwrap(), Claim::InUse);
    let held = query::<i64>(&mut conn, "PTTL", &keys.claim("alice")).await;
    assert!((29_000..=30_000).contains(&held), "held for claim_timeout: {held}");

    // Released by another request's id: nothing happens; by its own: free again.
    assert!(!room.consume("alice", &token, "r2", false).await.unwrap());
    assert_eq!(room.claim("alice", &token, "r3", hold).await.unwrap(), Claim::InUse);
    assert!(!room.consume("alice", &token, "r1", false).await.unwrap(), "released, not spent");
    assert_eq!(live_token(&room, "alice", "kept").await, token);
    assert_eq!(room.claim("alice", &token, "r4", Duration::from_secs(600)).await.unwrap(), Claim::Claimed);
    let held = query::<i64>(&mut conn, "PTTL", &keys.claim("alice")).await;
    assert!(held <= TTL.as_millis() as i64, "never past the token's own expiry: {held}");

    // Spent with its claim: both gone.
    assert!(room.consume("alice", &token, "r4", true).await.unwrap());
    assert_eq!(get(&mut conn, &keys.claim("alice")).await, None);
    assert_eq!(room.claim("alice", &token, "r5", hold).await.unwrap(), Claim::Invalid);
}

/// A claim in flight is renewed only while it is still its request's, and never past its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeping_claims_renews_only_a_requests_own_claim() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "keep").await;
    let users = ["alice".to_string(), "bob".to_string(), "carol".to_string()];
    enter_all(&room, &users).await;
    assert_eq!(admit(&room, LONG, 3, TTL).await.unwrap().admitted, 3);
    let alice = live_token(&room, "alice", "alice's token").await;
    let bob = live_token(&room, "bob", "bob's token").await;
    let short = Duration::from_millis(500);
    assert_eq!(room.claim("alice", &alice, "a1", short).await.unwrap(), Claim::Claimed);
    assert_eq!(room.claim("bob", &bob, "b1", short).await.unwrap(), Claim::Claimed);

    // alice's by its own id, bob's by another request's id, carol's that does not exist.
    let kept = room
        .keep_claims(&[("alice", "a1"), ("bob", "b0"), ("carol", "c1")], Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(kept, 1);
    let held = query::<i64>(&mut conn, "PTTL", &keys.claim("alice")).await;
    assert!((29_000..=30_000).contains(&held), "renewed for claim_timeout: {held}");
    let held = query::<i64>(&mut conn, "PTTL", &keys.claim("bob")).await;
    assert!(held <= 500, "another request's claim is not renewed: {held}");
    assert_eq!(get(&mut conn, &keys.claim("carol")).await, None, "no claim is made by renewing");

    // Never past the token's own expiry.
    room.keep_claims(&[("alice", "a1")], Duration::from_secs(3_600)).await.unwrap();
    let held = query::<i64>(&mut conn, "PTTL", &keys.claim("alice")).await;
    assert!(held <= TTL.as_millis() as i64, "never past the token's own expiry: {held}");

    // A settled claim stays settled.
    assert!(room.consume("alice", &alice, "a1", true).await.unwrap());
    assert_eq!(room.keep_claims(&[("alice", "a1")], Duration::from_secs(30)).await.unwrap(), 0);
    assert_eq!(get(&mut conn, &keys.claim("alice")).await, None);
}

// ---- consume ----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_deletes_only_the_token_that_was_used() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "consume").await;

    enter_all(&room, &["alice".to_string(), "bob".to_string()]).await;
    assert_eq!(admit(&room, LONG, 2, TTL).await.unwrap().admitted, 2);
    let alice = live_token(&room, "alice", "alice's token").await;
    let bob = live_token(&room, "bob", "bob's token").await;
    assert_eq!(counts(&room).await.1, 2);

    // Another value (bob's, or a made-up one): nothing happens.
    assert!(!room.consume("alice", &bob, "c", true).await.unwrap());
    assert!(!room
        .consume("alice", &uuid::Uuid::new_v4().to_string(), "c", true)
        .await
        .unwrap());
    assert!(!room.consume("alice", "", "c", true).await.unwrap());
    assert_eq!(
        get(&mut conn, &keys.token("alice")).await,
        Some(alice.clone()),
        "key stays"
    );
    assert!(
        query::<i64>(&mut conn, "PTTL", &keys.token("alice")).await > 50_000,
        "TTL untouched"
    );
    assert_eq!(counts(&room).await.1, 2);

    // The right value: deleted, and out of the live-token set; bob untouched.
    assert!(room.consume("alice", &alice, "c", true).await.unwrap());
    assert_eq!(get(&mut conn, &keys.token("alice")).await, None);
    let live: Vec<String> = members(&mut conn, &keys.tokens).await;
    assert_eq!(live, vec!["bob".to_string()]);
    assert_eq!(counts(&room).await.1, 1);
    assert_eq!(
        status_room(&room, "alice").await.unwrap(),
        StatusOutcome::NotInQueue
    );
    assert_eq!(room.current_token("bob").await.unwrap(), Some(bob.clone()));
    // Spending twice: the second finds nothing.
    assert!(!room.consume("alice", &alice, "c", true).await.unwrap());

    // Alice enters again and is admitted again: her old token can never delete the new one.
    assert_eq!(
        enter_room(&room, "alice", CAPACITY).await.unwrap(),
        waiting(1, false)
    );
    query::<()>(&mut conn, "DEL", &keys.next_admission).await;
    assert_eq!(admit(&room, LONG, 2, TTL).await.unwrap().admitted, 1);
    let newer = live_token(&room, "alice", "a new token").await;
    assert_ne!(newer, alice, "a fresh token on each admission");
    assert!(
        !room.consume("alice", &alice, "c", true).await.unwrap(),
        "the old token deletes nothing"
    );
    assert_eq!(
        room.current_token("alice").await.unwrap(),
        Some(newer.clone())
    );
    assert_eq!(counts(&room).await.1, 2);
    assert!(room.consume("alice", &newer, "c", true).await.unwrap());
}

// ---- adapt and adapt_commit ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapt_claims_one_step_per_period_and_stores_only_the_latest_result() {
    let redis = RedisServer::start();
    let room = open_room(&redis, "adapt");

    // A fresh room's first call claims the step, with the reports sent so far and no state.
    let report = |buckets: &[(usize, u64)], judged, over_target| Latencies {
        buckets: buckets.to_vec(),
        judged,
        over_target,
    };
    let first = room.adapt(&report(&[(3, 2), (7, 1)], 3, 1)).await.unwrap();
    let step = first
        .step
        .expect("the first call of a fresh room claims the step");
    assert_eq!(step.state, None);
    let mut latencies = step.latencies.clone();
    latencies.buckets.sort();
    assert_eq!(latencies, report(&[(3, 2), (7, 1)], 3, 1));
    assert!(first.next_due <= ADAPT_PERIOD, "{:?}", first.next_due);

    // Within the period: reported, not claimed.
    let early = room.adapt(&report(&[(5, 4)], 4, 2)).await.unwrap();
    assert!(early.step.is_none(), "{early:?}");
    assert!(early.next_due <= first.next_due, "{early:?}");

    let state = ControlState {
        batch: 4,
        settle: 1,
        served_at_cut: Some(9),
        probe_wait: 2,
    };
    assert!(!room.adapt_commit("another-step", state).await.unwrap());
    assert!(room.adapt_commit(&step.id, state).await.unwrap());
    let adaptive = RoomRules {
        min_batch: Some(1),
        ..RoomRules::fixed(LONG, 10, TTL)
    };
    let watch = room.watch(&adaptive).await.unwrap();
    assert_eq!(watch.stored_batch, Some(4));
    assert_eq!(
        room.watch(&RoomRules::OFF).await.unwrap().stored_batch,
        None,
        "read only when the rules adapt"
    );

    // The next step carries the report made in between, counts against the target included,
    // and nothing twice.
    tokio::time::sleep(early.next_due + Duration::from_millis(20)).await;
    let next = room.adapt(&Latencies::default()).await.unwrap().step.expect("due again");
    assert_eq!(next.latencies, report(&[(5, 4)], 4, 2));
    assert_eq!(next.state, Some(state));
}

// ---- stats ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_counts_waiting_and_live_tokens_and_forgets_expired_ones() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "stats").await;

    assert_eq!(counts(&room).await, (0, 0));
    let users: Vec<String> = (0..6).map(user).collect();
    enter_all(&room, &users).await;
    assert_eq!(counts(&room).await, (6, 0));

    // Two short-lived tokens, then (next interval) one long-lived one.
    let short_ttl = Duration::from_millis(400);
    let interval = Duration::from_millis(50);
    assert_eq!(
        admit(&room, interval, 2, short_ttl).await.unwrap().admitted,
        2
    );
    assert_eq!(counts(&room).await, (4, 2));
    query::<()>(&mut conn, "DEL", &keys.next_admission).await;
    assert_eq!(admit(&room, interval, 1, TTL).await.unwrap().admitted, 1);
    assert_eq!(counts(&room).await, (3, 3));

    // Redis expires the short tokens' keys; stats then drops them from the count (and the set).
    let expired = wait_until(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async {
            let mut c = redis.conn().await;
            get(&mut c, &keys.token(&users[0])).await.is_none()
                && get(&mut c, &keys.token(&users[1])).await.is_none()
        },
    )
    .await;
    assert!(expired, "short tokens never expired");
    let counted = wait_until(
        Duration::from_secs(2),
        Duration::from_millis(20),
        || async { counts(&room).await == (3, 1) },
    )
    .await;
    assert!(
        counted,
        "stats still counts expired tokens: {:?}",
        counts(&room).await
    );
    let live: Vec<String> = members(&mut conn, &keys.tokens).await;
    assert_eq!(live, vec![users[2].clone()], "expired entries left the set");
    assert_eq!(
        status_room(&room, &users[0]).await.unwrap(),
        StatusOutcome::NotInQueue
    );
}

// ---- the poll clock and the per-address limit inside enter and status --------------------------

/// Enforced polling: positions from 1 on poll after 1 s, and 80 % of it (grace 20 %) is on time.
const POLL_ON: PollClock<'static> = PollClock {
    on_time_factor: Some(0.8),
    thresholds: &[(1, Duration::from_secs(1))],
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforced_polling_refuses_early_status_calls_without_restarting_the_clock() {
    let redis = RedisServer::start();
    let (room, keys, mut conn) = open(&redis, "poll").await;

    let entered = Instant::now();
    assert_eq!(
        enter(&room, request("pat", CAPACITY, POLL_ON))
            .await
            .unwrap(),
        waiting(1, false)
    );
    let clock = get(&mut conn, &keys.poll_clock("pat"))
        .await
        .expect("the clock started");
    assert_eq!(
        status(&room, "pat", POLL_ON).await.unwrap(),
        StatusOutcome::TooEarly { retry_secs: 1 }
    );
    assert_eq!(
        get(&mut conn, &keys.poll_clock("pat")).await,
        Some(clock.clone()),
        "a refused call restarted the clock"
    );
    // Without enforcement the same call is answered.
    assert_eq!(
        status_room(&room, "pat").await.unwrap(),
        StatusOutcome::Waiting { position: 1 }
    );

    // Refused calls until 800 ms have passed; then answered, and the clock starts again.
    let on_time = wait_until(
        Duration::from_secs(3),
        Duration::from_millis(20),
        || async {
            !matches!(
                status(&room, "pat", POLL_ON).await.unwrap(),
                StatusOutcome::TooEarly { .. }
            )
        },
    )
    .await;
    let waited = entered.elapsed();
    assert!(on_time, "never on time");
    assert!(
        waited >= Duration::from_millis(780) && waited < Duration::from_millis(1500),
        "on time after {waited:?}, expected 800 ms"
    );
    let restarted = get(&mut conn, &keys.poll_clock("pat"))
        .await
        .expect("clock restarted");
    assert!(restarted.parse::<u64>().unwrap() > clock.parse::<u64>().unwrap());
    assert_eq!(
        status(&room, "pat", POLL_ON).await.unwrap(),
        StatusOutcome::TooEarly { retry_secs: 1 }
    );

    // Admitted: the user's clock still runs (the last answer said poll in 1 s) ...
    assert_eq!(admit(&room, LONG, 1, TTL).await.unwrap().admitted, 1);
    assert!(matches!(
        status(&room, "pat", POLL_ON).await.unwrap(),
        StatusOutcome::TooEarly { .. }
    ));
    // ... a READY answer (null pollAfter) stops it: no refusal after that.
    assert!(matches!(
        status_room(&room, "pat").await.unwrap(),
        StatusOutcome::Ready { .. }
    ));
    assert!(matches!(
        enter(&room, request("pat", CAPACITY, POLL_ON))
            .await
            .unwrap(),
        EnterOutcome::Ready { .. }
    ));
    assert_eq!(
        get(&mut conn, &keys.poll_clock("pat")).await,
        None,
        "READY stops the clock"
    );
    assert!(matches!(
        status(&room, "pat", POLL_ON).await.unwrap(),
        StatusOutcome::Ready { .. }
    ));
    // NOT_IN_QUEUE enforces nothing either.
    for _ in 0..3 {
        assert_eq!(
            status(&room, "nobody", POLL_ON).await.unwrap(),
            StatusOutcome::NotInQueue
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_limits_new_identities_per_address_and_window() {
    let redis = RedisServer::start();
    let room = open_room(&redis, "abuse");
    // Counts are per clock minute: keep the test inside one.
    let (secs, _): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    if secs % 60 >= 58 {
        tokio::time::sleep(Duration::from_secs(60 - secs % 60)).await;
    }
    let from = |user: &'static str, address: &'static str| EnterRequest {
        user,
        capacity: CAPACITY,
        per_address: Some((address, 2)),
        poll: PollClock::OFF,
    };
    assert!(matches!(
        enter(&room, from("a", "192.0.2.1")).await.unwrap(),
        EnterOutcome::Waiting { .. }
    ));
    assert!(matches!(
        enter(&room, from("b", "192.0.2.1")).await.unwrap(),
        EnterOutcome::Waiting { .. }
    ));
    match enter(&room, from("c", "192.0.2.1")).await.unwrap() {
        EnterOutcome::Limited { retry_secs } => {
            assert!((1..=60).contains(&retry_secs), "{retry_secs}")
        }
        other => panic!("expected LIMITED, got {other:?}"),
    }
    assert_eq!(
        status_room(&room, "c").await.unwrap(),
        StatusOutcome::NotInQueue,
        "not queued"
    );
    // Identities already counted still enter; other addresses have their own count.
    assert_eq!(
        enter(&room, from("b", "192.0.2.1")).await.unwrap(),
        waiting(2, true)
    );
    assert_eq!(admit(&room, LONG, 1, TTL).await.unwrap().admitted, 1);
    let token = room.current_token("a").await.unwrap().unwrap();
    assert!(room.consume("a", &token, "c", true).await.unwrap());
    assert_eq!(
        enter(&room, from("a", "192.0.2.1")).await.unwrap(),
        waiting(2, false),
        "a counted identity may enter again"
    );
    assert!(matches!(
        enter(&room, from("c", "192.0.2.2")).await.unwrap(),
        EnterOutcome::Waiting { .. }
    ));
}

// ---- the room's keys and the script cache -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_touched_carries_the_room_hash_tag() {
    let redis = RedisServer::start();
    let room = open_room(&redis, "shop-eu");
    let mut conn = redis.conn().await;

    let users: Vec<String> = (0..5).map(user).collect();
    enter_all(&room, &users).await;
    // The optional parts of enter and status too: the poll clock and the per-address counter.
    let limited = EnterRequest {
        user: "from-address",
        capacity: CAPACITY,
        per_address: Some(("198.51.100.7", 5)),
        poll: POLL_ON,
    };
    enter(&room, limited).await.unwrap();
    status(&room, "from-address", POLL_ON).await.unwrap();
    status_room(&room, &users[4]).await.unwrap();
    status_room(&room, "nobody").await.unwrap();
    admit(&room, Duration::from_millis(10), 3, TTL)
        .await
        .unwrap();
    enter_room(&room, &users[0], CAPACITY).await.unwrap();
    let token = live_token(&room, &users[0], "admitted").await;
    room.consume(&users[1], "not-it", "c", true).await.unwrap();
    assert!(room.consume(&users[0], &token, "c", true).await.unwrap());
    counts(&room).await;
    assert_eq!(
        enter_room(&room, "capped", 1).await.unwrap(),
        EnterOutcome::Full
    );

    let all: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!all.is_empty());
    for key in &all {
        assert!(
            key.starts_with("{shop-eu}"),
            "key {key:?} outside the room's hash tag"
        );
    }
    let keys = Keys::new("shop-eu");
    for k in [
        &keys.queue,
        &keys.seq,
        &keys.next_admission,
        &keys.tokens,
        &keys.token_prefix,
        &keys.poll_prefix,
        &keys.abuse_prefix,
    ] {
        assert!(k.starts_with("{shop-eu}"), "{k}");
    }
    // Two rooms on one Redis never touch each other's keys.
    let other = open_room(&redis, "shop-us");
    enter_room(&other, "x", CAPACITY).await.unwrap();
    assert_eq!(counts(&room).await.0, 3);
    assert_eq!(counts(&other).await.0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_the_script_cache_is_flushed() {
    let redis = RedisServer::start();
    let room = open_room(&redis, "flush");
    let mut conn = redis.conn().await;

    enter_room(&room, "a", CAPACITY).await.unwrap();
    admit(&room, LONG, 1, TTL).await.unwrap();
    counts(&room).await;
    // A Redis restart or failover empties the script cache: NOSCRIPT must lead to a reload.
    query::<()>(&mut conn, "SCRIPT", "FLUSH").await;
    assert!(matches!(
        enter_room(&room, "b", CAPACITY).await.unwrap(),
        EnterOutcome::Waiting { position: 1, .. }
    ));
    query::<()>(&mut conn, "SCRIPT", "FLUSH").await;
    assert_eq!(
        status_room(&room, "b").await.unwrap(),
        StatusOutcome::Waiting { position: 1 }
    );
    query::<()>(&mut conn, "SCRIPT", "FLUSH").await;
    assert_eq!(counts(&room).await, (1, 1));
    let token = room.current_token("a").await.unwrap().unwrap();
    query::<()>(&mut conn, "SCRIPT", "FLUSH").await;
    assert!(room.consume("a", &token, "c", true).await.unwrap());
    query::<()>(&mut conn, "SCRIPT", "FLUSH").await;
    let _: () = redis::cmd("DEL")
        .arg(&room.keys().next_admission)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(admit(&room, LONG, 1, TTL).await.unwrap().admitted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_is_an_error_within_the_timeout() {
    let mut redis = RedisServer::start();
    let yaml = format!(
        "upstream: 127.0.0.1:1\nredis: {{url: \"{}\", key_prefix: \"down\", timeout: 300ms}}\n",
        redis.url()
    );
    let room = RoomStore::new(&Config::parse(&yaml).unwrap().redis).unwrap();
    counts(&room).await;

    // Hanging (frozen) and gone (stopped): each call fails, and within the bound.
    redis.freeze();
    let started = Instant::now();
    assert!(enter_room(&room, "a", CAPACITY).await.is_err());
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    redis.stop();
    let started = Instant::now();
    assert!(status_room(&room, "a").await.is_err());
    assert!(admit(&room, LONG, 1, TTL).await.is_err());
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
}

/// The batch clamp is written twice: in `lua/admission.lua`, where admit and enter apply it in
/// the same call as the admission, and in `Policy::batch_in_force`, for the gauges, the pace and
/// the admin view, which read the stored batch through other scripts. The two must agree.
#[tokio::test]
async fn the_policy_clamps_a_stored_batch_as_the_scripts_do() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let library = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/admission.lua")).unwrap();
    let clamp = redis::Script::new(&format!(
        "{library}\nreturn batch_in_force(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))"
    ));
    let adaptive = Keys::new(&unique_prefix()).adaptive;
    for admission in [
        "batch_size: 8",
        "batch_size: 8, adaptive: {min_batch: 2}",
        "batch_size: 3, adaptive: {min_batch: 3}",
        "batch_size: 1, adaptive: {min_batch: 1}",
    ] {
        let config = Config::parse(&format!("upstream: 127.0.0.1:1\nadmission: {{{admission}}}")).unwrap();
        let policy = waitroom::policy::Policy::compile(&config);
        for stored in [None, Some(0), Some(1), Some(2), Some(5), Some(20)] {
            let _: () = match stored {
                Some(batch) => redis::cmd("HSET").arg(&adaptive).arg("batch").arg(batch).query_async(&mut conn).await,
                None => redis::cmd("DEL").arg(&adaptive).query_async(&mut conn).await,
            }
            .unwrap();
            let in_lua: u32 = clamp
                .key(&adaptive)
                .arg(policy.rules.batch_size)
                .arg(policy.rules.min_batch.unwrap_or(0))
                .invoke_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(policy.batch_in_force(stored), in_lua, "{admission}, stored {stored:?}");
        }
    }
}
