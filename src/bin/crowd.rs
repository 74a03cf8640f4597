//! `crowd`: a crowd of simulated shoppers, for the live demo and for watching a running room.
//!
//! Every user behaves like a well-behaved client of the waiting page: it enters the line, polls
//! status exactly when `pollAfter` says (plus up to 10 % jitter, so that a crowd that arrived
//! together does not keep polling in lockstep), places its order as soon as it is READY, and backs
//! off for `Retry-After` when the room answers FULL or 503. What it prints is what an operator wants
//! to see while a line drains: how many wait, how many are admitted, how fast orders go through,
//! and at the end whether anyone was lost on the way.
//!
//! It is plain hyper rather than anything shared with the proxy, so it exercises waitroom from the
//! outside, the way the contract describes it.

use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::header::{HeaderName, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A request that takes longer than this is treated like a dropped connection: count it, pause,
/// try again. Long enough for an order that queues behind a busy backend, short enough that a
/// wedged proxy does not freeze the demo.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a transport error or an answer the crowd does not understand, so a broken proxy
/// is not hammered in a tight loop.
const ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Up to this fraction is added to every wait the proxy asks for.
const JITTER: f64 = 0.10;

/// How long a queue-length estimate from the answers stays on screen without fresh answers: the
/// contract's longest default `pollAfter`.
const ESTIMATE_KEPT: Duration = Duration::from_secs(10);

#[derive(Parser, Debug)]
#[command(
    name = "crowd",
    about = "Simulated users who enter a waitroom line, poll as told, and order when READY"
)]
struct Cli {
    /// Base URL of the waitroom proxy.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    proxy: String,

    /// How many users arrive.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    users: u32,

    /// The users' arrival times are spread over this many milliseconds.
    #[arg(long, default_value_t = 1000)]
    spread_ms: u64,

    /// The proxy's `endpoints.prefix`.
    #[arg(long, default_value = "/queue")]
    prefix: String,

    /// Path of the protected order request (sent as POST).
    #[arg(long, default_value = "/api/orders")]
    order_path: String,

    /// The proxy's `identity.header`.
    #[arg(long, default_value = "X-User-Id")]
    user_header: HeaderName,

    /// The proxy's `token.header`.
    #[arg(long, default_value = "X-Entry-Token")]
    token_header: HeaderName,

    /// Users are named `<id-prefix>-<n>`; the default is unique per run, so a second run against
    /// the same room never finds the first run's places or tokens.
    #[arg(long)]
    id_prefix: Option<String>,

    /// A waitroom `/metrics` URL: the progress line then shows the room's real queue length
    /// (`waitroom_queue_length`) instead of an estimate from the answers.
    #[arg(long, value_name = "URL")]
    metrics: Option<String>,

    /// Give up after this many seconds; users not done by then count as lost.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,

    /// Print the summary as one JSON object on stdout (progress lines go to stderr).
    #[arg(long)]
    json: bool,
}

// ---------------------------------------------------------------------------------------------
// Shared counters
// ---------------------------------------------------------------------------------------------

/// Where a user is, as far as the crowd knows. A user the proxy has admitted still counts as
/// waiting until its next poll sees READY, which is why the progress line also shows the room's
/// own queue length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not in line: not arrived yet, or turned away (FULL, 503) and about to try again.
    Outside,
    Waiting,
    /// Holds a token; the order is on its way.
    Ready,
    Ordered,
}

/// Everything the tasks report, in one place. Atomics for the hot counters, a mutex only for the
/// latency samples (one push per user, so it is never contended).
#[derive(Default)]
struct Stats {
    outside: AtomicI64,
    waiting: AtomicI64,
    ready: AtomicI64,
    ordered: AtomicI64,

    enters: AtomicU64,
    polls: AtomicU64,
    full: AtomicU64,
    unavailable: AtomicU64,
    forbidden: AtomicU64,
    not_in_queue: AtomicU64,
    order_failures: AtomicU64,
    errors: AtomicU64,

    /// The largest position any WAITING answer carried since the last progress line: the user at
    /// the back of the line answers with the line's length.
    window_max_position: AtomicU64,

