//! `crowd`: N simulated users arriving within a second, against a room or straight at the
//! backend, and what each of them lived through.
//!
//! Room mode: each user enters, polls status exactly when `pollAfter` says (plus up to 10 %
//! jitter), orders through the proxy as soon as it sees READY, and backs off for `Retry-After` on
//! 429/503 (the behaviour of `src/bin/crowd.rs` and of the waiting page). Direct mode: each user
//! orders at once, as everybody does when there is no waiting room.
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
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, ValueEnum};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::resp::{Redis, Reply as RedisReply};
use crate::stats::{inversions, percentile, SplitMix64};
use crate::{ctx, Result};

const JITTER: f64 = 0.10;
const ERROR_PAUSE: Duration = Duration::from_secs(1);

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

/// What one user lived through; times in seconds since the crowd started.
#[derive(Default, Clone)]
struct UserRec {
    arrived: Option<f64>,
    ticket: Option<u64>,
    first_eta: Option<f64>,
    entered_at: Option<f64>,
    ready_at: Option<f64>,
    done_at: Option<f64>,
    polls: u32,
}

#[derive(Default)]
struct Counters {
    outside: AtomicI64,
    waiting: AtomicI64,
    ready: AtomicI64,
    ordered: AtomicI64,
    /// Users who want to send a request but hold no connection yet.
    pending: AtomicI64,
    enters: AtomicU64,
    polls: AtomicU64,
    order_attempts: AtomicU64,
    full: AtomicU64,
    unavailable: AtomicU64,
    forbidden: AtomicU64,
    not_in_queue: AtomicU64,
    order_failures: AtomicU64,
    errors: AtomicU64,
    tickets_missing: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Outside,
    Waiting,
    Ready,
    Ordered,
}

impl Counters {
    fn gauge(&self, p: Phase) -> &AtomicI64 {
        match p {
            Phase::Outside => &self.outside,
            Phase::Waiting => &self.waiting,
            Phase::Ready => &self.ready,
            Phase::Ordered => &self.ordered,
        }
    }
    fn move_to(&self, phase: &mut Phase, next: Phase) {
        if *phase != next {
            self.gauge(*phase).fetch_sub(1, Ordering::Relaxed);
            self.gauge(next).fetch_add(1, Ordering::Relaxed);
            *phase = next;
        }
    }
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

    /// MULTI, the commands, EXEC on one connection: the replies of one consistent moment.
    async fn transaction(&self, cmds: &[&[&[u8]]]) -> Option<Vec<RedisReply>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let mut slot = self.conns[i].lock().await;
        if slot.is_none() {
            *slot = Redis::connect(&self.addr).await.ok();
        }
        let conn = slot.as_mut()?;
        let result = async {
            conn.cmd(&[b"MULTI"]).await?;
            for c in cmds {
                conn.cmd(c).await?;
            }
            conn.cmd(&[b"EXEC"]).await
        }
        .await;
        match result {
            Ok(RedisReply::Array(items)) => Some(items),
            Ok(_) => None,
            Err(_) => {
                *slot = None;
                None
            }
        }
    }

    async fn cmd(&self, args: &[&[u8]]) -> Option<RedisReply> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let mut slot = self.conns[i].lock().await;
        if slot.is_none() {
            *slot = Redis::connect(&self.addr).await.ok();
        }
        let conn = slot.as_mut()?;
        match conn.cmd(args).await {
            Ok(reply) => Some(reply),
            Err(_) => {
                *slot = None;
                None
            }
        }
    }
}

struct Shared {
    front_positions: u64,
    front_poll: Duration,
    mode: Mode,
    client: Client<HttpConnector, Full<Bytes>>,
    gate: Semaphore,
    start: Instant,
    enter: Uri,
    status: Uri,
    order: Uri,
    backend_stats: Uri,
    request_timeout: Duration,
    c: Counters,
    redis: Option<RedisPool>,
    queue_key: String,
    seq_key: String,
    adaptive_key: String,
    batch_size: Option<u32>,
    /// (completed at, order latency in ms) of the orders of about the last second, for the
    /// sampler's rolling p95; it drops the older ones each sample, so this stays small.
    recent_orders: Mutex<VecDeque<(f64, f64)>>,
}

impl Shared {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn order_done(&self, rec: &Mutex<UserRec>) {
        let now = self.now();
        let ready = {
            let mut r = rec.lock().unwrap();
            r.done_at = Some(now);
            r.ready_at
        };
        if let Some(ready) = ready {
            self.recent_orders.lock().unwrap().push_back((now, (now - ready) * 1000.0));
        }
    }
}

