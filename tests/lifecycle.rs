//! The program's lifecycle (contract sections 1 and 6, issue 4), tested on the real binary:
//! the command line and its exit codes, live reloads (SIGHUP and file watching), graceful
//! shutdown on SIGTERM / SIGINT, and a crash (SIGKILL) that loses no place in line.
//!
//! Timing assertions carry generous margins (the CI machines are small and run tests in
//! parallel); the measured numbers are printed, run with `--nocapture` to see them.

mod common;

use common::*;
use serde_yaml::Value;
use std::net::{SocketAddr, TcpListener};
use std::process::{ExitStatus, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---- helpers ------------------------------------------------------------------------------

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A proxy on `redis` in front of `api`. `redis.timeout` is raised from 500 ms to 2 s: these
/// tests are about the lifecycle, and a loaded CI machine must not turn a slow Redis call into
/// a 503 that fails them.
fn room_builder(redis: &RedisServer, api: &DemoApi) -> ProxyBuilder {
    Proxy::builder(&redis.url(), api.addr()).yaml("redis: {timeout: 2s}")
}

/// A Redis, a demo API and a proxy of [`room_builder`] with `yaml` on top. The demo API honours
/// `X-Demo-Delay-Ms`, for [`slow_order`].
async fn lifecycle_room(yaml: &str) -> (RedisServer, DemoApi, Proxy) {
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--client-delays"]);
    let proxy = room_builder(&redis, &api).yaml(yaml).start().await;
    (redis, api, proxy)
}

/// A Redis, a demo API and a proxy of [`room_builder`] with `yaml` and `env` on top, in a room
/// where nobody is admitted (`NO_ADMISSION`: positions stay put, so an ETA shows which
/// `batch_size` is in force), started once its first (empty) tick has passed.
async fn still_room(yaml: &str, env: &[(&str, &str)]) -> (RedisServer, DemoApi, Proxy) {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let builder = env
        .iter()
        .fold(room_builder(&redis, &api).yaml(NO_ADMISSION).yaml(yaml), |b, (k, v)| b.env(k, v));
    let proxy = builder.start_settled(&redis.conn().await).await;
    (redis, api, proxy)
}

/// A Redis URL that refuses every connection: `--check` and start-up failures must not need
/// Redis, and a proxy that switched to it would answer 503.
fn closed_redis_url() -> String {
    format!("redis://127.0.0.1:{}", closed_port())
}


fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The key path a problem line starts with: everything before the first ": ".
fn path_of(line: &str) -> &str {
    line.split_once(": ").map(|(p, _)| p).unwrap_or(line)
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A valid file for `--check`: every address parses, Redis is a closed port.
fn valid_check_yaml() -> String {
    let [listen, metrics, upstream] = free_ports();
    format!(
        "listen: \"127.0.0.1:{}\"\nmetrics_listen: \"127.0.0.1:{}\"\nupstream: \"127.0.0.1:{}\"\n\
         redis: {{url: \"{}\", key_prefix: checkroom}}\n",
        listen,
        metrics,
        upstream,
        closed_redis_url()
    )
}

/// Four semantic problems at once (see `cli_invalid_file_*`).
const FOUR_PROBLEMS: &str =
    "listen: \"not-an-address\"\nadmission: {batch_size: 0}\nqueue: {capacity: 0}\ntoken: {ttl: 0s}\n";
const FOUR_PATHS: [&str; 4] = [
    "listen",
    "admission.batch_size",
    "queue.capacity",
    "token.ttl",
];

async fn metric_or_zero(proxy: &Proxy, series: &str) -> f64 {
    proxy.metric(series).await.unwrap_or(0.0)
}

async fn reloads(proxy: &Proxy, result: &str) -> f64 {
    metric_or_zero(
        proxy,
        &format!("waitroom_config_reloads_total{{result=\"{result}\"}}"),
    )
    .await
}

async fn admitted(proxy: &Proxy) -> f64 {
    metric_or_zero(proxy, "waitroom_admitted_total").await
}

/// (ok, error): `waitroom_config_reloads_total` by result.
async fn reload_counts(proxy: &Proxy) -> (f64, f64) {
    (reloads(proxy, "ok").await, reloads(proxy, "error").await)
}

/// Waits until `waitroom_config_reloads_total{result}` reaches `n`; returns how long it took.
async fn await_reloads(proxy: &Proxy, result: &str, n: f64, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    let ok = wait_until(timeout, Duration::from_millis(10), || async {
        reloads(proxy, result).await >= n
    })
    .await;
    ok.then(|| start.elapsed())
}

/// SIGHUP, then [`await_reloads`] for the `n`th reload of `result` within 3 s.
async fn sighup(proxy: &Proxy, result: &str, n: f64) -> Option<Duration> {
    proxy.signal("HUP");
    await_reloads(proxy, result, n, Duration::from_secs(3)).await
}

/// Writes the running configuration with `yaml` merged in, without taking it as the proxy's
/// (`proxy.config()` stays what runs): for a file the reload must refuse.
fn write_refused_config(proxy: &Proxy, yaml: &str) {
    let mut cfg = proxy.config();
    merge_yaml(&mut cfg, serde_yaml::from_str(yaml).unwrap());
    proxy.write_config_raw(&serde_yaml::to_string(&cfg).unwrap());
}

/// Each measured value within its bounds, in order; the message of the first that is not.
#[track_caller]
fn assert_within(checks: &[(f64, std::ops::RangeInclusive<f64>, String)]) {
    for (value, bounds, message) in checks {
        assert!(bounds.contains(value), "{message}");
    }
}

/// Users admitted per second over `window`, measured twice: from this proxy's
/// `waitroom_admitted_total` and from the drop of the room's line in Redis (nobody enters
/// meanwhile). Each is timed between its own two samples, so a slow scrape does not skew it.
/// Returns (metric rate, Redis rate); the Redis one sees the whole room at one instant.
async fn measure_rate(proxy: &Proxy, redis: &RedisServer, window: Duration) -> (f64, f64) {
    let timed_metric = || async { (admitted(proxy).await, Instant::now()) };
    let timed_len = || async { (queue_len(proxy, redis).await as f64, Instant::now()) };
    let ((a0, ta0), (q0, tq0)) = (timed_metric().await, timed_len().await);
    tokio::time::sleep(window).await;
    let ((a1, ta1), (q1, tq1)) = (timed_metric().await, timed_len().await);
    (
        (a1 - a0) / (ta1 - ta0).as_secs_f64(),
        (q0 - q1) / (tq1 - tq0).as_secs_f64(),
    )
}

/// ZCARD of the room's line.
async fn queue_len(proxy: &Proxy, redis: &RedisServer) -> u64 {
    let mut conn = redis.conn().await;
    redis::cmd("ZCARD")
        .arg(keys(&proxy).queue)
        .query_async(&mut conn)
        .await
        .expect("ZCARD")
}

/// Enters `n` users named `{prefix}-{i}`, 50 at a time; all must be queued (200).
async fn enqueue(proxy: &Proxy, prefix: &str, n: usize) {
    let users: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for chunk in users.chunks(50) {
        let answers = futures::future::join_all(chunk.iter().map(|u| proxy.enter(u))).await;
        for (user, a) in chunk.iter().zip(&answers) {
            assert_eq!(a.status, 200, "enter {user}: {}", a.body);
        }
    }
}

/// The waiting user of `{prefix}-0..n` with the largest position (concurrent enters arrive in
/// any order).
async fn tail_of(proxy: &Proxy, prefix: &str, n: usize) -> String {
    let mut best = (0, String::new());
    for i in 0..n {
        let user = format!("{prefix}-{i}");
        let body = proxy.status(&user).await.json();
        if let (Some("WAITING"), Some(pos)) = (body["status"].as_str(), body["position"].as_u64()) {
            if pos > best.0 {
                best = (pos, user);
            }
        }
    }
    assert!(best.0 > 0, "nobody of {prefix}-* is waiting");
    best.1
}

/// `ceil(position / (batch / interval))`, or 0 within the first batch (contract section 3).
fn expected_eta(position: u64, batch: u64, interval_ms: u64) -> u64 {
    if position <= batch {
        0
    } else {
        (position * interval_ms).div_ceil(batch * 1000)
    }
}

/// The WAITING status of `user`: (position, estimatedWaitTime).
async fn waiting(proxy: &Proxy, user: &str) -> (u64, u64) {
    let body = proxy.status(user).await.json();
    assert_eq!(body["status"], "WAITING", "{user}: {body}");
    (
        body["position"].as_u64().expect("position"),
        body["estimatedWaitTime"]
            .as_u64()
            .expect("estimatedWaitTime"),
    )
}

/// True when some log line says `key` needs a restart (the key as a whole word, so `listen`
/// does not match `metrics_listen`).
fn logged_as_needing_restart(logs: &str, key: &str) -> bool {
    logs.lines().any(|line| {
        line.to_ascii_lowercase().contains("restart")
            && line
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .any(|word| word == key)
    })
}

fn code(status: Option<ExitStatus>) -> Option<i32> {
    status.and_then(|s| s.code())
}

/// What a brand-new connection to `addr` gets.
#[derive(Debug, PartialEq)]
enum Probe {
    /// connect() failed (refused or reset).
    Refused(String),
    /// The kernel accepted, then the connection closed or reset without a response.
    ClosedWithoutResponse(Duration),
    /// An HTTP response came back: the proxy served a request it should not have taken.
    Served(String),
    /// Accepted, nothing came back in time, still open.
    NoAnswer,
}

async fn probe_new_connection(addr: SocketAddr, host_path: &str) -> Probe {
    let started = Instant::now();
    let mut s =
        match tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
            .await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Probe::Refused(e.to_string()),
            Err(_) => return Probe::Refused("connect timed out".into()),
        };
    let req = format!("GET {host_path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return Probe::ClosedWithoutResponse(started.elapsed());
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(8), read).await {
        Err(_) if buf.is_empty() => Probe::NoAnswer,
        _ if buf.is_empty() => Probe::ClosedWithoutResponse(started.elapsed()),
        _ => Probe::Served(
            String::from_utf8_lossy(&buf)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned(),
        ),
    }
}

/// `GET /catalog` on an open keep-alive connection; the status line, or what went wrong.
async fn keepalive_get(s: &mut tokio::net::TcpStream, addr: SocketAddr) -> String {
    let req = format!("GET /catalog HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    if let Err(e) = s.write_all(req.as_bytes()).await {
        return format!("write failed: {e}");
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if len.is_some_and(|n| body.len() >= n) {
                    return Ok(());
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) => return Err("closed".to_string()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(e.to_string()),
            }
        }
    };
    let status_line = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    match tokio::time::timeout(Duration::from_secs(5), read).await {
        Ok(Ok(())) => status_line(&buf),
        Ok(Err(why)) if buf.is_empty() => format!("no response: {why}"),
        Ok(Err(why)) => format!("partial ({why}): {}", status_line(&buf)),
        Err(_) => "no response within 5 s".to_string(),
    }
}

