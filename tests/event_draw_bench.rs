//! A measurement, not a check (ignored by default): what a scheduled event's draw costs Redis with
//! 10,000 and 100,000 pre-queued users. Numbers in BENCHMARKS.md ("The draw of a scheduled
//! event"). Redis's own clock times each step (SLOWLOG records every command's execution time,
//! excluding network and client), so a debug build of this test measures what a release proxy
//! would cause.
//!
//! ```sh
//! cargo test --test event_draw_bench -- --ignored --nocapture
//! DRAW_USERS=20000 cargo test --test event_draw_bench -- --ignored --nocapture
//! ```

mod common;

use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use common::*;
use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use waitroom::config::Config;
use waitroom::config::EventConfig;
use waitroom::room::event::Seed;
use waitroom::store::{Entering, EventEnter, EventTimes, RoomRules, DRAW_PAGE};

fn event_at(now_ms: i64, opens_in_ms: i64) -> EventConfig {
    let opens = DateTime::<Utc>::from_timestamp_millis(now_ms + opens_in_ms)
        .unwrap()
        .to_rfc3339_opts(SecondsFormat::Millis, true);
    let yaml = format!("upstream: 127.0.0.1:1\nevent: {{opens_at: \"{opens}\", prequeue: 2h}}\n");
    Config::parse(&yaml).unwrap().event.unwrap()
}

/// Execution times (µs) of the commands Redis logged since the last reset, by command name.
async fn slowest(conn: &mut MultiplexedConnection) -> Vec<(String, u64)> {
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query_async(conn).await.unwrap();
    let mut out = Vec::new();
    for entry in log {
        let redis::Value::Array(fields) = entry else { continue };
        let micros = match &fields[2] {
            redis::Value::Int(n) => *n as u64,
            _ => 0,
        };
        let name = match &fields[3] {
            redis::Value::Array(args) => match args.first() {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).to_uppercase(),
                _ => "?".into(),
            },
            _ => "?".into(),
        };
        out.push((name, micros));
    }
    out
}

async fn slowlog(conn: &mut MultiplexedConnection, slower_than_us: u64) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(slower_than_us)
        .arg("slowlog-max-len")
        .arg(100_000)
        .query_async(conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query_async(conn).await.unwrap();
}

fn longest(log: &[(String, u64)], command: &str) -> (usize, u64) {
    let times: Vec<u64> = log.iter().filter(|(c, _)| c == command).map(|(_, t)| *t).collect();
    (times.len(), times.iter().copied().max().unwrap_or(0))
}

/// The median, 99th percentile and 5 longest times of `command`.
fn spread(log: &[(String, u64)], command: &str) -> String {
    let mut times: Vec<u64> = log.iter().filter(|(c, _)| c == command).map(|(_, t)| *t).collect();
    times.sort_unstable();
    if times.is_empty() {
        return "none".into();
    }
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    let top: Vec<u64> = times.iter().rev().take(5).copied().collect();
    format!("p50 {} µs, longest {:?} µs", at(0.5), top)
}

async fn measure(users: usize) {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;
    let prefix = unique_prefix();
    let room = std::sync::Arc::new(library_room(&redis, &prefix));
    let now = redis_now_ms(&mut conn).await;
    let event = event_at(now, 3_600_000);
    let seed = Seed::fresh();
    room.event_tick(EventTimes::of(&event), seed.sent()).await.unwrap();

    // The pre-queue fills: every enter is one script call; 200 in flight on one connection. Only
    // enters over 100 µs are logged (all of them would be too long a log to read back).
    slowlog(&mut conn, 100).await;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await.unwrap();
    let started = Instant::now();
    let entered = futures::stream::iter(0..users)
        .map(|i| {
            let (room, event, seed) = (room.clone(), event.clone(), seed.clone());
            async move {
                let user = format!("user-{i:06}");
                let entering = Entering { user: &user, capacity: 10_000_000, per_address: None };
                room.event_enter(EventTimes::of(&event), &entering, seed.sent(), &seed.draw_key(&user)).await
            }
        })
        .buffer_unordered(200)
        .filter(|r| std::future::ready(matches!(r, Ok(EventEnter::Prequeued { already: false, .. }))))
        .count()
        .await;
    let filled = started.elapsed();
    assert_eq!(entered, users);
    let over = slowest(&mut conn).await;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.unwrap();
    let mean = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("usec_per_call=").nth(1))
        .and_then(|v| v.split(',').next())
        .unwrap_or("?")
        .to_owned();
    let enters = format!("mean {mean} µs, {} over 100 µs: {}", over.len(), spread(&over, "EVALSHA"));

    // The draw: the opening passes; one tick records it, the first admission pops the front.
    let opened = event_at(redis_now_ms(&mut conn).await, 0);
    slowlog(&mut conn, 0).await;
    let started = Instant::now();
    let tick = room.event_tick(EventTimes::of(&opened), Seed::fresh().sent()).await.unwrap();
    let draw_call = started.elapsed();
    assert!(tick.did_draw && tick.drawn == Some(users as u64));
    let (_, draw_us) = longest(&slowest(&mut conn).await, "EVALSHA");
    slowlog(&mut conn, 0).await;
    let rules = RoomRules::fixed(Duration::from_millis(100), 10, Duration::from_secs(300));
    let admitted = room.admit_within(&rules, Some(opened.opens_ms()), None).await.unwrap();
    assert_eq!(admitted.admitted, 10);
    let (_, admit_us) = longest(&slowest(&mut conn).await, "EVALSHA");

    // Publishing the list: pages of DRAW_PAGE, against one ZRANGE of everything.
    slowlog(&mut conn, 0).await;
    let started = Instant::now();
    let mut read = 0;
    let mut start = 0;
    while start < users as u64 {
        read += room.draw_page(start).await.unwrap().len();
        start += DRAW_PAGE;
    }
    let pages_time = started.elapsed();
    assert_eq!(read, users);
    let page_log = slowest(&mut conn).await;
    let (pages, _) = longest(&page_log, "ZRANGE");
    let page_times = spread(&page_log, "ZRANGE");
    slowlog(&mut conn, 0).await;
    let whole: Vec<String> = redis::cmd("ZRANGE")
        .arg(Keys::new(&prefix).event_draw)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(whole.len(), users);
    let (_, whole_us) = longest(&slowest(&mut conn).await, "ZRANGE");

    println!(
        "{users} pre-queued users:\n\
         \x20 filling the pre-queue: {:.2} s ({:.0} enters/s from one client), each enter {enters}\n\
         \x20 the draw (one tick script at the opening): {draw_us} µs in Redis, {:.2} ms round trip\n\
         \x20 the first admission after it: {admit_us} µs in Redis\n\
         \x20 the draw list in {pages} pages of {DRAW_PAGE}: each page {page_times}, all {:.0} ms\n\
         \x20 (one ZRANGE of the whole list instead: {whole_us} µs)",
        filled.as_secs_f64(),
        users as f64 / filled.as_secs_f64(),
        draw_call.as_secs_f64() * 1000.0,
        pages_time.as_secs_f64() * 1000.0,
    );
}

#[tokio::test]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn the_draw_at_10k_and_100k_prequeued_users() {
    match std::env::var("DRAW_USERS").ok().and_then(|n| n.parse().ok()) {
        Some(n) => measure(n).await,
        None => {
            measure(10_000).await;
            measure(100_000).await;
        }
    }
}
