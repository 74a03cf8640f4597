//! `crowd`: a crowd of simulated shoppers, for the live demo and for watching a running room.
//!
//! The users are the library's ([`waitroom_tools::crowd`]): they enter, poll as `pollAfter` says,
//! order when READY and back off when refused. What this binary adds is what an operator wants to
//! see while a line drains: how many wait, how many are admitted, how fast orders go through, and
//! at the end whether anyone was lost on the way.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use http::header::HeaderName;
use http::{Method, Uri};
use serde::Serialize;
use tokio::time::Instant;
use waitroom_tools::crowd::{
    lock, run_tag, Counters, Crowd, Ending, Journey, Next, Visit, Watcher,
};
use waitroom_tools::numbers::percentile;
use waitroom_tools::room::{url, QueueAnswer, Room, RoomSettings};

/// A request that takes longer than this is treated like a dropped connection: count it, pause,
/// try again. Long enough for an order that queues behind a busy backend, short enough that a
/// wedged proxy does not freeze the demo.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a queue-length estimate from the answers stays on screen without fresh answers: the
/// contract's longest default `pollAfter`.
const ESTIMATE_KEPT: Duration = Duration::from_secs(10);

/// Simulated users who enter a waitroom line, poll as told, and order when READY
#[derive(Parser)]
#[command(name = "crowd")]
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

/// What the progress line and the summary need beyond the counters.
#[derive(Default)]
struct Watch {
    /// The largest position any WAITING answer carried since the last progress line: the user at
    /// the back of the line answers with the line's length.
    window_max_position: AtomicU64,
    /// READY -> order response, per completed order.
    order_latency: Mutex<Vec<Duration>>,
    /// Arrival -> READY, per completed order.
    line_wait: Mutex<Vec<Duration>>,
}

impl Watcher for Watch {
    fn waiting(
        &self,
        _index: u32,
        _user: &str,
        answer: &QueueAnswer,
        _first: bool,
    ) -> impl std::future::Future<Output = ()> + Send {
        if let Some(position) = answer.position {
            self.window_max_position
                .fetch_max(position, Ordering::Relaxed);
        }
        std::future::ready(())
    }

    fn ordered(&self, journey: &Journey) {
        if let (Some(arrived), Some(ready), Some(done)) =
            (journey.arrived, journey.ready, journey.done)
        {
            lock(&self.order_latency).push(done - ready);
            lock(&self.line_wait).push(ready - arrived);
        }
    }
}

/// The room's `waitroom_queue_length`, if a metrics URL was given and answers.
async fn queue_length(room: &Room, metrics: Option<&Uri>) -> Option<u64> {
    let reply = room
        .observe(Method::GET, metrics?, Duration::from_millis(500))
        .await?;
    if reply.status != 200 {
        return None;
    }
    let text = std::str::from_utf8(&reply.body).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("waitroom_queue_length "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v.max(0.0) as u64)
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

    async fn line(&mut self, started: Instant, crowd: &Crowd<Watch>, metrics: Option<&Uri>) {
        let c = &crowd.counters;
        let now = Instant::now();
        let ordered = Counters::get(&c.ordered);
        let waiting = Counters::get(&c.waiting);
        let secs = (now - self.last_at).as_secs_f64().max(1e-3);
        let rate = (ordered - self.last_ordered) as f64 / secs;
        self.last_ordered = ordered;
        self.last_at = now;

        // The room's own gauge when we can read it; otherwise the back of the line as the
        // answers of the last second described it (marked `~`). Users far back poll only every
        // few seconds, so a quiet second keeps the last estimate; a long silence (an outage, a
        // crowd backing off) shows `?` rather than a number that no longer means anything.
        let seen = crowd.watcher.window_max_position.swap(0, Ordering::Relaxed);
        if seen > 0 || waiting == 0 {
            self.line_estimate = Some((seen, now));
        }
        let line = match queue_length(&crowd.room, metrics).await {
            Some(n) => n.to_string(),
            None => match self.line_estimate {
                Some((n, at)) if now - at <= ESTIMATE_KEPT => format!("~{n}"),
                _ => "?".to_string(),
            },
        };
        self.emit(&format!(
            "{:>6.1}s  {:>7}  {:>7}  {:>7}  {:>7}  {:>8}  {:>8.0}",
            (now - started).as_secs_f64(),
            Counters::get(&c.outside),
            waiting,
            Counters::get(&c.ready),
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
        let mut v: Vec<f64> = lock(samples)
            .iter()
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| percentile(&v, p);
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
    waitroom_tools::service::block_on_main("crowd", None, run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    let room = Room::new(RoomSettings {
        target: cli.proxy.clone(),
        prefix: cli.prefix.clone(),
        order_path: cli.order_path.clone(),
        user_header: cli.user_header.clone(),
        token_header: cli.token_header.clone(),
        request_timeout: REQUEST_TIMEOUT,
        max_conns: None,
        host: None,
    });
    let metrics = cli.metrics.as_deref().map(url).transpose();
    let (room, metrics) = match (room, metrics) {
        (Ok(room), Ok(metrics)) => (room, metrics),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("crowd: {e}");
            return ExitCode::from(2);
        }
    };
    let crowd = Arc::new(Crowd::new(room, Watch::default()));
    let id_prefix = cli
        .id_prefix
        .clone()
        .unwrap_or_else(|| format!("crowd-{}", run_tag()));

    let started = Instant::now();
    let spread = Duration::from_millis(cli.spread_ms);
    let mut users = crowd.spawn(cli.users, started, spread, Visit::Room, |i| {
        format!("{id_prefix}-{i}")
    });
    users.give_up_at(started + Duration::from_secs(cli.timeout_s));

    let mut progress = Progress {
        to_stderr: cli.json,
        last_ordered: 0,
        last_at: started,
        line_estimate: None,
    };
    progress.header(metrics.is_some());
    let mut tick =
        tokio::time::interval_at(started + Duration::from_secs(1), Duration::from_secs(1));
    let ending = loop {
        match users.next(&mut tick).await {
            Next::Tick => progress.line(started, &crowd, metrics.as_ref()).await,
            Next::End(ending) => break ending,
        }
    };
    let total = started.elapsed();
    progress.line(started, &crowd, metrics.as_ref()).await;

    let c = &crowd.counters;
    let ordered = Counters::get(&c.ordered);
    let status_polls = Counters::total(&c.polls);
    let summary = Summary {
        users: cli.users,
        completed_orders: ordered,
        lost: u64::from(cli.users) - ordered.min(u64::from(cli.users)),
        total_s: total.as_secs_f64(),
        order_latency_ms: Percentiles::of(&crowd.watcher.order_latency),
        wait_in_line_ms: Percentiles::of(&crowd.watcher.line_wait),
        polls_per_user: status_polls as f64 / f64::from(cli.users),
        enters: Counters::total(&c.enters),
        status_polls,
        full: Counters::total(&c.full),
        unavailable: Counters::total(&c.unavailable),
        forbidden: Counters::total(&c.forbidden),
        not_in_queue: Counters::total(&c.not_in_queue),
        order_failures: Counters::total(&c.order_failures),
        errors: Counters::total(&c.errors),
        gave_up: ending != Ending::AllDone,
    };
    if cli.json {
        match serde_json::to_string(&summary) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("crowd: cannot encode the summary: {e}"),
        }
    } else {
        summary.print();
        match ending {
            Ending::Interrupted => println!("  interrupted (Ctrl-C): users not done count as lost"),
            Ending::GaveUp => println!("  gave up after --timeout-s {} s", cli.timeout_s),
            Ending::AllDone => {}
        }
    }
    if summary.lost == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