struct Reply {
    status: u16,
    retry_after: Option<u64>,
    body: Bytes,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueueAnswer {
    status: String,
    poll_after: Option<u64>,
    position: Option<u64>,
    token: Option<String>,
    estimated_wait_time: Option<u64>,
    retry_after: Option<u64>,
}

impl Reply {
    fn answer(&self) -> Option<QueueAnswer> {
        serde_json::from_slice(&self.body).ok()
    }
    fn back_off(&self) -> Duration {
        let secs = self.retry_after.or_else(|| self.answer().and_then(|a| a.retry_after)).unwrap_or(1);
        Duration::from_secs(secs.max(1))
    }
}

async fn send(s: &Shared, req: Request<Full<Bytes>>) -> std::result::Result<Reply, String> {
    s.c.pending.fetch_add(1, Ordering::Relaxed);
    let permit = s.gate.acquire().await;
    s.c.pending.fetch_sub(1, Ordering::Relaxed);
    let _permit = permit.map_err(|e| e.to_string())?;
    let call = async {
        let resp = s.client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Reply { status, retry_after, body })
    };
    tokio::time::timeout(s.request_timeout, call)
        .await
        .unwrap_or_else(|_| Err("request timed out".to_string()))
}

fn request(method: Method, uri: &Uri, user: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(uri.clone())
        .header("X-User-Id", user)
        .body(Full::default())
        .expect("a valid request")
}

