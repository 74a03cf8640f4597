//! `crowd`: N simulated users arriving within a second, against a room or straight at the
//! backend, and what each of them lived through.
//!
//! The users are the demo crowd's (`waitroom_tools::crowd`). Room mode: each user enters, polls
//! status exactly when `pollAfter` says (plus up to 10 % jitter), orders through the proxy as soon
//! as it sees READY, and backs off for `Retry-After` on 429/503, as the waiting page does. Direct
//! mode: each user orders at once, as everybody does when there is no waiting room.
//!
//! Measured per scenario: order latency at the client (READY -> order response in a room; arrival
//! -> order response without one), the backend's peak concurrency and queueing (its
//! `/admin/stats`), completion time against the ideal N / rate, FIFO inversions (pairs served in
//! the opposite order of their place in line; the place is the user's arrival number in Redis,
//! read with ZSCORE right after the enter), users lost, polls per user, and the ETA error (the
//! enter answer's `estimatedWaitTime` against the actual wait). A sampler records the line,
//! admissions and the backend's load over time for the charts; in a room also the batch in force
//! (an adaptive room moves it, contract section 11) and the order latency p95 of the last second,
//! the figure the room's controller steers by, as the users see it.
//!
//! Throughput is reported as a share of the backend's capacity (`--ideal-rate`) twice: over the
//! whole run, which the arrival second and the last users' polling tail pull down in any room, and
//! between the 10 % and 90 % marks of the completions, which is what the backend did during the rush.
//!
//! The crowd holds at most `--conns` requests in flight (one connection each): a stand-in for the
//! finite connections of the tier in front, and a limit the machine's descriptors need. A user
//! waiting for one of them is waiting to be served: that time counts in their latency.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use http::header::HeaderName;
use http::{Method, Uri};
use serde::Serialize;
use tokio::time::Instant;
use waitroom_tools::crowd::{lock, run_tag, Counters, Crowd, Ending, FrontPolling, Journey, Next, Visit, Watcher};
use waitroom_tools::demo_api::StatsSnapshot;
use waitroom_tools::numbers::percentile;
use waitroom_tools::room::{url, QueueAnswer, Room, RoomSettings};

use crate::keys::{self, Keys};
use crate::resp::{Redis, Reply as RedisReply};
use crate::stats::inversions;
use crate::{ctx, Result};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Through the waiting room: enter, poll, order when READY.
    Room,
    /// No waiting room: everybody orders at once.
    Direct,
}

#[derive(Args)]
pub struct CrowdArgs {
    /// The scenario's name in the results.
    #[arg(long)]
    label: String,
    #[arg(long, value_enum)]
    mode: Mode,
    /// Base URL of the proxy (room mode) or of whatever takes the orders (direct mode).
    #[arg(long)]
    target: String,
    /// Base URL of the demo order API itself, for /admin/reset and /admin/stats.
    #[arg(long)]
    backend: String,
    /// Redis host:port (room mode): the users' places in line and the line's length over time.
    #[arg(long)]
    redis: Option<String>,
    /// The room's `redis.key_prefix`.
    #[arg(long, default_value = "waitroom")]
    prefix: String,
    /// The room's name under `rooms` (its keys are then `{prefix:NAME}:...`).
    #[arg(long, default_value = keys::DEFAULT_ROOM)]
    room: String,
    /// The Host the users send, for a room that only takes requests for its `host`.
    #[arg(long)]
    host: Option<String>,
    #[arg(long, default_value = "/queue")]
    endpoints: String,
    #[arg(long, default_value = "/api/orders")]
    order_path: String,
    #[arg(long, default_value_t = 20_000)]
    users: u32,
    /// Arrivals are spread uniformly over this many milliseconds.
    #[arg(long, default_value_t = 1000)]
    spread_ms: u64,
    /// Requests in flight at once, at most (one connection each).
    #[arg(long, default_value_t = 2000)]
    conns: usize,
    /// The rate the scenario can serve at best (users/s): the ideal completion time is N / rate.
    #[arg(long, default_value_t = 100.0)]
    ideal_rate: f64,
    /// Give up after this long (default: twice the ideal time plus 60 s).
    #[arg(long)]
    timeout_s: Option<f64>,
    /// One request's limit; a request slower than this is dropped and retried.
    #[arg(long, default_value_t = 60)]
    request_timeout_s: u64,
    /// READY seen more than this much later than a user behind you counts as a real inversion
    /// (the longest pollAfter plus its jitter: 10 s + 10 %).
    #[arg(long, default_value_t = 11.0)]
    poll_slack_s: f64,
    /// A what-if, not the contract's client: users at or before this position poll every
    /// `--front-poll-ms` instead of when `pollAfter` says, i.e. they learn READY within that
    /// long of their admission, as a status held open for the front of the line would tell them.
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    front_positions: u64,
    #[arg(long, default_value_t = 100)]
    front_poll_ms: u64,
    #[arg(long, default_value_t = 250)]
    sample_ms: u64,
    /// The room's `admission.batch_size` (room mode): the batch in force whenever the room holds
    /// no adaptive batch, which is always for a fixed room and before an adaptive one's first
    /// step. Without it such samples record no batch.
    #[arg(long)]
    batch_size: Option<u32>,
    /// The room's `admission.interval` in milliseconds, recorded for the report (it turns a batch
    /// into an admission rate, so rooms with different intervals compare).
    #[arg(long)]
    interval_ms: Option<u64>,
    /// Where to write the scenario's JSON.
    #[arg(long)]
    out: PathBuf,
}