    /// READY -> order response, per completed order.
    order_latency: Mutex<Vec<Duration>>,
    /// Arrival -> READY, per completed order.
    line_wait: Mutex<Vec<Duration>>,
}

impl Stats {
    fn gauge(&self, phase: Phase) -> &AtomicI64 {
        match phase {
            Phase::Outside => &self.outside,
            Phase::Waiting => &self.waiting,
            Phase::Ready => &self.ready,
            Phase::Ordered => &self.ordered,
        }
    }

    /// Moves one user between phases, keeping the four gauges summing to the crowd's size.
    fn move_to(&self, phase: &mut Phase, next: Phase) {
        if *phase != next {
            self.gauge(*phase).fetch_sub(1, Ordering::Relaxed);
            self.gauge(next).fetch_add(1, Ordering::Relaxed);
            *phase = next;
        }
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(gauge: &AtomicI64) -> u64 {
        gauge.load(Ordering::Relaxed).max(0) as u64
    }
}

// ---------------------------------------------------------------------------------------------
// Jitter without a rand crate
// ---------------------------------------------------------------------------------------------

/// SplitMix64: a few lines, statistically fine for spreading timers, and seeded from the user's
/// index so that a run is repeatable.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `secs` seconds plus up to 10 %.
    fn jittered(&mut self, secs: u64) -> Duration {
        Duration::from_secs_f64(secs as f64 * (1.0 + JITTER * self.unit()))
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// The proxy's answers to enter and status. Every field the contract may send, all optional, so
/// one type reads WAITING, READY, NOT_IN_QUEUE, FULL and the rest.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueueAnswer {
    status: String,
    position: Option<u64>,
    poll_after: Option<u64>,
    token: Option<String>,
    retry_after: Option<u64>,
}

/// A response, read whole.
struct Reply {
    status: u16,
    retry_after: Option<u64>,
    body: Bytes,
}

impl Reply {
    fn queue_answer(&self) -> Option<QueueAnswer> {
        serde_json::from_slice(&self.body).ok()
    }

    /// How long the proxy asked us to stay away: the header, else the body's `retryAfter`, else
    /// one second.
    fn back_off(&self) -> u64 {
        self.retry_after
            .or_else(|| self.queue_answer().and_then(|a| a.retry_after))
            .unwrap_or(1)
            .max(1)
    }
}

/// The proxy's endpoints and one pooled client shared by every user.
///
/// One client for the whole crowd, with keep-alive: users sleep most of the time, so a few dozen
/// connections carry thousands of users, like a browser population behind a CDN would. Opening a
/// connection per request would measure the kernel's TCP handshake, not the waiting room.
struct Api {
    client: Client<HttpConnector, Full<Bytes>>,
    enter: Uri,
    status: Uri,
    order: Uri,
    metrics: Option<Uri>,
    user_header: HeaderName,
    token_header: HeaderName,
}

impl Api {
    fn new(cli: &Cli) -> Result<Api, String> {
        let base = cli.proxy.trim_end_matches('/');
        let prefix = cli.prefix.trim_end_matches('/');
        let uri = |path: &str| -> Result<Uri, String> {
            format!("{base}{path}")
                .parse::<Uri>()
                .map_err(|e| format!("bad URL {base}{path}: {e}"))
        };
        if !prefix.starts_with('/') || !cli.order_path.starts_with('/') {
            return Err("--prefix and --order-path must start with /".into());
        }
        let metrics = match &cli.metrics {
            Some(m) => Some(
                m.parse::<Uri>()
                    .map_err(|e| format!("bad --metrics URL {m}: {e}"))?,
            ),
            None => None,
        };

        let mut connector = HttpConnector::new();
        // Small request/response pairs: Nagle would only add delay.
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(3)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);

        Ok(Api {
            client,
            enter: uri(&format!("{prefix}/enter"))?,
            status: uri(&format!("{prefix}/status"))?,
            order: uri(&cli.order_path)?,
            metrics,
            user_header: cli.user_header.clone(),
            token_header: cli.token_header.clone(),
        })
    }