/// A protected order with a token and the demo API's `X-Demo-Delay-Ms`, sent in the background.
fn slow_order(
    proxy: &Proxy,
    user: &str,
    token: &str,
    delay_ms: u64,
) -> tokio::task::JoinHandle<(Result<Resp, String>, Duration)> {
    let req = proxy
        .client()
        .post(proxy.url("/api/orders"))
        .header("X-User-Id", user)
        .header("X-Entry-Token", token)
        .header("X-Demo-Delay-Ms", delay_ms.to_string())
        .header("content-type", "application/json")
        .body(r#"{"item":"widget","quantity":1}"#);
    tokio::spawn(async move {
        let started = Instant::now();
        let res = try_send(req).await.map_err(|e| format!("{e:?}"));
        (res, started.elapsed())
    })
}

/// Until the demo API holds an order (`inFlight` >= 1): the order is in flight through the proxy.
async fn await_upstream_busy(api: &DemoApi) {
    let busy = wait_until(
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async { api.stats().await["inFlight"].as_u64().unwrap_or(0) >= 1 },
    )
    .await;
    assert!(
        busy,
        "the order never reached the upstream: {}",
        api.stats().await
    );
}

// ---- the command line (section 1) ----------------------------------------------------------

#[test]
fn cli_check_passes_a_valid_file_without_redis() {
    let out = run_check(&valid_check_yaml());
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[test]
fn cli_check_lists_every_problem_with_its_key_path() {
    let yaml = format!(
        "upstream: \"127.0.0.1:8081\"\nredis: {{url: \"{}\"}}\n{FOUR_PROBLEMS}",
        closed_redis_url()
    );
    let out = run_check(&yaml);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 4, "one line per problem:\n{}", describe(&out));
    let mut paths: Vec<&str> = lines.iter().map(|l| path_of(l)).collect();
    paths.sort_unstable();
    let mut want = FOUR_PATHS.to_vec();
    want.sort_unstable();
    assert_eq!(
        paths,
        want,
        "each line starts with its key path:\n{}",
        describe(&out)
    );
    assert!(
        lines
            .iter()
            .any(|l| l == "admission.batch_size: must be at least 1"),
        "{}",
        describe(&out)
    );
}

#[test]
fn cli_unknown_keys_are_errors_naming_the_key() {
    for (yaml, key, path) in [
        ("bogus_key: 1\n", "bogus_key", "bogus_key"),
        (
            "admission: {batch_sise: 3}\n",
            "batch_sise",
            "admission.batch_sise",
        ),
    ] {
        let file = format!("upstream: \"127.0.0.1:8081\"\n{yaml}");
        let out = run_check(&file);
        assert_eq!(out.status.code(), Some(2), "{yaml}{}", describe(&out));
        let lines = stderr_lines(&out);
        assert!(!lines.is_empty(), "{}", describe(&out));
        assert!(
            lines.iter().all(|l| l.contains(key)) && lines.iter().any(|l| path_of(l) == path),
            "the problem names {path}:\n{}",
            describe(&out)
        );
    }
}

/// A misspelt key, a stray one and a bad value in one file, and the exact line each gets: serde
/// alone stops at the first unknown key, so these three show that no problem hides another.
const MIXED_PROBLEMS: &str = "admission: {intervall: 1s, batch_size: 0}\nfoo: 1\n";
const MIXED_LINES: [&str; 3] = [
    "admission.intervall: unknown key, did you mean `interval`? (known keys: `interval`, \
     `batch_size`, `instant`, `max_active`, `adaptive`)",
    "foo: unknown key (known keys: `listen`, `metrics_listen`, `upstream`, `redis`, `identity`, \
     `token`, `protected`, `admission`, `queue`, `endpoints`, `poll_after`, `shutdown`, `reload`, \
     `polling`, `abuse`, `page`, `limits`, `event`, `admin`, `bypass`, `mode`, `rooms`)",
    "admission.batch_size: must be at least 1",
];

#[test]
fn cli_check_reports_unknown_keys_together_with_every_other_problem() {
    let yaml = format!("upstream: \"127.0.0.1:8081\"\n{MIXED_PROBLEMS}");
    let out = run_check(&yaml);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert_eq!(stderr_lines(&out), MIXED_LINES, "{}", describe(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_and_a_reload_report_unknown_keys_together_with_every_other_problem() {
    let proxy = Proxy::builder(&closed_redis_url(), local(free_port()))
        .yaml(MIXED_PROBLEMS)
        .spawn();
    let status = proxy.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code(status), Some(2), "{status:?}\n{}", proxy.logs());
    let logs = proxy.logs();
    for want in MIXED_LINES {
        assert!(logs.lines().any(|l| l.trim() == want), "a start prints {want:?}:\n{logs}");
    }

    let (_redis, _api, proxy) = lifecycle_room("").await;
    write_refused_config(&proxy, MIXED_PROBLEMS);
    assert!(sighup(&proxy, "error", 1.0).await.is_some(), "no error reload counted:\n{}", proxy.logs());
    let logs = proxy.logs();
    for want in MIXED_LINES {
        assert!(logs.lines().any(|l| l.contains(want)), "the reload logs {want:?}:\n{logs}");
    }
    assert!(proxy.is_running(), "{}", proxy.logs());
}

#[test]
fn cli_missing_upstream_is_a_configuration_error() {
    let yaml = format!("redis: {{url: \"{}\"}}\n", closed_redis_url());
    let out = run_check(&yaml);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let lines = stderr_lines(&out);
    assert!(
        lines.iter().any(|l| path_of(l) == "upstream"),
        "{}",
        describe(&out)
    );
}

#[test]
fn cli_default_config_path_is_proxy_yaml_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("proxy.yaml"), valid_check_yaml()).unwrap();
    let run = |dir: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
            .arg("--check")
            .current_dir(dir)
            .output()
            .unwrap()
    };
    let out = run(dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    std::fs::write(
        dir.path().join("proxy.yaml"),
        "upstream: \"127.0.0.1:8081\"\nadmission: {batch_size: 0}\n",
    )
    .unwrap();
    let out = run(dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert_eq!(
        stderr_lines(&out),
        vec!["admission.batch_size: must be at least 1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_invalid_file_without_check_exits_2_and_never_listens() {
    // `listen` does not parse; `metrics_listen` does, and is a port held bound (never listening)
    // by this test: a process that tried to listen there before refusing its config would fail
    // with "address in use" and exit 1, not 2. (Connecting to a free port after the process
    // exited proved nothing, and failed whenever a neighbour had taken the port.)
    let listen = local(closed_port());
    let proxy = Proxy::builder(&closed_redis_url(), local(free_port()))
        .yaml(FOUR_PROBLEMS)
        .yaml(&format!("metrics_listen: \"{listen}\""))
        .spawn();
    let status = proxy.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code(status), Some(2), "{status:?}\n{}", proxy.logs());
    let logs = proxy.logs();
    for path in FOUR_PATHS {
        assert!(
            logs.lines().any(|l| path_of(l.trim()) == path),
            "stderr names {path}:\n{logs}"
        );
    }
    assert!(
        !logs.to_ascii_lowercase().contains("in use"),
        "metrics_listen {listen}: a process that refused its config tried to listen:\n{logs}"
    );

    // Missing upstream, without --check, is exit 2 as well.
    let proxy = Proxy::builder(&closed_redis_url(), local(free_port()))
        .yaml("upstream: ~")
        .spawn();
    let status = proxy.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(
        code(status),
        Some(2),
        "missing upstream: {status:?}\n{}",
        proxy.logs()
    );
    assert!(
        proxy
            .logs()
            .lines()
            .any(|l| path_of(l.trim()) == "upstream"),
        "{}",
        proxy.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_a_taken_port_exits_1_with_a_message() {
    let redis = RedisServer::start();
    for key in ["listen", "metrics_listen"] {
        let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = taken.local_addr().unwrap();
        let proxy = Proxy::builder(&redis.url(), local(free_port()))
            .yaml(&format!("{key}: \"{addr}\""))
            .spawn();
        let status = proxy.wait_exit(Duration::from_secs(10)).await;
        let logs = proxy.logs();
        assert_eq!(code(status), Some(1), "{key} taken: {status:?}\n{logs}");
        assert!(
            logs.contains(&addr.port().to_string()) && logs.to_ascii_lowercase().contains("in use"),
            "the message names the address and the cause:\n{logs}"
        );
        println!(
            "{key} taken -> exit 1: {}",
            logs.trim().lines().last().unwrap_or_default()
        );
        drop(taken);
    }
}

// ---- reloading (section 6) -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_doubling_batch_size_doubles_the_drain_rate_and_etas_follow_at_once() {
    let (redis, _api, proxy) = lifecycle_room("admission: {interval: 100ms, batch_size: 5}").await;
    // Enough that the line outlasts both windows even when entering them all is slow.
    enqueue(&proxy, "u", 500).await;
    let tail = tail_of(&proxy, "u", 500).await;
    let (pos, eta) = waiting(&proxy, &tail).await;
    assert_eq!(
        eta,
        expected_eta(pos, 5, 100),
        "before: position {pos} at 50/s"
    );

    let (before_metric, before) = measure_rate(&proxy, &redis, Duration::from_secs(1)).await;

    proxy.rewrite_config("admission: {batch_size: 10}");
    let took = sighup(&proxy, "ok", 1.0).await;
    assert!(took.is_some(), "no ok reload counted:\n{}", proxy.logs());
    // ETAs use the new rate from the very next answer.
    let (pos, eta) = waiting(&proxy, &tail).await;
    println!("after reload: tail at position {pos}, estimatedWaitTime {eta}");
    assert!(pos > 10);
    assert_eq!(
        eta,
        expected_eta(pos, 10, 100),
        "after: position {pos} at 100/s"
    );

    let (after_metric, after) = measure_rate(&proxy, &redis, Duration::from_secs(1)).await;
    let ratio = after / before;
    let metric_ratio = after_metric / before_metric;
    println!(
        "drain rate (line in Redis): before {before:.1}/s, after {after:.1}/s, ratio {ratio:.2}; \
         by waitroom_admitted_total: {before_metric:.1}/s -> {after_metric:.1}/s, ratio \
         {metric_ratio:.2}; reload seen after {took:?}"
    );
    assert_within(&[
        (before, 35.0..=65.0, format!("before ~50/s, got {before:.1}")),
        (ratio, 1.5..=2.6, format!("ratio {ratio:.2} ({before:.1} -> {after:.1})")),
        (metric_ratio, 1.3..=3.0, format!("the admitted counter follows too: ratio {metric_ratio:.2}")),
    ]);
    assert_eq!(reload_counts(&proxy).await, (1.0, 0.0));
    // The line must not have run dry during the second window, or the rate would be understated.
    let left = queue_len(&proxy, &redis).await;
    assert!(left > 10, "the line ran dry: {left} left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_keeps_the_running_configuration() {
    let (redis, _api, proxy) = lifecycle_room("admission: {interval: 100ms, batch_size: 5}").await;
    enqueue(&proxy, "u", 400).await;

    // 1. Not even YAML.
    proxy.write_config_raw("admission: {interval: 100ms, batch_size: [10\nqueue: {{{\n");
    assert!(sighup(&proxy, "error", 1.0).await.is_some(), "no error reload counted:\n{}", proxy.logs());
    assert!(proxy.is_running(), "{}", proxy.logs());
    let (_, rate1) = measure_rate(&proxy, &redis, Duration::from_secs(1)).await;

    // 2. Valid YAML, a valid (faster!) admission, and two invalid values: nothing may apply.
    write_refused_config(&proxy, "admission: {batch_size: 20}\nqueue: {capacity: 0}\ntoken: {ttl: 0s}");
    assert!(sighup(&proxy, "error", 2.0).await.is_some(), "no second error reload counted:\n{}", proxy.logs());
    assert!(proxy.is_running(), "{}", proxy.logs());
    let (_, rate2) = measure_rate(&proxy, &redis, Duration::from_secs(1)).await;
    let left = queue_len(&proxy, &redis).await;
    assert!(
        left > 10,
        "the line ran dry ({left} left): rates understated"
    );
    println!(
        "after broken YAML: {rate1:.1}/s; after invalid values: {rate2:.1}/s (configured 50/s)"
    );

    assert_within(&[
        (rate1, 35.0..=65.0, format!("old rate kept after broken YAML: {rate1:.1}/s")),
        (rate2, 35.0..=65.0, format!("old rate kept after invalid values: {rate2:.1}/s")),
    ]);
    assert_eq!(reload_counts(&proxy).await, (0.0, 2.0));
    let logs = proxy.logs();
    for path in ["queue.capacity", "token.ttl"] {
        assert!(
            logs.lines().any(|l| l.contains(path) && l.contains("must")),
            "the problem at {path} is logged:\n{logs}"
        );
    }
    // Still serving, with the old capacity (not 0) and the old ETA rate.
    let fresh = proxy.enter("late-comer").await;
    assert_eq!(fresh.status, 200, "{}", fresh.body);
    let (pos, eta) = waiting(&proxy, "late-comer").await;
    assert_eq!(
        eta,
        expected_eta(pos, 5, 100),
        "ETA still at 50/s, position {pos}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_see_no_error_through_twenty_reloads() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = Arc::new(
        room_builder(&redis, &api)
            .yaml("admission: {interval: 100ms, batch_size: 5}")
            .start()
            .await,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));

    // One keep-alive client (the harness's pooled one) and one that opens a connection per request.
    let fresh_client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut loops = Vec::new();
    for (name, client) in [
        ("keepalive", proxy.client().clone()),
        ("fresh", fresh_client),
    ] {
        let (proxy, stop, done, failures) =
            (proxy.clone(), stop.clone(), done.clone(), failures.clone());
        loops.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let user = format!("{name}-{i}");
                let requests = [
                    (
                        "enter",
                        client
                            .post(proxy.url("/queue/enter"))
                            .header("X-User-Id", &user),
                    ),
                    (
                        "status",
                        client
                            .get(proxy.url("/queue/status"))
                            .header("X-User-Id", &user),
                    ),
                    (
                        "passthrough",
                        client.get(proxy.url(&format!("/catalog/{i}?q=1"))),
                    ),
                ];
                for (what, req) in requests {
                    match try_send(req).await {
                        Ok(r) if r.status == 200 => {}
                        Ok(r) => failures
                            .lock()
                            .unwrap()
                            .push(format!("{name} {what}: {} {}", r.status, r.body)),
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("{name} {what}: {e:?}")),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }

    let started = Instant::now();
    for n in 1..=20u32 {
        let batch = if n % 2 == 1 { 10 } else { 5 };
        proxy.rewrite_config(&format!("admission: {{batch_size: {batch}}}"));
        assert!(sighup(&proxy, "ok", n as f64).await.is_some(), "reload {n} not counted:\n{}", proxy.logs());
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.await.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    println!(
        "20 reloads in {:?}; {} requests, {} failures",
        started.elapsed(),
        done.load(Ordering::Relaxed),
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(done.load(Ordering::Relaxed) >= 60, "the clients barely ran");
    assert_eq!(reload_counts(&proxy).await, (20.0, 0.0));
    assert!(proxy.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_poll_after_and_protected_apply_on_sighup() {
    let (_redis, _api, proxy) = still_room("", &[]).await;
    for user in ["a", "b", "c"] {
        let r = proxy.enter(user).await;
        assert_eq!(r.status, 200, "enter {user}: {}\n{}", r.body, proxy.logs());
    }
    let vip = |p: &Proxy| p.client().get(p.url("/vip?x=1")).header("X-User-Id", "a");
    assert_eq!(
        proxy.status("c").await.json()["pollAfter"],
        10,
        "default tiers, ETA 3 h"
    );
    assert_eq!(
        proxy.status("a").await.json()["pollAfter"],
        2,
        "default tiers, ETA 0"
    );
    assert_eq!(
        send(vip(&proxy)).await.status,
        200,
        "not protected yet: passed through"
    );

    proxy.rewrite_config(
        "queue: {capacity: 3, retry_after: 12s}\n\
         poll_after: [{min_wait: 1h, poll_after: 9s}, {min_wait: 0s, poll_after: 3s}]\n\
         protected: [{method: POST, path: /api/orders}, {method: GET, path: /vip}]",
    );
    assert!(sighup(&proxy, "ok", 1.0).await.is_some(), "{}", proxy.logs());

    let full = proxy.enter("d").await;
    assert_eq!(
        (full.status, full.header("retry-after")),
        (429, Some("12")),
        "{}",
        full.body
    );
    assert_eq!(
        full.json(),
        serde_json::json!({"status": "FULL", "retryAfter": 12})
    );
    assert_eq!(proxy.status("c").await.json()["pollAfter"], 9);
    assert_eq!(proxy.status("a").await.json()["pollAfter"], 3);
    let r = send(vip(&proxy)).await;
    assert_eq!(r.status, 403, "GET /vip is protected now: {}", r.body);
    // Waiting users kept their places.
    assert_eq!(waiting(&proxy, "c").await.0, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_ttl_applies_to_tokens_issued_after_the_reload() {
    let (redis, _api, proxy) = lifecycle_room("admission: {interval: 50ms, batch_size: 10}\ntoken: {ttl: 5m}").await;
    proxy.until_ready("early", Duration::from_secs(5)).await;
    proxy.rewrite_config("token: {ttl: 20s}");
    assert!(sighup(&proxy, "ok", 1.0).await.is_some());
    proxy.until_ready("late", Duration::from_secs(5)).await;
    let early = proxy.status("early").await.json()["expiresIn"]
        .as_u64()
        .unwrap();
    let late = proxy.status("late").await.json()["expiresIn"]
        .as_u64()
        .unwrap();
    let mut conn = redis.conn().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(keys(&proxy).token("early"))
        .query_async(&mut conn)
        .await
        .unwrap();
    println!(
        "expiresIn: token issued before the reload {early}s (its key's PTTL in Redis {pttl} ms), \
         after {late}s"
    );
    assert!(
        (290..=300).contains(&early),
        "issued before: keeps 5m, got {early}"
    );
    assert!((18..=20).contains(&late), "issued after: 20s, got {late}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_on_one_of_two_proxies_never_doubles_the_room_rate() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let room = room_builder(&redis, &api).yaml("admission: {interval: 100ms, batch_size: 5}");
    let a = room.start().await;
    let b = room.start().await;
    enqueue(&a, "m", 500).await;
    let window = Duration::from_secs(1);
    let (_, both_old) = measure_rate(&a, &redis, window).await;

    a.rewrite_config("admission: {batch_size: 10}");
    assert!(sighup(&a, "ok", 1.0).await.is_some());
    let (_, mixed) = measure_rate(&a, &redis, window).await;

    b.rewrite_config("admission: {batch_size: 10}");
    assert!(sighup(&b, "ok", 1.0).await.is_some());
    let (_, both_new) = measure_rate(&a, &redis, window).await;
    let left = queue_len(&a, &redis).await;
    assert!(
        left > 10,
        "the line ran dry ({left} left): rates understated"
    );
    println!(
        "room rate with two proxies: both at 50/s {both_old:.1}/s; one reloaded to 100/s \
         {mixed:.1}/s; both at 100/s {both_new:.1}/s"
    );
    assert_within(&[
        (both_old, 35.0..=65.0, format!("two proxies admit 50/s in total: {both_old:.1}")),
        (mixed, 35.0..=115.0, format!("mixed state: between the old and the new rate, got {mixed:.1}")),
        (both_new, 80.0..=120.0, format!("both reloaded: 100/s in total, got {both_new:.1}")),
    ]);
}

/// How long a change of a watched file may take to show: `watched_file_reloads_on_edit_and_on_rename`
/// holds the watch to 1.5 s; a change not seen after twice that was not picked up.
const WATCH_NOTICED: Duration = Duration::from_secs(3);

/// `w-0..30` entered into a room that admits nobody (interval 1h, its first empty tick awaited
/// by the caller); the last of them, at position 30 with an ETA of 30 h at batch_size 1.
async fn thirty_waiting(proxy: &Proxy) -> String {
    enqueue(proxy, "w", 30).await;
    let tail = tail_of(proxy, "w", 30).await;
    assert_eq!(waiting(proxy, &tail).await, (30, 30 * 3600));
    tail
}

/// Polls `user`'s ETA until it is `eta` (true) or `within` has passed (false).
async fn eta_becomes(proxy: &Proxy, user: &str, eta: u64, within: Duration) -> bool {
    wait_until(within, Duration::from_millis(50), || async {
        waiting(proxy, user).await.1 == eta
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_watch_on_by_sighup_is_logged_as_needing_a_restart() {
    let (_redis, _api, proxy) = still_room("", &[]).await;
    let tail = thirty_waiting(&proxy).await;
    proxy.rewrite_config("reload: {watch: true}");
    assert!(sighup(&proxy, "ok", 1.0).await.is_some());

    // The watch is started with the process (live::merge keeps `reload.watch` as it was): a
    // change of the file alone, no signal, moves nothing, and the reload said why.
    proxy.rewrite_config("admission: {batch_size: 10}");
    let ten = expected_eta(30, 10, 3_600_000);
    let watched = eta_becomes(&proxy, &tail, ten, WATCH_NOTICED).await;
    let logs = proxy.logs();
    assert!(!watched, "reload.watch turned on by SIGHUP watches the file without a restart:\n{logs}");
    assert!(
        logged_as_needing_restart(&logs, "reload.watch"),
        "reload.watch turned on by SIGHUP was not logged as needing a restart:\n{logs}"
    );
    assert_eq!(reloads(&proxy, "ok").await, 1.0, "no reload without the watch");
    assert_eq!(waiting(&proxy, &tail).await.1, 30 * 3600, "the unwatched change applied anyway");
    // The file itself was good: a SIGHUP applies it.
    assert!(sighup(&proxy, "ok", 2.0).await.is_some());
    assert_eq!(waiting(&proxy, &tail).await.1, ten, "SIGHUP applies the change");
}

const JWT_SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";
const JWT_SECRET_NEXT: &str = "the-rotated-secret-also-32-bytes-long!";

async fn status_as(proxy: &Proxy, token: &str) -> Resp {
    send(proxy.client().get(proxy.url("/queue/status")).header("Authorization", format!("Bearer {token}"))).await
}

/// Contract section 6: in JWT mode a reload takes the new key, issuer and audience at once, and
/// keeps what names the user (`claim`, `from`, `forward_header`) until a restart, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_rotates_jwt_keys_and_keeps_what_names_the_user() {
    let (_redis, _api, proxy) = still_room(
        "identity: {jwt: {secret_env: WAITROOM_JWT_SECRET, issuer: 'https://id.example', audience: shop}}",
        &[("WAITROOM_JWT_SECRET", JWT_SECRET), ("WAITROOM_JWT_SECRET_NEXT", JWT_SECRET_NEXT)],
    )
    .await;
    let exp = jwt_exp_in(300);
    let old = hs256_jwt(JWT_SECRET, &serde_json::json!({"sub": "alice", "iss": "https://id.example", "aud": "shop", "exp": exp}));
    let r = send(proxy.client().post(proxy.url("/queue/enter")).header("Authorization", format!("Bearer {old}"))).await;
    assert_status_is(&r, 200, "WAITING");

    proxy.rewrite_config(
        "identity: {jwt: {secret_env: WAITROOM_JWT_SECRET_NEXT, issuer: 'https://id2.example', audience: shop2, claim: uid}}",
    );
    assert!(sighup(&proxy, "ok", 1.0).await.is_some(), "{}", proxy.logs());

    let claims = |iss: &str, aud: &str| serde_json::json!({"sub": "alice", "uid": "zed", "iss": iss, "aud": aud, "exp": exp});
    // The old key is refused now.
    assert_eq!(status_as(&proxy, &old).await.status, 401, "the old key still verifies after the reload");
    // The new key, issuer and audience together verify, and the token still names `sub`
    // (alice, waiting), not the new `claim` (zed, who never entered).
    let new = hs256_jwt(JWT_SECRET_NEXT, &claims("https://id2.example", "shop2"));
    let r = status_as(&proxy, &new).await;
    assert_status_is(&r, 200, "WAITING");
    assert_eq!(r.json()["position"], 1, "the rotated token names someone else: {}", r.body);
    // Each of the new issuer and audience is checked.
    for (what, token) in [
        ("the old issuer", hs256_jwt(JWT_SECRET_NEXT, &claims("https://id.example", "shop2"))),
        ("the old audience", hs256_jwt(JWT_SECRET_NEXT, &claims("https://id2.example", "shop"))),
    ] {
        assert_eq!(status_as(&proxy, &token).await.status, 401, "{what} still verifies after the reload");
    }
    let logs = proxy.logs();
    assert!(logged_as_needing_restart(&logs, "identity.jwt.claim"), "the claim was not logged as needing a restart:\n{logs}");
    for key in ["identity.jwt.issuer", "identity.jwt.audience", "identity.jwt.secret_env"] {
        assert!(!logged_as_needing_restart(&logs, key), "{key} logged as needing a restart:\n{logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_watch_a_file_change_alone_changes_nothing() {
    // `reload.watch` left at its default, false.
    let (_redis, _api, proxy) = still_room("", &[]).await;
    assert!(proxy.config().get("reload").is_none());
    let tail = thirty_waiting(&proxy).await;

    proxy.rewrite_config("admission: {batch_size: 10}");
    let moved = wait_until(WATCH_NOTICED, Duration::from_millis(50), || async {
        waiting(&proxy, &tail).await.1 != 30 * 3600 || reloads(&proxy, "ok").await > 0.0
    })
    .await;
    assert!(
        !moved,
        "an unwatched file was reloaded without a SIGHUP (ETA {}, reloads {}):\n{}",
        waiting(&proxy, &tail).await.1,
        reloads(&proxy, "ok").await,
        proxy.logs()
    );
    assert_eq!(reloads(&proxy, "error").await, 0.0);

    // The same file, signalled: it was a good one.
    assert!(sighup(&proxy, "ok", 1.0).await.is_some());
    assert_eq!(
        waiting(&proxy, &tail).await.1,
        expected_eta(30, 10, 3_600_000),
        "SIGHUP applies the change"
    );
}

/// Contract section 6 names the restart-only keys; `reload` logs (and `live::merge` returns)
/// each under its key path, sometimes its parent (`redis` for `redis.url`).
fn logged_restart_of(logs: &str, names: &[&str]) -> bool {
    names.iter().any(|k| logged_as_needing_restart(logs, k))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_addresses_or_redis_needs_a_restart_and_keeps_serving() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = room_builder(&redis, &api).start().await;
    let serving = listening_addrs(proxy.pid());
    assert!(
        serving.contains(&proxy.addr()) && serving.contains(&proxy.metrics_addr()),
        "the proxy listens on {serving:?}"
    );
    // A client connected before the reload.
    let mut open = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let first = keepalive_get(&mut open, proxy.addr()).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first:?}");

    // New addresses that were free a moment ago: whoever takes them meanwhile, the kernel says
    // below whether this proxy listens there. The new Redis refuses every connection, so a proxy
    // that switched to it would answer 503.
    let [new_listen, new_metrics] = free_ports().map(local);
    proxy.rewrite_config(&format!(
        "listen: \"{new_listen}\"\nmetrics_listen: \"{new_metrics}\"\nredis: {{url: \"{}\"}}\n\
         admission: {{batch_size: 7}}",
        closed_redis_url()
    ));
    assert!(
        sighup(&proxy, "ok", 1.0).await.is_some(),
        "a file with only restart-bound changes (and one live one) is a good file:\n{}",
        proxy.logs()
    );
    let keys: [&[&str]; 3] = [&["listen"], &["metrics_listen"], &["redis", "redis.url"]];
    // Give the log line a moment to reach the file.
    let logs_ok = wait_until(
        Duration::from_secs(2),
        Duration::from_millis(20),
        || async {
            let logs = proxy.logs();
            keys.iter().all(|k| logged_restart_of(&logs, k))
        },
    )
    .await;
    assert!(
        logs_ok,
        "listen, metrics_listen and redis logged as needing a restart:\n{}",
        proxy.logs()
    );

    // The old addresses and the old Redis keep working; the new ones are not served.
    let r = proxy.enter("still-here").await;
    assert_eq!(r.status, 200, "{}", r.body);
    // The room admits 7 per 100 ms meanwhile: by the time Redis is asked, the user may hold a
    // token rather than a place. Either is in the old Redis only if the enter went there.
    let keys = common::keys(&proxy);
    let (place, token): (Option<f64>, bool) = redis::pipe()
        .atomic()
        .cmd("ZSCORE")
        .arg(&keys.queue)
        .arg("still-here")
        .cmd("EXISTS")
        .arg(keys.token("still-here"))
        .query_async(&mut redis.conn().await)
        .await
        .expect("ZSCORE, EXISTS");
    assert!(
        place.is_some() || token,
        "the enter after the reload went to the old Redis"
    );
    assert_eq!(proxy.get("/anything").await.status, 200);
    assert_eq!(proxy.readyz().await, 200);
    let again = keepalive_get(&mut open, proxy.addr()).await;
    assert!(
        again.starts_with("HTTP/1.1 200"),
        "the connection opened before the reload: {again:?}"
    );
    assert_eq!(
        listening_addrs(proxy.pid()),
        serving,
        "the proxy listens where it did before the reload (not on {new_listen} / {new_metrics})"
    );
}

/// The other three restart-only keys of contract section 6. Open clients (a waiting page, a
/// shop's front end holding a token) keep working with the old prefix, identity header and token
/// header until the restart; the new ones do nothing yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_prefix_identity_or_token_header_needs_a_restart_and_keeps_serving() {
    let (_redis, _api, proxy) = lifecycle_room("admission: {interval: 50ms, batch_size: 10}").await;
    let token = proxy.until_ready("buyer", Duration::from_secs(5)).await;
    proxy.rewrite_config(
        "endpoints: {prefix: /line}\nidentity: {header: X-Shopper}\ntoken: {header: X-Pass}",
    );
    assert!(sighup(&proxy, "ok", 1.0).await.is_some(), "{}", proxy.logs());
    // From here on the harness's helpers would use the new names: requests are spelled out.
    let c = proxy.client();
    let mut wrong = Vec::new();

    let logged = wait_until(
        Duration::from_secs(2),
        Duration::from_millis(20),
        || async {
            let logs = proxy.logs();
            logged_restart_of(&logs, &["endpoints.prefix", "endpoints"])
                && logged_restart_of(&logs, &["identity", "identity.header"])
                && logged_restart_of(&logs, &["token.header"])
        },
    )
    .await;
    let logs = proxy.logs();
    for (key, names) in [
        ("endpoints.prefix", &["endpoints.prefix", "endpoints"][..]),
        ("identity", &["identity", "identity.header"][..]),
        ("token.header", &["token.header"][..]),
    ] {
        if !(logged || logged_restart_of(&logs, names)) {
            wrong.push(format!("{key} not logged as needing a restart"));
        }
    }

    // The old prefix and identity header still answer: the READY user keeps the token.
    let r = send(
        c.get(proxy.url("/queue/status"))
            .header("X-User-Id", "buyer"),
    )
    .await;
    if r.status != 200 || r.json()["token"] != token.as_str() {
        wrong.push(format!(
            "old prefix + old identity header: {} {}",
            r.status, r.body
        ));
    }
    let r = send(
        c.post(proxy.url("/queue/enter"))
            .header("X-User-Id", "newcomer"),
    )
    .await;
    if r.status != 200 || r.header("x-echo").is_some() {
        wrong.push(format!("enter at the old prefix: {} {}", r.status, r.body));
    }
    // The new prefix is not the proxy's yet: it passes through to the upstream.
    let r = send(
        c.get(proxy.url("/line/status"))
            .header("X-User-Id", "buyer"),
    )
    .await;
    if r.header("x-echo") != Some("yes") {
        wrong.push(format!("the new prefix is served: {} {}", r.status, r.body));
    }
    // The new identity header names nobody yet.
    let r = send(
        c.get(proxy.url("/queue/status"))
            .header("X-Shopper", "buyer"),
    )
    .await;
    if r.status != 401 {
        wrong.push(format!(
            "only the new identity header: {} {} (want 401)",
            r.status, r.body
        ));
    }
    // The new token header carries no token yet: refused, never forwarded (and not spent).
    let order = |header: &str| {
        c.post(proxy.url("/api/orders"))
            .header("X-User-Id", "buyer")
            .header(header, &token)
            .header("content-type", "application/json")
            .body(r#"{"item":"widget","quantity":1}"#)
    };
    let r = send(order("X-Pass")).await;
    if r.status != 403 || r.header("x-echo").is_some() {
        wrong.push(format!(
            "the token in the new header: {} {} (want 403)",
            r.status, r.body
        ));
    }
    let r = send(order("X-Entry-Token")).await;
    if r.status != 201 || r.json()["user"] != "buyer" {
        wrong.push(format!(
            "the token in the old header: {} {} (want 201)",
            r.status, r.body
        ));
    }
    assert!(
        wrong.is_empty(),
        "restart-only keys applied on reload:\n{}\n--- logs\n{logs}",
        wrong.join("\n")
    );
}

/// Waits for the watch to count the `n`th ok reload, and holds it to 1.5 s.
async fn watch_reloaded(proxy: &Proxy, what: &str, n: f64) {
    let took = await_reloads(proxy, "ok", n, Duration::from_secs(3)).await;
    println!("{what} reloaded after {took:?}");
    assert!(
        took.is_some_and(|t| t <= Duration::from_millis(1500)),
        "{took:?}\n{}",
        proxy.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_file_reloads_on_edit_and_on_rename() {
    // One admission an hour: positions stay put, so the ETA shows which batch_size is in force.
    let (_redis, _api, proxy) = still_room("reload: {watch: true}", &[]).await;
    let tail = thirty_waiting(&proxy).await;

    // In place (truncate + write), no SIGHUP.
    proxy.rewrite_config("admission: {batch_size: 10}");
    watch_reloaded(&proxy, "in-place edit", 1.0).await;
    assert_eq!(
        waiting(&proxy, &tail).await.1,
        expected_eta(30, 10, 3_600_000)
    );

    // Replaced by rename, as editors and ConfigMaps do.
    let mut cfg: Value = proxy.config();
    merge_yaml(
        &mut cfg,
        serde_yaml::from_str("admission: {batch_size: 20}").unwrap(),
    );
    let tmp = proxy.dir().join(".proxy.yaml.tmp");
    std::fs::write(&tmp, serde_yaml::to_string(&cfg).unwrap()).unwrap();
    std::fs::rename(&tmp, proxy.config_path()).unwrap();
    watch_reloaded(&proxy, "rename", 2.0).await;
    assert_eq!(
        waiting(&proxy, &tail).await.1,
        expected_eta(30, 20, 3_600_000)
    );

    // Debounced: each change counted once.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(reload_counts(&proxy).await, (2.0, 0.0));

    // A broken file, noticed by the watch, is refused like on SIGHUP; the running config stays.
    proxy.write_config_raw("admission: {batch_size: 0}\n");
    let took = await_reloads(&proxy, "error", 1.0, Duration::from_secs(3)).await;
    assert!(took.is_some(), "{}", proxy.logs());
    assert!(proxy.is_running());
    assert_eq!(
        waiting(&proxy, &tail).await.1,
        expected_eta(30, 20, 3_600_000)
    );
    assert_eq!(reloads(&proxy, "ok").await, 2.0);
}

// ---- shutdown (section 1) ------------------------------------------------------------------

/// A READY user with a slow order in flight, then `sig`: the order completes, new connections are
/// not served, the process exits 0 within the grace.
async fn graceful_stop_with_a_request_in_flight(sig: &str, delay_ms: u64) {
    let grace = Duration::from_secs(5);
    let (_redis, api, proxy) = lifecycle_room("admission: {interval: 50ms, batch_size: 10}\nshutdown: {grace: 5s}").await;
    let token = proxy.until_ready("buyer", Duration::from_secs(5)).await;
    // An idle keep-alive connection, opened and used before the signal: it has no request in
    // flight, so a stopping proxy closes it rather than wait for its next request (as nginx
    // closes idle keep-alive connections on a graceful stop).
    let mut idle = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let first = keepalive_get(&mut idle, proxy.addr()).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first:?}");
    let order = slow_order(&proxy, "buyer", &token, delay_ms);
    await_upstream_busy(&api).await;

    let signalled = Instant::now();
    proxy.signal(sig);
    // Awaited, not slept for: the listener closes (a bare connect is refused). Then a real
    // request on a new connection must not be served either.
    let closed = wait_until(
        Duration::from_secs(2),
        Duration::from_millis(10),
        || async { tokio::net::TcpStream::connect(proxy.addr()).await.is_err() },
    )
    .await;
    let closed_after = signalled.elapsed();
    assert!(
        closed,
        "SIG{sig}: new connections still accepted 2 s after the signal\n{}",
        proxy.logs()
    );
    let probe = probe_new_connection(proxy.addr(), "/catalog").await;
    let probe_at = signalled.elapsed();
    let reused = keepalive_get(&mut idle, proxy.addr()).await;
    println!(
        "SIG{sig}: a request on the idle keep-alive connection after the signal got {reused:?}"
    );
    assert!(reused.starts_with("no response"), "SIG{sig}: the idle connection was served: {reused:?}");

    let (order, order_took) = order.await.unwrap();
    let status = proxy.wait_exit(grace + Duration::from_secs(2)).await;
    let exited_after = signalled.elapsed();
    println!(
        "SIG{sig} with a {delay_ms} ms order in flight: order {:?} after {order_took:?}; \
         listener closed {closed_after:?} after the signal; new connection ~{probe_at:?} after the \
         signal: {probe:?}; exit {status:?} {exited_after:?} \
         after the signal",
        order.as_ref().map(|r| r.status)
    );
    let order = order.unwrap_or_else(|e| panic!("in-flight order failed: {e}\n{}", proxy.logs()));
    assert_eq!(order.status, 201, "{}", order.body);
    assert!(order_took >= Duration::from_millis(delay_ms));
    assert_eq!(
        code(status),
        Some(0),
        "exit {status:?} after {exited_after:?}\n{}",
        proxy.logs()
    );
    assert!(
        exited_after <= grace + Duration::from_secs(2),
        "{exited_after:?}"
    );
    assert!(
        !matches!(probe, Probe::Served(_)),
        "a new connection was served after SIG{sig}: {probe:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_in_flight_request_finish_then_exits_0() {
    graceful_stop_with_a_request_in_flight("TERM", 1500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_is_graceful_too() {
    graceful_stop_with_a_request_in_flight("INT", 800).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_nothing_in_flight_exits_at_once() {
    let (_redis, _api, proxy) = lifecycle_room("shutdown: {grace: 5s}").await;
    // An idle keep-alive connection stays open: it is not a request in flight.
    assert_eq!(proxy.enter("idle").await.status, 200);
    assert_eq!(proxy.get("/catalog").await.status, 200);
    let signalled = Instant::now();
    proxy.signal("TERM");
    let status = proxy.wait_exit(Duration::from_secs(7)).await;
    let took = signalled.elapsed();
    println!("SIGTERM with nothing in flight: exit {status:?} after {took:?} (grace 5s)");
    assert_eq!(code(status), Some(0), "{}", proxy.logs());
    assert!(
        took < Duration::from_secs(2),
        "took {took:?} with nothing in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_longer_than_the_grace_does_not_hold_the_exit() {
    let (_redis, api, proxy) = lifecycle_room("admission: {interval: 50ms, batch_size: 10}\nshutdown: {grace: 1s}").await;
    let token = proxy.until_ready("slow", Duration::from_secs(5)).await;
    let order = slow_order(&proxy, "slow", &token, 4000);
    await_upstream_busy(&api).await;
    let signalled = Instant::now();
    proxy.signal("TERM");
    let status = proxy.wait_exit(Duration::from_secs(6)).await;
    let took = signalled.elapsed();
    let (order, _) = order.await.unwrap();
    println!(
        "grace 1s, 4 s order: exit {status:?} after {took:?}; the order got {:?}",
        order.as_ref().map(|r| r.status)
    );
    assert_eq!(code(status), Some(0), "{}", proxy.logs());
    assert!(
        took >= Duration::from_millis(900),
        "exited before the grace was over: {took:?}"
    );
    assert!(
        took < Duration::from_millis(3000),
        "waited for the request: {took:?}"
    );
}

// ---- a crash (section 5) -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_a_new_proxy_keep_every_place() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    // One admission an hour: nothing leaves the line while we compare.
    let room = room_builder(&redis, &api).yaml(NO_ADMISSION);
    let first = room.start_settled(&redis.conn().await).await;
    for i in 0..8 {
        let r = first.enter(&format!("k-{i}")).await;
        assert_eq!(r.status, 200, "enter k-{i}: {}", r.body);
    }
    let mut before = Vec::new();
    for i in 0..8 {
        before.push(waiting(&first, &format!("k-{i}")).await.0);
    }
    assert_eq!(before, (1..=8).collect::<Vec<u64>>());
    first.kill();
    assert!(!first.is_running());

    let second = room.start().await;
    let mut after = Vec::new();
    for i in 0..8 {
        after.push(waiting(&second, &format!("k-{i}")).await.0);
    }
    println!("positions before the crash {before:?}, after {after:?}");
    assert_eq!(after, before);
    // Entering again keeps the place; a newcomer goes to the back.
    assert_eq!(second.enter("k-3").await.json()["position"], 4);
    assert_eq!(second.enter("newcomer").await.json()["position"], 9);
}