fn order_request(uri: &Uri, user: &str, token: Option<&str>) -> Request<Full<Bytes>> {
    let body = Bytes::from(format!(r#"{{"item":"demo-ticket","quantity":1,"user":"{user}"}}"#));
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(uri.clone())
        .header("X-User-Id", user)
        .header(CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        b = b.header("X-Entry-Token", token);
    }
    b.body(Full::new(body)).expect("a valid request")
}

fn jittered(rng: &mut SplitMix64, secs: u64) -> Duration {
    Duration::from_secs_f64(secs.max(1) as f64 * (1.0 + JITTER * rng.unit()))
}

enum Step {
    Enter,
    Poll,
    Order(String),
}

async fn room_user(index: u32, user: String, arrive: Duration, s: Arc<Shared>, rec: Arc<Mutex<UserRec>>) {
    let mut rng = SplitMix64::new(u64::from(index) ^ 0x5EED_C0DE_0000_0000);
    tokio::time::sleep_until(s.start + arrive).await;
    rec.lock().unwrap().arrived = Some(s.now());
    let mut phase = Phase::Outside;
    let mut step = Step::Enter;
    loop {
        step = match step {
            Step::Enter | Step::Poll => {
                let polling = matches!(step, Step::Poll);
                let reply = if polling {
                    bump(&s.c.polls);
                    rec.lock().unwrap().polls += 1;
                    send(&s, request(Method::GET, &s.status, &user)).await
                } else {
                    bump(&s.c.enters);
                    send(&s, request(Method::POST, &s.enter, &user)).await
                };
                match reply {
                    Ok(r) if r.status == 200 => match r.answer() {
                        Some(QueueAnswer { status, token: Some(token), .. }) if status == "READY" => {
                            let now = s.now();
                            rec.lock().unwrap().ready_at.get_or_insert(now);
                            s.c.move_to(&mut phase, Phase::Ready);
                            Step::Order(token)
                        }
                        Some(a) if a.status == "WAITING" => {
                            s.c.move_to(&mut phase, Phase::Waiting);
                            let first = {
                                let mut r = rec.lock().unwrap();
                                let first = r.entered_at.is_none();
                                if first {
                                    r.entered_at = Some(s.now());
                                    r.first_eta = a.estimated_wait_time.map(|e| e as f64);
                                }
                                first
                            };
                            if first {
                                let ticket = match &s.redis {
                                    Some(pool) => pool
                                        .cmd(&[b"ZSCORE", s.queue_key.as_bytes(), user.as_bytes()])
                                        .await
                                        .and_then(|r| r.as_i64())
                                        .map(|t| t as u64),
                                    None => None,
                                };
                                match ticket {
                                    Some(t) => rec.lock().unwrap().ticket = Some(t),
                                    None => bump(&s.c.tickets_missing),
                                }
                            }
                            let near_front = a.position.is_some_and(|p| p <= s.front_positions);
                            let pause = if near_front {
                                s.front_poll.mul_f64(1.0 + JITTER * rng.unit())
                            } else {
                                jittered(&mut rng, a.poll_after.unwrap_or(1))
                            };
                            tokio::time::sleep(pause).await;
                            Step::Poll
                        }
                        Some(a) if a.status == "NOT_IN_QUEUE" => {
                            bump(&s.c.not_in_queue);
                            s.c.move_to(&mut phase, Phase::Outside);
                            Step::Enter
                        }
                        _ => {
                            bump(&s.c.errors);
                            tokio::time::sleep(ERROR_PAUSE).await;
                            Step::Enter
                        }
                    },
                    Ok(r) if r.status == 429 || r.status == 503 => {
                        bump(if r.status == 429 { &s.c.full } else { &s.c.unavailable });
                        tokio::time::sleep(r.back_off()).await;
                        Step::Enter
                    }
                    Ok(_) | Err(_) => {
                        bump(&s.c.errors);
                        tokio::time::sleep(ERROR_PAUSE).await;
                        Step::Enter
                    }
                }
            }
            Step::Order(token) => {
                bump(&s.c.order_attempts);
                match send(&s, order_request(&s.order, &user, Some(&token))).await {
                    Ok(r) if (200..300).contains(&r.status) => {
                        s.order_done(&rec);
                        s.c.move_to(&mut phase, Phase::Ordered);
                        return;
                    }
                    Ok(r) if r.status == 403 => {
                        bump(&s.c.forbidden);
                        Step::Enter
                    }
                    Ok(r) if r.status == 429 || r.status == 503 => {
                        bump(&s.c.unavailable);
                        tokio::time::sleep(r.back_off()).await;
                        Step::Enter
                    }
                    Ok(_) => {
                        bump(&s.c.order_failures);
                        tokio::time::sleep(ERROR_PAUSE).await;
                        Step::Order(token)
                    }
                    Err(_) => {
                        bump(&s.c.errors);
                        tokio::time::sleep(ERROR_PAUSE).await;
                        Step::Order(token)
                    }
                }
            }
        };
    }
}

async fn direct_user(user: String, arrive: Duration, s: Arc<Shared>, rec: Arc<Mutex<UserRec>>) {
    tokio::time::sleep_until(s.start + arrive).await;
    let now = s.now();
    {
        let mut r = rec.lock().unwrap();
        r.arrived = Some(now);
        r.ready_at = Some(now);
    }
    let mut phase = Phase::Outside;
    s.c.move_to(&mut phase, Phase::Ready);
    loop {
        bump(&s.c.order_attempts);
        match send(&s, order_request(&s.order, &user, None)).await {
            Ok(r) if (200..300).contains(&r.status) => {
                s.order_done(&rec);
                s.c.move_to(&mut phase, Phase::Ordered);
                return;
            }
            Ok(_) => bump(&s.c.order_failures),
            Err(_) => bump(&s.c.errors),
        }
        tokio::time::sleep(ERROR_PAUSE).await;
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

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct BackendStats {
    in_flight: u64,
    peak_in_flight: u64,
    waiting: u64,
    peak_waiting: u64,
    completed: u64,
    failed: u64,
}

async fn backend_stats(s: &Shared) -> Option<BackendStats> {
    let req = Request::get(s.backend_stats.clone()).body(Full::default()).ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(2), s.client.request(req)).await.ok()?.ok()?;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice(&body).ok()
}

async fn sample(s: &Shared) -> Sample {
    let backend = backend_stats(s).await.unwrap_or_default();
    let ordered = s.c.ordered.load(Ordering::Relaxed);
    let (queue, admitted, batch) = match (&s.redis, s.mode) {
        (Some(pool), Mode::Room) => {
            // One transaction: enters landing between two separate reads would count as admitted,
            // and the batch belongs to the same moment as the line it is draining.
            let replies = pool
                .transaction(&[
                    &[b"ZCARD", s.queue_key.as_bytes()],
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
            backend.waiting as i64 + s.c.pending.load(Ordering::Relaxed).max(0),
            ordered + backend.in_flight as i64,
            None,
        ),
    };
    let t = s.now();
    let order_p95_ms = {
        let mut recent = s.recent_orders.lock().unwrap();
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
        client_waiting: s.c.waiting.load(Ordering::Relaxed),
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
    let parse = |base: &str, path: &str| -> Result<Uri> {
        format!("{}{}", base.trim_end_matches('/'), path).parse::<Uri>().map_err(ctx("url"))
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(50))
        .pool_max_idle_per_host(a.conns)
        .build(connector);
    let ideal_s = f64::from(a.users) / a.ideal_rate;
    let timeout_s = a.timeout_s.unwrap_or(ideal_s * 2.0 + 60.0);
    let prefix = a.endpoints.trim_end_matches('/');

    // Fresh peaks for this scenario.
    let reset = Request::post(parse(&a.backend, "/admin/reset")?).body(Full::default()).map_err(ctx("reset"))?;
    client.request(reset).await.map_err(ctx("POST /admin/reset"))?;

    let s = Arc::new(Shared {
        mode: a.mode,
        client,
        gate: Semaphore::new(a.conns.max(1)),
        start: Instant::now() + Duration::from_millis(100),
        enter: parse(&a.target, &format!("{prefix}/enter"))?,
        status: parse(&a.target, &format!("{prefix}/status"))?,
        order: parse(&a.target, &a.order_path)?,
        backend_stats: parse(&a.backend, "/admin/stats")?,
        request_timeout: Duration::from_secs(a.request_timeout_s),
        front_positions: a.front_positions,
        front_poll: Duration::from_millis(a.front_poll_ms.max(1)),
        c: Counters::default(),
        redis: a.redis.clone().map(|addr| RedisPool::new(addr, 8)),
        queue_key: format!("{{{}}}:queue", a.prefix),
        seq_key: format!("{{{}}}:seq", a.prefix),
        adaptive_key: format!("{{{}}}:admission:adaptive", a.prefix),
        batch_size: a.batch_size,
        recent_orders: Mutex::new(VecDeque::new()),
    });
    s.c.outside.store(i64::from(a.users), Ordering::Relaxed);

    let run_tag = format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(ctx("clock"))?.as_millis() & 0xFFFF_FFFF);
    let spread = Duration::from_millis(a.spread_ms);
    let mut recs = Vec::with_capacity(a.users as usize);
    let mut users = JoinSet::new();
    for i in 0..a.users {
        let arrive = spread.mul_f64(SplitMix64::new(u64::from(i)).unit());
        let user = format!("{}-{run_tag}-{i}", a.label);
        let rec = Arc::new(Mutex::new(UserRec::default()));
        recs.push(rec.clone());
        match a.mode {
            Mode::Room => users.spawn(room_user(i, user, arrive, s.clone(), rec)),
            Mode::Direct => users.spawn(direct_user(user, arrive, s.clone(), rec)),
        };
    }

    let mut series = Vec::new();
    let mut tick = tokio::time::interval_at(s.start, Duration::from_millis(a.sample_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let give_up = tokio::time::sleep_until(s.start + Duration::from_secs_f64(timeout_s));
    tokio::pin!(give_up);
    let mut gave_up = false;
    let mut last_print = 0.0;
    loop {
        tokio::select! {
            joined = users.join_next() => {
                if joined.is_none() { break; }
            }
            _ = tick.tick() => {
                let smp = sample(&s).await;
                if smp.t - last_print >= 5.0 {
                    last_print = smp.t;
                    eprintln!("  [{}] {:6.1}s line {:6}  admitted {:6}  ordered {:6}  backend in-flight {:3} waiting {:5}",
                        a.label, smp.t, smp.queue, smp.admitted, smp.ordered, smp.backend_in_flight, smp.backend_waiting);
                }
                series.push(smp);
            }
            _ = &mut give_up => { gave_up = true; break; }
        }
    }
    users.abort_all();
    series.push(sample(&s).await);
    let backend = backend_stats(&s).await.unwrap_or_default();

    // ---- the summary ----
    let recs: Vec<UserRec> = recs.iter().map(|r| r.lock().unwrap().clone()).collect();
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

    let polls = s.c.polls.load(Ordering::Relaxed);
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
            "tickets_missing": s.c.tickets_missing.load(Ordering::Relaxed),
        },
        "polls_per_user": polls as f64 / f64::from(a.users),
        "eta_error_s": {
            "users": eta_err.len(),
            "mean_signed": eta_mean_signed,
            "abs": eta_abs,
        },
        "requests": {
            "enters": s.c.enters.load(Ordering::Relaxed),
            "polls": polls,
            "order_attempts": s.c.order_attempts.load(Ordering::Relaxed),
            "full_429": s.c.full.load(Ordering::Relaxed),
            "unavailable_503": s.c.unavailable.load(Ordering::Relaxed),
            "forbidden_403": s.c.forbidden.load(Ordering::Relaxed),
            "not_in_queue": s.c.not_in_queue.load(Ordering::Relaxed),
            "order_failures": s.c.order_failures.load(Ordering::Relaxed),
            "errors": s.c.errors.load(Ordering::Relaxed),
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