    async fn send(&self, request: Request<Full<Bytes>>) -> Result<Reply, String> {
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse().ok());
            // Read the body to the end even when it is not needed: only then does the connection
            // go back to the pool.
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok(Reply {
                status,
                retry_after,
                body,
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")))
    }

    fn request(&self, method: Method, uri: &Uri, user: &str) -> http::request::Builder {
        Request::builder()
            .method(method)
            .uri(uri.clone())
            .header(&self.user_header, user)
    }

    async fn enter(&self, user: &str) -> Result<Reply, String> {
        let req = self
            .request(Method::POST, &self.enter, user)
            .body(Full::default());
        self.send(req.map_err(|e| e.to_string())?).await
    }

    async fn status(&self, user: &str) -> Result<Reply, String> {
        let req = self
            .request(Method::GET, &self.status, user)
            .body(Full::default());
        self.send(req.map_err(|e| e.to_string())?).await
    }

    async fn order(&self, user: &str, token: &str) -> Result<Reply, String> {
        let body = serde_json::json!({"item": "demo-ticket", "quantity": 1, "user": user});
        let body = Bytes::from(body.to_string());
        let req = self
            .request(Method::POST, &self.order, user)
            .header(&self.token_header, token)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body));
        self.send(req.map_err(|e| e.to_string())?).await
    }

    /// The room's `waitroom_queue_length`, if a metrics URL was given and answers.
    async fn queue_length(&self) -> Option<u64> {
        let uri = self.metrics.clone()?;
        let req = Request::get(uri).body(Full::default()).ok()?;
        let reply = tokio::time::timeout(Duration::from_millis(500), self.send(req))
            .await
            .ok()?
            .ok()?;
        if reply.status != 200 {
            return None;
        }
        let text = std::str::from_utf8(&reply.body).ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix("waitroom_queue_length "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v.max(0.0) as u64)
    }
}

// ---------------------------------------------------------------------------------------------
// One user
// ---------------------------------------------------------------------------------------------

/// What a user does next.
enum Step {
    Enter,
    Poll,
    Order(String),
}

/// One shopper, from arrival until the order went through. Never returns early on its own: the
/// crowd's deadline aborts whoever is not done.
async fn shopper(
    index: u32,
    user: String,
    arrive_after: Duration,
    api: Arc<Api>,
    stats: Arc<Stats>,
) {
    // Mixed with a constant so that user 0 does not start from the all-zero state.
    let mut rng = SplitMix64::new(u64::from(index) ^ 0x5EED_C0DE_0000_0000);
    tokio::time::sleep(arrive_after).await;
    let arrived = Instant::now();
    let mut phase = Phase::Outside;
    let mut ready_at: Option<Instant> = None;
    let mut step = Step::Enter;

    loop {
        step = match step {
            Step::Enter => {
                Stats::count(&stats.enters);
                match api.enter(&user).await {
                    Ok(reply) if reply.status == 200 => {
                        on_queue_answer(&reply, &stats, &mut phase, &mut ready_at, &mut rng).await
                    }
                    Ok(reply) => refused(&reply, &stats).await,
                    Err(_) => transport_error(&stats).await,
                }
            }
            Step::Poll => {
                Stats::count(&stats.polls);
                match api.status(&user).await {
                    Ok(reply) if reply.status == 200 => {
                        on_queue_answer(&reply, &stats, &mut phase, &mut ready_at, &mut rng).await
                    }
                    Ok(reply) => refused(&reply, &stats).await,
                    Err(_) => transport_error(&stats).await,
                }
            }
            Step::Order(token) => match api.order(&user, &token).await {
                Ok(reply) if (200..300).contains(&reply.status) => {
                    let now = Instant::now();
                    let ready = ready_at.unwrap_or(now);
                    push(&stats.order_latency, now - ready);
                    push(&stats.line_wait, ready - arrived);
                    stats.move_to(&mut phase, Phase::Ordered);
                    return;
                }
                Ok(reply) if reply.status == 403 => {
                    // The token is gone (expired, or spent by an earlier try whose answer we
                    // lost): the only way back is the end of the line.
                    Stats::count(&stats.forbidden);
                    ready_at = None;
                    stats.move_to(&mut phase, Phase::Outside);
                    Step::Enter
                }
                Ok(reply) if reply.status == 429 || reply.status == 503 => {
                    // The token outlives a short outage; entering again hands it back (READY),
                    // and the latency keeps counting from the first READY.
                    refused(&reply, &stats).await
                }
                Ok(_) => {
                    // The backend said no (or the proxy could not reach it): the token stays
                    // valid, so try the same order again shortly, as a shopper would.
                    Stats::count(&stats.order_failures);
                    tokio::time::sleep(ERROR_PAUSE).await;
                    Step::Order(token)
                }
                Err(_) => {
                    Stats::count(&stats.errors);
                    tokio::time::sleep(ERROR_PAUSE).await;
                    Step::Order(token)
                }
            },
        };
    }
}