/// A few Redis connections, used round-robin for the users' ZSCOREs and the sampler.
struct RedisPool {
    addr: String,
    conns: Vec<tokio::sync::Mutex<Option<Redis>>>,
    next: AtomicUsize,
}

impl RedisPool {
    fn new(addr: String, size: usize) -> RedisPool {
        RedisPool { addr, conns: (0..size).map(|_| tokio::sync::Mutex::new(None)).collect(), next: AtomicUsize::new(0) }
    }

    /// The commands on one connection; wrapped in MULTI/EXEC they are the replies of one
    /// consistent moment. A connection that failed is dropped and opened again next time.
    async fn run(&self, cmds: &[&[&[u8]]]) -> Option<Vec<RedisReply>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let mut slot = self.conns[i].lock().await;
        if slot.is_none() {
            *slot = Redis::connect(&self.addr).await.ok();
        }
        let conn = slot.as_mut()?;
        let mut replies = Vec::with_capacity(cmds.len());
        for c in cmds {
            match conn.cmd(c).await {
                Ok(reply) => replies.push(reply),
                Err(_) => {
                    *slot = None;
                    return None;
                }
            }
        }
        Some(replies)
    }

    async fn transaction(&self, cmds: &[&[&[u8]]]) -> Option<Vec<RedisReply>> {
        let mut all: Vec<&[&[u8]]> = vec![&[b"MULTI"]];
        all.extend_from_slice(cmds);
        all.push(&[b"EXEC"]);
        match self.run(&all).await?.pop()? {
            RedisReply::Array(items) => Some(items),
            _ => None,
        }
    }

    async fn cmd(&self, args: &[&[u8]]) -> Option<RedisReply> {
        self.run(&[args]).await?.pop()
    }
}

/// What the benchmark records beyond the shared counters: each user's place in line and the
/// orders of the last second.
struct Watch {
    start: Instant,
    redis: Option<RedisPool>,
    queue_key: String,
    /// Each user's arrival number in Redis, read with ZSCORE right after the enter (0: unknown).
    tickets: Vec<AtomicU64>,
    tickets_missing: AtomicU64,
    /// (completed at, order latency in ms) of the orders of about the last second, for the
    /// sampler's rolling p95; it drops the older ones each sample, so this stays small.
    recent_orders: Mutex<VecDeque<(f64, f64)>>,
}

impl Watch {
    fn secs(&self, at: Option<Instant>) -> Option<f64> {
        at.map(|t| t.saturating_duration_since(self.start).as_secs_f64())
    }
}