/// A 200 from enter or status: wait as told, or go and order.
async fn on_queue_answer(
    reply: &Reply,
    stats: &Stats,
    phase: &mut Phase,
    ready_at: &mut Option<Instant>,
    rng: &mut SplitMix64,
) -> Step {
    let Some(answer) = reply.queue_answer() else {
        Stats::count(&stats.errors);
        tokio::time::sleep(ERROR_PAUSE).await;
        return Step::Enter;
    };
    match (answer.status.as_str(), answer.token) {
        ("READY", Some(token)) => {
            ready_at.get_or_insert_with(Instant::now);
            stats.move_to(phase, Phase::Ready);
            Step::Order(token)
        }
        ("WAITING", _) => {
            *ready_at = None;
            stats.move_to(phase, Phase::Waiting);
            if let Some(position) = answer.position {
                stats
                    .window_max_position
                    .fetch_max(position, Ordering::Relaxed);
            }
            // Exactly what the proxy asked for, plus jitter; never earlier.
            tokio::time::sleep(rng.jittered(answer.poll_after.unwrap_or(1).max(1))).await;
            Step::Poll
        }
        ("NOT_IN_QUEUE", _) => {
            // The place is gone (a room reset, or a token that expired before we looked).
            Stats::count(&stats.not_in_queue);
            stats.move_to(phase, Phase::Outside);
            Step::Enter
        }
        _ => {
            Stats::count(&stats.errors);
            tokio::time::sleep(ERROR_PAUSE).await;
            Step::Enter
        }
    }
}

/// Anything but a 200 from enter or status (and a 429/503 from the order): stay away for
/// `Retry-After`, then enter again, which keeps the place (or the token) if there still is one.
/// The user's phase stays as it was: a refusal does not move anyone in or out of the line.
async fn refused(reply: &Reply, stats: &Stats) -> Step {
    match reply.status {
        429 => Stats::count(&stats.full),
        503 => Stats::count(&stats.unavailable),
        _ => Stats::count(&stats.errors),
    }
    let pause = match reply.status {
        429 | 503 => Duration::from_secs(reply.back_off()),
        _ => ERROR_PAUSE,
    };
    tokio::time::sleep(pause).await;
    Step::Enter
}

async fn transport_error(stats: &Stats) -> Step {
    Stats::count(&stats.errors);
    tokio::time::sleep(ERROR_PAUSE).await;
    Step::Enter
}

fn push(samples: &Mutex<Vec<Duration>>, value: Duration) {
    // A poisoned lock only means another task panicked mid-push; the samples are still usable.
    samples
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(value);
}

// ---------------------------------------------------------------------------------------------
// Progress and summary
// ---------------------------------------------------------------------------------------------

/// Prints one line a second while the crowd runs.
struct Progress {
    to_stderr: bool,
    last_ordered: u64,
    last_at: Instant,
    /// The last estimate of the line's length, and when it was made.
    line_estimate: Option<(u64, Instant)>,
}

impl Progress {
    fn emit(&self, line: &str) {
        if self.to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    fn header(&self, from_metrics: bool) {
        self.emit(&format!(
            "users by what they last heard: outside (not in line yet), waiting, ready (ordering), ordered; \
             line = {}",
            if from_metrics {
                "the room's queue length (waitroom_queue_length)"
            } else {
                "~ the back of the line, from the WAITING answers of the last second"
            }
        ));
        self.emit(&format!(
            "{:>7}  {:>7}  {:>7}  {:>7}  {:>7}  {:>8}  {:>8}",
            "elapsed", "outside", "waiting", "ready", "ordered", "line", "orders/s"
        ));
    }

    async fn line(&mut self, started: Instant, stats: &Stats, api: &Api) {
        let now = Instant::now();
        let ordered = Stats::get(&stats.ordered);
        let waiting = Stats::get(&stats.waiting);
        let secs = (now - self.last_at).as_secs_f64().max(1e-3);
        let rate = (ordered - self.last_ordered) as f64 / secs;
        self.last_ordered = ordered;
        self.last_at = now;

        // The room's own gauge when we can read it; otherwise the back of the line as the
        // answers of the last second described it (marked `~`). Users far back poll only every
        // few seconds, so a quiet second keeps the last estimate; a long silence (an outage, a
        // crowd backing off) shows `?` rather than a number that no longer means anything.
        let seen = stats.window_max_position.swap(0, Ordering::Relaxed);
        if seen > 0 || waiting == 0 {
            self.line_estimate = Some((seen, now));
        }
        let line = match api.queue_length().await {
            Some(n) => n.to_string(),
            None => match self.line_estimate {
                Some((n, at)) if now - at <= ESTIMATE_KEPT => format!("~{n}"),
                _ => "?".to_string(),
            },
        };
        self.emit(&format!(
            "{:>6.1}s  {:>7}  {:>7}  {:>7}  {:>7}  {:>8}  {:>8.0}",
            (now - started).as_secs_f64(),
            Stats::get(&stats.outside),
            waiting,
            Stats::get(&stats.ready),
            ordered,
            line,
            rate
        ));
    }
}

#[derive(Serialize)]
struct Percentiles {
    p50: f64,
    p95: f64,
    p99: f64,
    max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles, in milliseconds.
    fn of(samples: &Mutex<Vec<Duration>>) -> Percentiles {
        let mut v: Vec<Duration> = samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
        v.sort_unstable();
        let at = |p: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
            v[rank.min(v.len()) - 1].as_secs_f64() * 1000.0
        };
        Percentiles {
            p50: at(50.0),
            p95: at(95.0),
            p99: at(99.0),
            max: at(100.0),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    users: u32,
    completed_orders: u64,
    lost: u64,
    total_s: f64,
    /// From the READY answer to the order's response, in ms.
    order_latency_ms: Percentiles,
    /// From arrival to the READY answer, in ms.
    wait_in_line_ms: Percentiles,
    polls_per_user: f64,
    enters: u64,
    status_polls: u64,
    full: u64,
    unavailable: u64,
    forbidden: u64,
    not_in_queue: u64,
    order_failures: u64,
    errors: u64,
    gave_up: bool,
}

impl Summary {
    fn print(&self) {
        let s = |ms: f64| format!("{:.0} ms", ms);
        let secs = |ms: f64| format!("{:.1} s", ms / 1000.0);
        println!();
        println!(
            "crowd: {} users, {} orders completed, {} lost, in {:.1} s{}",
            self.users,
            self.completed_orders,
            self.lost,
            self.total_s,
            if self.gave_up { " (gave up)" } else { "" }
        );
        let l = &self.order_latency_ms;
        println!(
            "  order latency (READY -> order response): p50 {}  p95 {}  p99 {}  max {}",
            s(l.p50),
            s(l.p95),
            s(l.p99),
            s(l.max)
        );
        let w = &self.wait_in_line_ms;
        println!(
            "  wait in line (arrival -> READY):         p50 {}  p95 {}  p99 {}  max {}",
            secs(w.p50),
            secs(w.p95),
            secs(w.p99),
            secs(w.max)
        );
        println!(
            "  status polls per user: {:.1}   enters: {}   turned away: FULL/429 {}, 503 {}",
            self.polls_per_user, self.enters, self.full, self.unavailable
        );
        println!(
            "  token refused (403): {}   place lost (NOT_IN_QUEUE): {}   order failures: {}   transport errors: {}",
            self.forbidden, self.not_in_queue, self.order_failures, self.errors
        );
    }
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Multi-thread: the crowd shares the machine with the proxy it measures, and a single thread
    // would make the crowd, not the room, the bottleneck during the arrival burst.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crowd: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    let api = match Api::new(&cli) {
        Ok(api) => Arc::new(api),
        Err(e) => {
            eprintln!("crowd: {e}");
            return ExitCode::from(2);
        }
    };
    let stats = Arc::new(Stats::default());
    stats.outside.store(i64::from(cli.users), Ordering::Relaxed);
    let id_prefix = cli.id_prefix.clone().unwrap_or_else(|| {
        let run = uuid::Uuid::new_v4().simple().to_string();
        format!("crowd-{}", &run[..8])
    });