impl Watcher for Watch {
    async fn waiting(&self, index: u32, user: &str, _answer: &QueueAnswer, first: bool) {
        if !first {
            return;
        }
        let ticket = match &self.redis {
            Some(pool) => pool.cmd(&[b"ZSCORE", self.queue_key.as_bytes(), user.as_bytes()]).await,
            None => None,
        };
        match ticket.and_then(|r| r.as_i64()).and_then(|t| u64::try_from(t).ok()) {
            Some(t) => self.tickets[index as usize].store(t, Ordering::Relaxed),
            None => {
                self.tickets_missing.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn ordered(&self, journey: &Journey) {
        if let (Some(ready), Some(done)) = (self.secs(journey.ready), self.secs(journey.done)) {
            lock(&self.recent_orders).push_back((done, (done - ready) * 1000.0));
        }
    }
}

/// The crowd and what the sampler reads besides it.
struct Shared {
    crowd: Arc<Crowd<Watch>>,
    mode: Mode,
    backend_stats: Uri,
    seq_key: String,
    adaptive_key: String,
    batch_size: Option<u32>,
}

impl Shared {
    fn now(&self) -> f64 {
        self.crowd.watcher.start.elapsed().as_secs_f64()
    }
}

#[derive(Serialize, Default, Clone)]
struct Sample {
    t: f64,
    /// The line: users in the room's queue (room), or orders waiting for a slot or a connection
    /// (direct).
    queue: i64,
    /// Users admitted so far (room: arrival numbers handed out minus the line; direct: orders
    /// that got a backend slot, i.e. completed + in flight).
    admitted: i64,
    ordered: i64,
    client_waiting: i64,
    backend_in_flight: i64,
    backend_waiting: i64,
    /// The room's batch in force (room mode; none when Redis did not answer).
    batch: Option<u32>,
    /// p95 of the order latencies of the orders completed in the last second (none without any).
    order_p95_ms: Option<f64>,
}

async fn backend_stats(s: &Shared) -> Option<StatsSnapshot> {
    let reply = s.crowd.room.observe(Method::GET, &s.backend_stats, Duration::from_secs(2)).await?;
    serde_json::from_slice(&reply.body).ok()
}

async fn sample(s: &Shared) -> Sample {
    let backend = backend_stats(s).await.unwrap_or_default();
    let (c, watch) = (&s.crowd.counters, &s.crowd.watcher);
    let ordered = c.ordered.load(Ordering::Relaxed);
    let (queue, admitted, batch) = match (&watch.redis, s.mode) {
        (Some(pool), Mode::Room) => {
            // One transaction: enters landing between two separate reads would count as admitted,
            // and the batch belongs to the same moment as the line it is draining.
            let replies = pool
                .transaction(&[
                    &[b"ZCARD", watch.queue_key.as_bytes()],
                    &[b"GET", s.seq_key.as_bytes()],
                    &[b"HGET", s.adaptive_key.as_bytes(), b"batch"],
                ])
                .await;
            let at = |i: usize| replies.as_ref().and_then(|r| r.get(i)).and_then(|r| r.as_i64());
            let len = at(0).unwrap_or(0);
            let seq = at(1).unwrap_or(0);
            // A missing field is the configured batch; a failed transaction is no batch at all,
            // lest a fixed-looking sample hide a moment the controller had moved.
            let batch = match at(2) {
                Some(b) => u32::try_from(b).ok(),
                None => replies.as_ref().and(s.batch_size),
            };
            (len, (seq - len).max(0), batch)
        }
        _ => (
            backend.waiting as i64 + s.crowd.room.pending(),
            ordered + backend.in_flight as i64,
            None,
        ),
    };
    let t = s.now();
    let order_p95_ms = {
        let mut recent = lock(&watch.recent_orders);
        while recent.front().is_some_and(|&(done, _)| done < t - 1.0) {
            recent.pop_front();
        }
        let mut last: Vec<f64> = recent.iter().map(|&(_, ms)| ms).collect();
        last.sort_by(f64::total_cmp);
        (!last.is_empty()).then(|| percentile(&last, 95.0))
    };
    Sample {
        t,
        queue,
        admitted,
        ordered,
        client_waiting: c.waiting.load(Ordering::Relaxed),
        backend_in_flight: backend.in_flight as i64,
        backend_waiting: backend.waiting as i64,
        batch,
        order_p95_ms,
    }
}

#[derive(Serialize)]
struct Pcts {
    p50: f64,
    p95: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

fn pcts(mut v: Vec<f64>) -> Pcts {
    v.sort_by(f64::total_cmp);
    let mean = if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    Pcts {
        p50: percentile(&v, 50.0),
        p95: percentile(&v, 95.0),
        p99: percentile(&v, 99.0),
        max: v.last().copied().unwrap_or(0.0),
        mean,
    }
}

pub async fn run(a: CrowdArgs) -> Result<()> {
    let ideal_s = f64::from(a.users) / a.ideal_rate;
    let timeout_s = a.timeout_s.unwrap_or(ideal_s * 2.0 + 60.0);
    let backend = |path: &str| url(&format!("{}{path}", a.backend.trim_end_matches('/')));
    let room = Room::new(RoomSettings {
        target: a.target.clone(),
        prefix: a.endpoints.clone(),
        order_path: a.order_path.clone(),
        user_header: HeaderName::from_static("x-user-id"),
        token_header: HeaderName::from_static("x-entry-token"),
        request_timeout: Duration::from_secs(a.request_timeout_s),
        max_conns: Some(a.conns),
        host: a.host.clone(),
    })?;
    let start = Instant::now() + Duration::from_millis(100);
    let keys = Keys::of_room(&a.prefix, &a.room);
    let watch = Watch {
        start,
        redis: a.redis.clone().map(|addr| RedisPool::new(addr, 8)),
        queue_key: keys.queue,
        tickets: (0..a.users).map(|_| AtomicU64::new(0)).collect(),
        tickets_missing: AtomicU64::new(0),
        recent_orders: Mutex::new(VecDeque::new()),
    };
    let mut crowd = Crowd::new(room, watch);
    if a.front_positions > 0 {
        crowd.front = Some(FrontPolling {
            positions: a.front_positions,
            every: Duration::from_millis(a.front_poll_ms.max(1)),
        });
    }
    let s = Shared {
        crowd: Arc::new(crowd),
        mode: a.mode,
        backend_stats: backend("/admin/stats")?,
        seq_key: keys.seq,
        adaptive_key: keys.adaptive,
        batch_size: a.batch_size,
    };

    // Fresh peaks for this scenario.
    let reset = backend("/admin/reset")?;
    s.crowd.room.observe(Method::POST, &reset, Duration::from_secs(5)).await.ok_or("POST /admin/reset: no answer")?;

    let visit = match a.mode {
        Mode::Room => Visit::Room,
        Mode::Direct => Visit::Direct,
    };
    let tag = run_tag();
    let mut users = s.crowd.spawn(a.users, start, Duration::from_millis(a.spread_ms), visit, |i| format!("{}-{tag}-{i}", a.label));
    users.give_up_at(start + Duration::from_secs_f64(timeout_s));

    let mut series = Vec::new();
    let mut tick = tokio::time::interval_at(start, Duration::from_millis(a.sample_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_print = 0.0;
    let ending = loop {
        match users.next(&mut tick).await {
            Next::Tick => {
                let smp = sample(&s).await;
                if smp.t - last_print >= 5.0 {
                    last_print = smp.t;
                    eprintln!("  [{}] {:6.1}s line {:6}  admitted {:6}  ordered {:6}  backend in-flight {:3} waiting {:5}",
                        a.label, smp.t, smp.queue, smp.admitted, smp.ordered, smp.backend_in_flight, smp.backend_waiting);
                }
                series.push(smp);
            }
            Next::End(ending) => break ending,
        }
    };
    let gave_up = ending != Ending::AllDone;
    series.push(sample(&s).await);
    let backend = backend_stats(&s).await.unwrap_or_default();

    // ---- the summary ----
    let watch = &s.crowd.watcher;
    let recs: Vec<UserRec> = users
        .journeys
        .iter()
        .zip(&watch.tickets)
        .map(|(journey, ticket)| {
            let j = lock(journey).clone();
            UserRec {
                arrived: watch.secs(j.arrived),
                ticket: Some(ticket.load(Ordering::Relaxed)).filter(|&t| t > 0),
                first_eta: j.first_eta.map(|e| e as f64),
                entered_at: watch.secs(j.joined),
                ready_at: watch.secs(j.ready),
                done_at: watch.secs(j.done),
            }
        })
        .collect();
    let done: Vec<&UserRec> = recs.iter().filter(|r| r.done_at.is_some()).collect();
    let completed = done.len() as u64;
    let lost = u64::from(a.users) - completed;
    let completion_s = done.iter().filter_map(|r| r.done_at).fold(0.0, f64::max);
    let order_latency_ms = pcts(
        done.iter().filter_map(|r| Some((r.done_at? - r.ready_at?) * 1000.0)).collect(),
    );
    let wait_s = pcts(done.iter().filter_map(|r| Some(r.ready_at? - r.arrived?)).collect());

    // FIFO: users in the order of their place in line (room: arrival number in Redis; direct: the
    // order they arrived in), against the order in which they were served (room: READY seen;
    // direct: order completed).
    let mut ranked: Vec<(f64, f64)> = recs
        .iter()
        .filter_map(|r| match a.mode {
            Mode::Room => Some((r.ticket? as f64, r.ready_at?)),
            Mode::Direct => Some((r.arrived?, r.done_at?)),
        })
        .collect();
    ranked.sort_by(|x, y| x.0.total_cmp(&y.0));
    let events: Vec<f64> = ranked.iter().map(|x| x.1).collect();
    let pairs = (events.len() as f64) * (events.len() as f64 - 1.0) / 2.0;
    let inv = inversions(&events, 0.0);
    let inv_beyond = inversions(&events, a.poll_slack_s);

    // ETA: the enter answer's estimate against the wait that followed (enter -> READY seen).
    let eta_err: Vec<f64> = recs
        .iter()
        .filter_map(|r| Some((r.ready_at? - r.entered_at?) - r.first_eta?))
        .collect();
    let eta_abs = pcts(eta_err.iter().map(|e| e.abs()).collect());
    let eta_mean_signed = if eta_err.is_empty() { 0.0 } else { eta_err.iter().sum::<f64>() / eta_err.len() as f64 };

    let throughput = throughput(&done, completion_s, a.ideal_rate);
    let batch = batch_over_time(&series);

    let c = &s.crowd.counters;
    let polls = Counters::total(&c.polls);
    let summary = serde_json::json!({
        "label": a.label,
        "mode": a.mode,
        "users": a.users,
        "completed": completed,
        "lost": lost,
        "gave_up": gave_up,
        "completion_s": completion_s,
        "ideal_s": ideal_s,
        "completion_vs_ideal": if ideal_s > 0.0 { completion_s / ideal_s } else { 0.0 },
        "order_latency_ms": order_latency_ms,
        "wait_s": wait_s,
        "throughput": throughput,
        "admission": {
            "batch_size": a.batch_size,
            "interval_ms": a.interval_ms,
        },
        "batch": batch,
        "backend": {
            "peak_in_flight": backend.peak_in_flight,
            "peak_waiting": backend.peak_waiting,
            "completed": backend.completed,
            "failed": backend.failed,
        },
        "fifo": {
            "users_ranked": events.len(),
            "inversions": inv,
            "inversion_fraction": if pairs > 0.0 { inv as f64 / pairs } else { 0.0 },
            "slack_s": a.poll_slack_s,
            "inversions_beyond_slack": inv_beyond,
            "tickets_missing": watch.tickets_missing.load(Ordering::Relaxed),
        },
        "polls_per_user": polls as f64 / f64::from(a.users),
        "eta_error_s": {
            "users": eta_err.len(),
            "mean_signed": eta_mean_signed,
            "abs": eta_abs,
        },
        "requests": {
            "enters": Counters::total(&c.enters),
            "polls": polls,
            "order_attempts": Counters::total(&c.order_attempts),
            "full_429": Counters::total(&c.full),
            "unavailable_503": Counters::total(&c.unavailable),
            "forbidden_403": Counters::total(&c.forbidden),
            "not_in_queue": Counters::total(&c.not_in_queue),
            "order_failures": Counters::total(&c.order_failures),
            "errors": Counters::total(&c.errors),
        },
        "conns": a.conns,
        "front_positions": a.front_positions,
        "front_poll_ms": a.front_poll_ms,
        "series": series,
    });
    let text = serde_json::to_string_pretty(&summary).map_err(ctx("json"))?;
    std::fs::write(&a.out, text).map_err(ctx("write the crowd result"))?;
    eprintln!(
        "  [{}] {} users: {} ordered, {} lost, done in {:.1} s (ideal {:.1} s); order latency p50 {:.0} ms p95 {:.0} ms p99 {:.0} ms; throughput {:.0} % of capacity ({:.0} % from 10 to 90 % of the orders); backend peak in-flight {} waiting {}; inversions {} ({} beyond {} s); polls/user {:.1}{}",
        a.label, a.users, completed, lost, completion_s, ideal_s,
        summary["order_latency_ms"]["p50"].as_f64().unwrap_or(0.0),
        summary["order_latency_ms"]["p95"].as_f64().unwrap_or(0.0),
        summary["order_latency_ms"]["p99"].as_f64().unwrap_or(0.0),
        summary["throughput"]["share"].as_f64().unwrap_or(f64::NAN) * 100.0,
        summary["throughput"]["steady_share"].as_f64().unwrap_or(f64::NAN) * 100.0,
        backend.peak_in_flight, backend.peak_waiting, inv, inv_beyond, a.poll_slack_s,
        polls as f64 / f64::from(a.users),
        match summary["batch"]["after_10s"]["mean"].as_f64() {
            Some(mean) => format!("; batch after 10 s: mean {mean:.1}, min {}, max {}", summary["batch"]["after_10s"]["min"], summary["batch"]["after_10s"]["max"]),
            None => String::new(),
        }
    );
    Ok(())
}

/// A user's journey in seconds since the crowd's start, with its place in line.
struct UserRec {
    arrived: Option<f64>,
    ticket: Option<u64>,
    first_eta: Option<f64>,
    entered_at: Option<f64>,
    ready_at: Option<f64>,
    done_at: Option<f64>,
}

/// Completed orders per second as a share of `ideal_rate`: over the whole run, and between the
/// completions at 10 % and 90 % (the rush without the arrival ramp and the stragglers' tail).
fn throughput(done: &[&UserRec], completion_s: f64, ideal_rate: f64) -> serde_json::Value {
    let mut at: Vec<f64> = done.iter().filter_map(|r| r.done_at).collect();
    at.sort_by(f64::total_cmp);
    let share = (completion_s > 0.0).then(|| at.len() as f64 / completion_s / ideal_rate);
    let n = at.len();
    let (lo, hi) = ((n as f64 * 0.1).floor() as usize, ((n as f64 * 0.9).ceil() as usize).saturating_sub(1));
    let steady = (hi > lo && at[hi] > at[lo]).then(|| ((hi - lo) as f64 / (at[hi] - at[lo]), at[lo], at[hi]));
    serde_json::json!({
        "ideal_rate": ideal_rate,
        "share": share,
        "steady_share": steady.map(|(rate, _, _)| rate / ideal_rate),
        "steady_rate": steady.map(|(rate, _, _)| rate),
        "steady_from_s": steady.map(|(_, from, _)| from),
        "steady_to_s": steady.map(|(_, _, to)| to),
    })
}

/// The first seconds matter on their own (what the controller does when the rush hits), so they
/// are kept sample by sample; the rest is summed up.
const BATCH_SETTLING_S: f64 = 10.0;

fn batch_over_time(series: &[Sample]) -> serde_json::Value {
    let stats = |pick: &dyn Fn(&Sample) -> bool| {
        let v: Vec<u32> = series.iter().filter(|s| pick(s)).filter_map(|s| s.batch).collect();
        if v.is_empty() {
            return serde_json::Value::Null;
        }
        serde_json::json!({
            "min": v.iter().min(),
            "max": v.iter().max(),
            "mean": v.iter().map(|&b| f64::from(b)).sum::<f64>() / v.len() as f64,
            "samples": v.len(),
        })
    };
    let first: Vec<serde_json::Value> = series
        .iter()
        .filter(|s| s.t < BATCH_SETTLING_S)
        .filter_map(|s| Some(serde_json::json!([s.t, s.batch?])))
        .collect();
    serde_json::json!({
        "first_10s": first,
        "after_10s": stats(&|s| s.t >= BATCH_SETTLING_S),
        "overall": stats(&|_| true),
    })
}