    let started = Instant::now();
    let deadline = started + Duration::from_secs(cli.timeout_s);
    let spread = Duration::from_millis(cli.spread_ms);
    let mut shoppers = JoinSet::new();
    for i in 0..cli.users {
        // Arrival time from the same seeded generator family as the jitter: repeatable runs.
        let arrive_after = spread.mul_f64(SplitMix64::new(u64::from(i)).unit());
        let user = format!("{id_prefix}-{i}");
        shoppers.spawn(shopper(
            i,
            user,
            arrive_after,
            Arc::clone(&api),
            Arc::clone(&stats),
        ));
    }

    let mut progress = Progress {
        to_stderr: cli.json,
        last_ordered: 0,
        last_at: started,
        line_estimate: None,
    };
    progress.header(api.metrics.is_some());
    let mut tick =
        tokio::time::interval_at(started + Duration::from_secs(1), Duration::from_secs(1));
    let mut gave_up = false;
    let mut interrupted = false;
    // Made once, outside the loop: a Ctrl-C must not fall between two iterations' futures.
    let give_up_at = tokio::time::sleep_until(deadline);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(give_up_at, ctrl_c);
    loop {
        tokio::select! {
            joined = shoppers.join_next() => {
                match joined {
                    None => break,
                    Some(Err(e)) if e.is_panic() => eprintln!("crowd: a user task panicked: {e}"),
                    Some(_) => {}
                }
            }
            _ = tick.tick() => progress.line(started, &stats, &api).await,
            _ = &mut give_up_at => {
                gave_up = true;
                break;
            }
            _ = &mut ctrl_c => {
                gave_up = true;
                interrupted = true;
                break;
            }
        }
    }
    let total = started.elapsed();
    shoppers.abort_all();
    progress.line(started, &stats, &api).await;

    let ordered = Stats::get(&stats.ordered);
    let status_polls = stats.polls.load(Ordering::Relaxed);
    let summary = Summary {
        users: cli.users,
        completed_orders: ordered,
        lost: u64::from(cli.users) - ordered.min(u64::from(cli.users)),
        total_s: total.as_secs_f64(),
        order_latency_ms: Percentiles::of(&stats.order_latency),
        wait_in_line_ms: Percentiles::of(&stats.line_wait),
        polls_per_user: status_polls as f64 / f64::from(cli.users),
        enters: stats.enters.load(Ordering::Relaxed),
        status_polls,
        full: stats.full.load(Ordering::Relaxed),
        unavailable: stats.unavailable.load(Ordering::Relaxed),
        forbidden: stats.forbidden.load(Ordering::Relaxed),
        not_in_queue: stats.not_in_queue.load(Ordering::Relaxed),
        order_failures: stats.order_failures.load(Ordering::Relaxed),
        errors: stats.errors.load(Ordering::Relaxed),
        gave_up,
    };
    if cli.json {
        match serde_json::to_string(&summary) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("crowd: cannot encode the summary: {e}"),
        }
    } else {
        summary.print();
        if interrupted {
            println!("  interrupted (Ctrl-C): users not done count as lost");
        } else if gave_up {
            println!("  gave up after --timeout-s {} s", cli.timeout_s);
        }
    }
    if summary.lost == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_adds_at_most_ten_percent() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..10_000 {
            let d = rng.jittered(2);
            assert!(
                d >= Duration::from_secs(2) && d < Duration::from_millis(2200),
                "{d:?}"
            );
        }
    }

    #[test]
    fn the_generator_is_repeatable_per_seed() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = SplitMix64::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = SplitMix64::new(42);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(SplitMix64::new(1).next_u64(), SplitMix64::new(2).next_u64());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples = Mutex::new((1..=100).map(Duration::from_millis).collect::<Vec<_>>());
        let p = Percentiles::of(&samples);
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
        let empty = Percentiles::of(&Mutex::new(Vec::new()));
        assert_eq!(empty.p99, 0.0);
    }
}
