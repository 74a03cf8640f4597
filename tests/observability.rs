//! Observability (issue 3, contract section 4): what `/metrics` says after a scripted session,
//! whether the Grafana dashboard only asks for metrics the proxy exports, whether `promtool`
//! accepts the exposition and the dashboard's PromQL, whether the alerting rules
//! (dashboards/alerts.yaml, issue 19) pass `promtool` and their unit tests and watch only metrics
//! the proxy exports, and that entry tokens stay out of the logs.
//!
//! Every test runs its own Redis, demo API and proxy on free ports, so counters start at zero and
//! "moved by" is the exported value itself.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

const POLL: Duration = Duration::from_millis(20);
/// Room-wide gauges are at most 1 s old (contract, section 4); the rest is scrape slack.
const GAUGE_FRESH: Duration = Duration::from_millis(1500);
/// Metrics are recorded in pingora's `logging` phase, just after the response went out: a scrape
/// right after the client's last byte may still miss that request.
const SETTLE: Duration = Duration::from_secs(3);

// ---- the exposition, parsed ---------------------------------------------------------------------

/// One sample line of the text exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Every sample line of `text` (comments skipped). Panics on a line it cannot read: the format
/// is the contract, so an unreadable line is a failure of its own.
fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| parse_sample(l).unwrap_or_else(|| panic!("unreadable sample line: {l:?}")))
        .collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| c == '{' || c == ' ')?;
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let close;
        loop {
            // label name up to '='
            let (start, c) = chars.next()?;
            if c == '}' {
                close = start;
                break;
            }
            let mut key = String::from(c);
            loop {
                let (_, c) = chars.next()?;
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    '"' => break,
                    other => value.push(other),
                }
            }
            labels.insert(key.trim().to_owned(), value);
            if chars.peek().map(|&(_, c)| c) == Some(',') {
                chars.next();
            }
        }
        rest = &body[close + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `name{labels}` exactly (no other labels); 0 when the series is absent, as a labelled series
/// appears only once it first occurs.
/// A series' value; one that names no `room` is the sum over the rooms, as `sum without (room)`
/// reads it (this file's proxies run the one room `default`; a request that belongs to no room,
/// a pass-through, is counted under `room=""`).
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    samples
        .iter()
        .filter(|s| s.name == name && without_room(s, &want) == want)
        .map(|s| s.value)
        .sum()
}

/// A sample's labels, less `room` unless `want` names it.
fn without_room(sample: &Sample, want: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut labels = sample.labels.clone();
    if !want.contains_key("room") {
        labels.remove("room");
    }
    labels
}

/// The values one label takes on a family, with their sample values.
fn by_label(samples: &[Sample], name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut values = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name) {
        if let Some(v) = s.labels.get(label) {
            *values.entry(v.clone()).or_insert(0.0) += s.value;
        }
    }
    values
}

/// Family name -> type, from the `# TYPE` lines.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.strip_prefix("# TYPE ")?.split_whitespace();
            Some((it.next()?.to_owned(), it.next()?.to_owned()))
        })
        .collect()
}

/// Polls `/metrics` until `ok` holds for its samples, then returns that scrape; on timeout,
/// returns the last scrape so the caller's assertions name what differs.
async fn scrape_until(proxy: &Proxy, timeout: Duration, ok: impl Fn(&[Sample]) -> bool) -> String {
    let last = std::sync::Mutex::new(String::new());
    wait_until(timeout, POLL, || {
        let (last, ok) = (&last, &ok);
        async move {
            let text = proxy.metrics().await;
            let done = ok(&samples(&text));
            *last.lock().unwrap() = text;
            done
        }
    })
    .await;
    last.into_inner().unwrap()
}

/// One expected value of a series, with its description for the failure message.
#[derive(Clone)]
struct Expect {
    name: &'static str,
    labels: Vec<(&'static str, &'static str)>,
    value: f64,
}

fn exp(name: &'static str, labels: &[(&'static str, &'static str)], value: f64) -> Expect {
    Expect {
        name,
        labels: labels.to_vec(),
        value,
    }
}

/// One expected value per `(label value, value)` of `family`'s `label`.
fn by(family: &'static str, label: &'static str, values: &[(&'static str, f64)]) -> Vec<Expect> {
    values
        .iter()
        .map(|&(v, n)| exp(family, &[(label, v)], n))
        .collect()
}

fn mismatches(samples: &[Sample], expected: &[Expect]) -> Vec<String> {
    expected
        .iter()
        .filter_map(|e| {
            let got = value(samples, e.name, &e.labels);
            (got != e.value)
                .then(|| format!("{}{:?}: expected {}, got {got}", e.name, e.labels, e.value))
        })
        .collect()
}

/// `user`'s status is READY: its token.
async fn ready_token(proxy: &Proxy, user: &str) -> String {
    let r = proxy.status(user).await;
    assert_eq!(status_of(&r), "READY", "{user}: {}", r.body);
    r.json()["token"].as_str().unwrap().to_owned()
}

/// A protected order as `user` with `token` that the demo API answers with `status`.
async fn order_failing(proxy: &Proxy, user: &str, token: &str, status: u16) -> Resp {
    let req = proxy.order_request(user, Some(token));
    send(req.header("X-Demo-Fail", status.to_string())).await
}

/// Scrapes until every expected value holds, within `timeout`; fails naming those that do not.
/// Returns the last scrape.
async fn assert_metrics(proxy: &Proxy, timeout: Duration, expected: &[Expect]) -> String {
    let text = scrape_until(proxy, timeout, |s| mismatches(s, expected).is_empty()).await;
    let wrong = mismatches(&samples(&text), expected);
    assert!(
        wrong.is_empty(),
        "off after {timeout:?}:\n  {}\n\n{text}",
        wrong.join("\n  ")
    );
    text
}

/// Checks one histogram family for one `endpoint`: cumulative `_bucket` series with `le` labels
/// ending in `+Inf`, `_sum` and `_count`, count == `count`.
fn check_histogram(samples: &[Sample], family: &str, endpoint: &str, count: f64) {
    let bucket = format!("{family}_bucket");
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| {
            s.name == bucket && s.labels.get("endpoint").map(String::as_str) == Some(endpoint)
        })
        .map(|s| {
            let room = if endpoint == "passthrough" { "" } else { "default" };
            assert_eq!(s.labels.get("room").map(String::as_str), Some(room), "{bucket}'s room: {s:?}");
            assert_eq!(
                s.labels.len(),
                3,
                "{bucket} labels are endpoint, le and room: {s:?}"
            );
            let le = s
                .labels
                .get("le")
                .unwrap_or_else(|| panic!("{bucket} without le: {s:?}"));
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().expect("le is a number")
            };
            (le, s.value)
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(
        buckets.len() >= 3,
        "{bucket}{{endpoint={endpoint:?}}}: too few buckets: {buckets:?}"
    );
    assert_eq!(
        buckets.last().unwrap().0,
        f64::INFINITY,
        "{bucket}{{endpoint={endpoint:?}}} has no le=\"+Inf\""
    );
    assert!(
        buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "{bucket}{{endpoint={endpoint:?}}} is not cumulative: {buckets:?}"
    );
    let labels = [("endpoint", endpoint)];
    let n = value(samples, &format!("{family}_count"), &labels);
    let sum = value(samples, &format!("{family}_sum"), &labels);
    assert_eq!(n, count, "{family}_count{{endpoint={endpoint:?}}}");
    assert_eq!(
        buckets.last().unwrap().1,
        n,
        "{family} +Inf bucket == count for {endpoint}"
    );
    assert!(
        samples.iter().any(|s| s.name == format!("{family}_sum")
            && s.labels.get("endpoint").map(String::as_str) == Some(endpoint)),
        "{family}_sum{{endpoint={endpoint:?}}} missing"
    );
    assert!(
        sum.is_finite() && sum > 0.0,
        "{family}_sum{{endpoint={endpoint:?}}} = {sum}"
    );
    // Each request took well under the scripted session's length.
    assert!(
        sum < 30.0 * count,
        "{family}_sum{{endpoint={endpoint:?}}} = {sum} for {count} requests"
    );
}

// ---- the scripted session -----------------------------------------------------------------------

/// enters, a FULL, polls, admission, forbidden / unauthenticated / forwarded protected requests, a
/// 4xx from upstream, a consumed token, a pass-through, reloads, and finally a dead Redis; then
/// each counter must have moved by exactly its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_session_moves_each_counter_by_exactly_its_share() {
    let (mut redis, _api, proxy) = room(
        &["--service-time-ms", "1"],
        "admission: {interval: 1h, batch_size: 2}\nqueue: {capacity: 2}\nredis: {timeout: 300ms}",
    )
    .await;
    let Keys {
        queue: queue_key,
        next_admission: schedule_key,
        ..
    } = keys(&proxy);
    let mut conn = redis.conn().await;

    // Hold admission so the line stays as scripted: the interval is an hour, so after the first
    // (idle) tick at start-up the next batch is due in an hour; the schedule key is pushed far
    // out too (admit.lua re-anchors it to one interval). Wait for the ticker's first write so the
    // SET ... GET can prove this is the key the ticker uses.
    let ticked = scrape_until(&proxy, Duration::from_secs(5), |s| {
        value(s, "waitroom_admission_ticks_total", &[("result", "idle")]) >= 1.0
    })
    .await;
    assert!(
        value(
            &samples(&ticked),
            "waitroom_admission_ticks_total",
            &[("result", "idle")]
        ) >= 1.0,
        "no admission tick within 5 s:\n{ticked}"
    );
    let previous: Option<String> = redis::cmd("SET")
        .arg(&schedule_key)
        .arg("9000000000000000")
        .arg("GET")
        .query_async(&mut conn)
        .await
        .expect("SET schedule");
    assert!(
        previous.is_some(),
        "{schedule_key} did not exist: the admission schedule key moved; update this test"
    );

    let fixed = [
        exp("waitroom_admission_rate_per_second", &[], 2.0 / 3600.0),
        exp("waitroom_admission_batch", &[], 2.0),
        exp("waitroom_redis_up", &[], 1.0),
        exp("waitroom_admitted_total", &[], 0.0),
        exp("waitroom_redis_errors_total", &[], 0.0),
    ];
    // The room watcher's first probe may still be on its way.
    assert_metrics(&proxy, GAUGE_FRESH, &fixed).await;
    assert_eq!(proxy.readyz().await, 200);
    assert_eq!(
        send(proxy.client().get(proxy.metrics_url("/healthz")))
            .await
            .status,
        200
    );

    // enters: queued x2, already_waiting, full
    for (user, position) in [("alice", 1), ("bob", 2), ("alice", 1)] {
        let r = proxy.enter(user).await;
        assert_eq!(
            (r.status, r.json()["position"].as_u64()),
            (200, Some(position)),
            "{user}: {}",
            r.body
        );
    }
    assert_full("carol", &proxy.enter("carol").await, 30);
    // polls: WAITING, NOT_IN_QUEUE
    let r = proxy.status("alice").await;
    assert_eq!(status_of(&r), "WAITING", "{}", r.body);
    let r = proxy.status("dave").await;
    assert_eq!(status_of(&r), "NOT_IN_QUEUE", "{}", r.body);

    // The room-wide gauges follow the real line within about a second.
    assert_eq!(zcard(&mut conn, &queue_key).await, 2, "the line in Redis");
    // 2 waiting with a batch of 2: the tail is within the first batch, so 0 s; no token yet.
    assert_metrics(
        &proxy,
        GAUGE_FRESH,
        &[
            exp("waitroom_queue_length", &[], 2.0),
            exp("waitroom_queue_tail_wait_seconds", &[], 0.0),
            exp("waitroom_active_tokens", &[], 0.0),
        ],
    )
    .await;

    // Release admission: with the schedule gone the ticker (which wakes at least once a second)
    // finds a batch due and admits both.
    let _: () = redis::cmd("DEL")
        .arg(&schedule_key)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    assert_metrics(
        &proxy,
        Duration::from_secs(5),
        &[exp("waitroom_admitted_total", &[], 2.0)],
    )
    .await;
    assert_eq!(
        zcard(&mut conn, &queue_key).await,
        0,
        "the line in Redis after admission"
    );
    let text = assert_metrics(
        &proxy,
        GAUGE_FRESH,
        &[
            exp("waitroom_queue_length", &[], 0.0),
            exp("waitroom_active_tokens", &[], 2.0),
        ],
    )
    .await;
    let s = samples(&text);
    assert!(
        value(
            &s,
            "waitroom_admission_ticks_total",
            &[("result", "admitted")]
        ) >= 1.0,
        "{text}"
    );

    // READY x2, and enter of a user holding a token
    let (token_a, token_b) = (
        ready_token(&proxy, "alice").await,
        ready_token(&proxy, "bob").await,
    );
    assert_status_is(&proxy.enter("alice").await, 200, "READY");

    // protected: forbidden (wrong token), unauthenticated (no identity)
    let r = proxy.order("alice", Some(&token_b)).await;
    assert_eq!(r.status, 403, "bob's token for alice: {}", r.body);
    let r = send(
        proxy
            .client()
            .post(proxy.url("/api/orders"))
            .header("X-Entry-Token", &token_a)
            .body("{}"),
    )
    .await;
    assert_eq!(r.status, 401, "no identity: {}", r.body);
    // forwarded, upstream 409: token kept
    let r = order_failing(&proxy, "alice", &token_a, 409).await;
    assert_eq!(
        r.status, 409,
        "the upstream's 409 passes through: {}",
        r.body
    );
    let r = proxy.status("alice").await;
    assert_eq!(
        (status_of(&r).as_str(), r.json()["token"].as_str()),
        ("READY", Some(token_a.as_str())),
        "a 4xx keeps the token: {}",
        r.body
    );
    // forwarded, upstream 2xx: token consumed; a repeat is forbidden
    let r = proxy.order("alice", Some(&token_a)).await;
    assert!(
        (200..300).contains(&r.status),
        "order with a valid token: {} {}",
        r.status,
        r.body
    );
    let r = proxy.order("alice", Some(&token_a)).await;
    assert_eq!(r.status, 403, "a spent token: {}", r.body);
    let r = proxy.status("alice").await;
    assert_eq!(status_of(&r), "NOT_IN_QUEUE", "{}", r.body);
    // pass-through
    let r = proxy.get("/hello?x=1").await;
    assert_eq!(r.status, 200, "pass-through: {}", r.body);
    // bob's token is live.
    assert_metrics(
        &proxy,
        GAUGE_FRESH,
        &[exp("waitroom_active_tokens", &[], 1.0)],
    )
    .await;

    // reloads: one accepted, one refused
    proxy.rewrite_config("queue: {retry_after: 20s}");
    proxy.signal("HUP");
    let reloaded = by("waitroom_config_reloads_total", "result", &[("ok", 1.0)]);
    assert_metrics(&proxy, Duration::from_secs(5), &reloaded).await;
    proxy.write_config_raw("admission: [this, is, not, a, mapping]\n");
    proxy.signal("HUP");
    // And no Redis error while Redis runs.
    assert_metrics(
        &proxy,
        Duration::from_secs(5),
        &[
            exp("waitroom_config_reloads_total", &[("result", "error")], 1.0),
            exp("waitroom_redis_errors_total", &[], 0.0),
        ],
    )
    .await;

    // Redis goes away: readiness, the up gauge, and one error of each request kind.
    redis.stop();
    assert_metrics(
        &proxy,
        Duration::from_secs(2),
        &[exp("waitroom_redis_up", &[], 0.0)],
    )
    .await;
    assert_eq!(proxy.readyz().await, 503);
    let r = proxy.enter("erin").await;
    assert_eq!(r.status, 503, "enter without Redis: {}", r.body);
    let r = proxy.status("erin").await;
    assert_eq!(r.status, 503, "status without Redis: {}", r.body);
    let r = proxy.order("bob", Some(&token_b)).await;
    assert_eq!(
        r.status, 503,
        "protected without Redis (fail closed): {}",
        r.body
    );

    let expected: Vec<Expect> = [
        by(
            "waitroom_enter_total",
            "result",
            &[
                ("queued", 2.0),
                ("already_waiting", 1.0),
                ("full", 1.0),
                ("ready", 1.0),
                ("error", 1.0),
            ],
        ),
        by(
            "waitroom_status_total",
            "status",
            &[
                ("WAITING", 1.0),
                ("READY", 3.0),
                ("NOT_IN_QUEUE", 2.0),
                ("error", 1.0),
            ],
        ),
        vec![exp("waitroom_admitted_total", &[], 2.0)],
        vec![exp("waitroom_tokens_consumed_total", &[], 1.0)],
        vec![exp("waitroom_abandoned_total", &[], 0.0)],
        by(
            "waitroom_protected_requests_total",
            "result",
            &[
                ("forbidden", 2.0),
                ("unauthenticated", 1.0),
                ("forwarded", 2.0),
                ("unavailable", 1.0),
            ],
        ),
        by(
            "waitroom_upstream_responses_total",
            "class",
            &[("2xx", 2.0), ("4xx", 1.0)],
        ),
        by(
            "waitroom_config_reloads_total",
            "result",
            &[("ok", 1.0), ("error", 1.0)],
        ),
        by(
            "waitroom_request_duration_seconds_count",
            "endpoint",
            &[
                ("enter", 6.0),
                ("status", 7.0),
                ("protected", 6.0),
                ("passthrough", 1.0),
            ],
        ),
        by(
            "waitroom_upstream_duration_seconds_count",
            "endpoint",
            &[("protected", 2.0), ("passthrough", 1.0)],
        ),
    ]
    .concat();
    let text = assert_metrics(&proxy, SETTLE, &expected).await;
    let s = samples(&text);

    // No other label value moved (e.g. no "limited", no upstream "error" class).
    let labelled = [
        (
            "waitroom_enter_total",
            "result",
            &["already_waiting", "error", "full", "queued", "ready"][..],
        ),
        (
            "waitroom_status_total",
            "status",
            &["NOT_IN_QUEUE", "READY", "WAITING", "error"][..],
        ),
        (
            "waitroom_protected_requests_total",
            "result",
            &["forbidden", "forwarded", "unauthenticated", "unavailable"][..],
        ),
        (
            "waitroom_upstream_responses_total",
            "class",
            &["2xx", "4xx"][..],
        ),
        (
            "waitroom_config_reloads_total",
            "result",
            &["error", "ok"][..],
        ),
    ];
    for (family, label, values) in labelled {
        let seen: Vec<String> = by_label(&s, family, label).into_keys().collect();
        assert_eq!(seen, values.to_vec(), "{family} {label} values:\n{text}");
    }
    // The three request failures count as Redis errors; the admission ticker's failed ticks count
    // too, so "at least".
    let redis_errors = value(&s, "waitroom_redis_errors_total", &[]);
    assert!(
        redis_errors >= 3.0,
        "waitroom_redis_errors_total = {redis_errors}:\n{text}"
    );
    assert_eq!(value(&s, "waitroom_redis_up", &[]), 0.0);

    // Histograms: buckets with le (incl. +Inf), _sum, _count == requests made of each kind.
    for (endpoint, n) in [
        ("enter", 6.0),
        ("status", 7.0),
        ("protected", 6.0),
        ("passthrough", 1.0),
    ] {
        check_histogram(&s, "waitroom_request_duration_seconds", endpoint, n);
    }
    for (endpoint, n) in [("protected", 2.0), ("passthrough", 1.0)] {
        check_histogram(&s, "waitroom_upstream_duration_seconds", endpoint, n);
    }
    let fams = families(&text);
    let kinds: [(&str, &[&str]); 3] = [
        ("gauge", &["waitroom_queue_length", "waitroom_admission_batch", "waitroom_active_tokens"]),
        (
            "counter",
            &[
                "waitroom_enter_total",
                "waitroom_status_total",
                "waitroom_admitted_total",
                "waitroom_tokens_consumed_total",
                "waitroom_protected_requests_total",
                "waitroom_upstream_responses_total",
                "waitroom_redis_errors_total",
                "waitroom_config_reloads_total",
                "waitroom_abandoned_total",
            ],
        ),
        ("histogram", &["waitroom_request_duration_seconds"]),
    ];
    for (kind, families) in kinds {
        for family in families {
            assert_eq!(fams.get(*family).map(String::as_str), Some(kind), "# TYPE of {family}");
        }
    }
}

// ---- upstream classes and the page, end to end ---------------------------------------------------

/// Each class of `waitroom_upstream_responses_total` counts exactly the responses of its class,
/// pass-through and protected alike (the demo API answers with the status asked for), and the
/// waiting page is timed under `endpoint="page"` (section 4). The "error" class (upstream
/// unreachable) is checked in admission_tokens.rs, where a proxy's upstream refuses connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_classes_and_the_page_are_counted_end_to_end() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--service-time-ms", "1"]);
    let proxy = Proxy::builder(&redis.url(), api.addr()).start().await;
    // Pass-through: the echo answers X-Echo-Status.
    for (status, times) in [(200u16, 1), (302, 2), (404, 1), (503, 3)] {
        for _ in 0..times {
            let r = send(
                proxy
                    .client()
                    .get(proxy.url("/echo-me"))
                    .header("X-Echo-Status", status.to_string()),
            )
            .await;
            assert_eq!(r.status, status, "pass-through {status}: {}", r.body);
        }
    }
    // Protected: a forced 500 keeps the token, then a 201 spends it.
    let token = proxy.until_ready("classy", Duration::from_secs(5)).await;
    let r = order_failing(&proxy, "classy", &token, 500).await;
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(proxy.order("classy", Some(&token)).await.status, 201);
    // The page, twice.
    for _ in 0..2 {
        let r = proxy.get("/queue/").await;
        assert_eq!(r.status, 200);
        assert!(r
            .header("content-type")
            .unwrap_or("")
            .starts_with("text/html"));
    }

    let expected: Vec<Expect> = [
        by(
            "waitroom_upstream_responses_total",
            "class",
            &[("2xx", 2.0), ("3xx", 2.0), ("4xx", 1.0), ("5xx", 4.0)],
        ),
        by(
            "waitroom_request_duration_seconds_count",
            "endpoint",
            &[("page", 2.0), ("passthrough", 7.0), ("protected", 2.0)],
        ),
    ]
    .concat();
    let text = assert_metrics(&proxy, SETTLE, &expected).await;
    let s = samples(&text);
    let classes: Vec<String> = by_label(&s, "waitroom_upstream_responses_total", "class")
        .into_keys()
        .collect();
    assert_eq!(
        classes,
        ["2xx", "3xx", "4xx", "5xx"],
        "no error class without an error:\n{text}"
    );
    check_histogram(&s, "waitroom_request_duration_seconds", "page", 2.0);
}

// ---- a proxy that has seen every kind of traffic ------------------------------------------------

/// A running proxy after traffic that creates a series in every labelled family the proxy
/// registers (the prometheus crate prints no `# HELP`/`# TYPE` for a family without series):
/// enter, status, a forwarded and a forbidden protected request, a pass-through, a reload.
async fn busy_proxy() -> (RedisServer, DemoApi, Proxy, String) {
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--service-time-ms", "1"]);
    let proxy = Proxy::builder(&redis.url(), api.addr()).start().await;
    let token = proxy.until_ready("dash", Duration::from_secs(5)).await;
    assert!((200..300).contains(&proxy.order("dash", Some(&token)).await.status));
    assert_eq!(proxy.order("dash", Some(&token)).await.status, 403);
    assert_eq!(proxy.get("/anything").await.status, 200);
    // A reload into shadow mode, and a tokenless order it lets through: the shadow counter's series.
    proxy.rewrite_config("mode: shadow");
    proxy.signal("HUP");
    let shadowed = wait_until(Duration::from_secs(5), Duration::from_millis(20), || async {
        (200..300).contains(&proxy.order("dash", None).await.status)
    })
    .await;
    assert!(shadowed, "mode: shadow not in force after the reload");
    let labelled = [
        "waitroom_shadow_passed_total",
        "waitroom_enter_total",
        "waitroom_status_total",
        "waitroom_admission_ticks_total",
        "waitroom_protected_requests_total",
        "waitroom_upstream_responses_total",
        "waitroom_request_duration_seconds",
        "waitroom_upstream_duration_seconds",
        "waitroom_config_reloads_total",
    ];
    let text = scrape_until(&proxy, Duration::from_secs(5), |s| {
        labelled
            .iter()
            .all(|f| s.iter().any(|x| x.name.starts_with(*f)))
            && value(
                s,
                "waitroom_upstream_duration_seconds_count",
                &[("endpoint", "passthrough")],
            ) == 1.0
    })
    .await;
    let fams = families(&text);
    let all_there = labelled.iter().all(|f| fams.contains_key(*f));
    assert!(
        all_there,
        "not every labelled family has a series after the traffic:\n{text}"
    );
    (redis, api, proxy, text)
}

/// Every metric that describes a room carries `room` (contract sections 4 and 17), `default` for a
/// configuration without `rooms`; a request that belongs to no room (a pass-through) is counted
/// under `room=""`, which Prometheus reads as no label; the proxy-wide metrics carry none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_room_metric_carries_the_room_label() {
    let (_redis, _api, _proxy, text) = busy_proxy().await;
    let s = samples(&text);
    let room_families = [
        "waitroom_queue_length",
        "waitroom_queue_tail_wait_seconds",
        "waitroom_active_tokens",
        "waitroom_admission_batch",
        "waitroom_admission_rate_per_second",
        "waitroom_admission_estimate_rate_per_second",
        "waitroom_room_state",
        "waitroom_room_state_changed_timestamp_seconds",
        "waitroom_enter_total",
        "waitroom_status_total",
        "waitroom_admitted_total",
        "waitroom_admission_ticks_total",
        "waitroom_abandoned_total",
        "waitroom_tokens_consumed_total",
        "waitroom_protected_requests_total",
        "waitroom_shadow_passed_total",
        "waitroom_held_polls",
        "waitroom_held_ready_delay_seconds",
        "waitroom_event_phase",
        "waitroom_event_prequeued",
        "waitroom_event_drawn",
    ];
    let per_request = ["waitroom_upstream_responses_total", "waitroom_request_duration_seconds", "waitroom_upstream_duration_seconds"];
    let proxy_wide = [
        "waitroom_redis_errors_total",
        "waitroom_redis_up",
        "waitroom_config_reloads_total",
        "waitroom_open_connections",
        "waitroom_log_lines_dropped_total",
    ];
    let family_of = |name: &str| -> Option<&'static str> {
        room_families
            .iter()
            .chain(&per_request)
            .chain(&proxy_wide)
            .copied()
            .filter(|f| name == *f || ["_bucket", "_sum", "_count"].iter().any(|x| name.strip_suffix(x) == Some(*f)))
            .max_by_key(|f| f.len())
    };
    for family in room_families.iter().chain(&proxy_wide) {
        assert!(s.iter().any(|x| family_of(&x.name) == Some(*family)), "no series of {family}:\n{text}");
    }
    for sample in &s {
        let room = sample.labels.get("room").map(String::as_str);
        match family_of(&sample.name) {
            Some(f) if room_families.contains(&f) => assert_eq!(room, Some("default"), "{sample:?}"),
            Some(f) if per_request.contains(&f) => {
                // The order and the refused repeat are the room's; the pass-through is nobody's.
                let passthrough = sample.labels.get("endpoint").map(String::as_str) == Some("passthrough")
                    || (f == "waitroom_upstream_responses_total" && room == Some(""));
                assert_eq!(room, Some(if passthrough { "" } else { "default" }), "{sample:?}");
            }
            Some(_) => assert_eq!(room, None, "a proxy-wide metric names no room: {sample:?}"),
            None => {}
        }
    }
    // The protected order's response is the room's, the pass-through's is not.
    let responses: Vec<_> = s.iter().filter(|x| x.name == "waitroom_upstream_responses_total").collect();
    for room in ["default", ""] {
        assert!(
            responses.iter().any(|x| x.labels.get("room").map(String::as_str) == Some(room) && x.value >= 1.0),
            "no upstream response counted under room={room:?}: {responses:?}"
        );
    }
}

/// The operator endpoints serve GET only, and say so: any other method gets 405 with
/// `Allow: GET` (RFC 9110 makes `Allow` part of a 405; schemathesis found it missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_endpoints_answer_other_methods_with_405_and_allow() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = Proxy::builder(&redis.url(), api.addr()).start().await;
    for path in ["/metrics", "/healthz", "/readyz"] {
        for method in ["POST", "PUT", "DELETE", "PATCH", "TRACE"] {
            let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let r = send(proxy.client().request(method.clone(), proxy.metrics_url(path))).await;
            assert_eq!(
                (r.status, r.header("allow")),
                (405, Some("GET")),
                "{method} {path}: {}",
                r.body
            );
        }
    }
}

// ---- the dashboard ------------------------------------------------------------------------------

fn dashboard() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/waitroom.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

/// Every non-row panel, rows' nested (collapsed) panels included.
fn leaf_panels(panels: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
    for p in panels.as_array().into_iter().flatten() {
        if let Some(nested) = p.get("panels") {
            leaf_panels(nested, out);
        }
        if p["type"] != "row" {
            out.push(p.clone());
        }
    }
}

/// (where, expr) for every target of every panel, and the templating queries.
fn dashboard_queries(d: &serde_json::Value) -> Vec<(String, String)> {
    let mut panels = Vec::new();
    leaf_panels(&d["panels"], &mut panels);
    let mut out = Vec::new();
    for p in &panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push((
                    format!("panel {:?} target {}", p["title"], t["refId"]),
                    expr.to_owned(),
                ));
            }
        }
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        for q in [&v["definition"], &v["query"], &v["query"]["query"]] {
            if let Some(q) = q.as_str().filter(|_| v["type"] == "query") {
                out.push((format!("variable {:?}", v["name"]), q.to_owned()));
            }
        }
    }
    out
}

/// Identifiers matching `waitroom_[a-z0-9_]+` in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let bytes = expr.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = expr[i..].find("waitroom_") {
        let start = i + at;
        let boundary = start == 0
            || !(bytes[start - 1].is_ascii_alphanumeric()
                || bytes[start - 1] == b'_'
                || bytes[start - 1] == b':');
        let mut end = start + "waitroom_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        if boundary && end > start + "waitroom_".len() {
            names.insert(expr[start..end].to_owned());
        }
        i = end;
    }
    names
}

#[test]
fn metric_names_are_extracted_from_promql() {
    let names = metric_names(
        r#"histogram_quantile(0.95, sum by (le, endpoint) (rate(waitroom_request_duration_seconds_bucket{job=~"$job"}[$__rate_interval]))) / max(waitroom_queue_length) + x_waitroom_not"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec![
            "waitroom_queue_length",
            "waitroom_request_duration_seconds_bucket"
        ]
    );
}

/// The dashboard is importable as is: a Prometheus datasource variable that every panel and
/// target uses, unique panel ids, a description on every panel, the panels the issue asks for.
#[test]
fn dashboard_is_well_formed() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion: {}",
        d["schemaVersion"]
    );
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(
        d.get("__inputs").is_none(),
        "no import-time inputs: the datasource is a variable"
    );
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter().any(|v| v["type"] == "datasource"
            && v["name"] == "datasource"
            && v["query"] == "prometheus"),
        "a Prometheus datasource variable named datasource"
    );
    let mut panels = Vec::new();
    leaf_panels(&d["panels"], &mut panels);
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap().iter().chain(panels.iter()) {
        ids.insert(
            p["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("panel without id: {}", p["title"])),
        );
    }
    let rows = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .count();
    assert_eq!(ids.len(), panels.len() + rows, "panel ids are unique");
    assert!(rows >= 3, "panels are grouped in rows");
    for p in &panels {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "panel without title: {p}");
        assert!(
            p["description"].as_str().is_some_and(|s| s.len() > 20),
            "panel {title:?} has no description"
        );
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {title:?} datasource"
        );
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("panel {title:?} has no targets"));
        assert!(!targets.is_empty(), "panel {title:?} has no targets");
        for t in targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {title:?}: empty expr"
            );
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "panel {title:?} target datasource"
            );
        }
    }
    let used: BTreeSet<String> = dashboard_queries(&d)
        .iter()
        .flat_map(|(_, e)| metric_names(e))
        .collect();
    for wanted in [
        "waitroom_queue_length",
        "waitroom_admitted_total",
        "waitroom_admission_rate_per_second",
        "waitroom_admission_batch",
        "waitroom_enter_total",
        "waitroom_status_total",
        "waitroom_queue_tail_wait_seconds",
        "waitroom_active_tokens",
        "waitroom_tokens_consumed_total",
        "waitroom_protected_requests_total",
        "waitroom_upstream_responses_total",
        "waitroom_request_duration_seconds_bucket",
        "waitroom_upstream_duration_seconds_bucket",
        "waitroom_redis_errors_total",
        "waitroom_redis_up",
        "waitroom_config_reloads_total",
        "waitroom_admission_ticks_total",
    ] {
        assert!(
            used.contains(wanted),
            "the dashboard no longer shows {wanted}"
        );
    }
}

/// The dashboard can never rot silently: every metric its queries name is exported by a running
/// proxy (checked against the `# TYPE` lines of a real scrape; `_bucket`/`_sum`/`_count` only on
/// histogram families).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_uses_only_metrics_the_proxy_exports() {
    let d = dashboard();
    let queries = dashboard_queries(&d);
    assert!(queries.len() >= 15, "too few queries found: {queries:?}");
    let (problems, exported) = unexported_in(&queries).await;
    assert!(
        problems.is_empty(),
        "dashboard problems:\n  {}\n\nexported families: {exported:?}",
        problems.join("\n  "),
    );
}

/// What is wrong with the metrics that `exprs` (each after where it stands) name, against a busy
/// proxy's scrape: an expression naming no waitroom_ metric, or a metric not exported (see
/// [`unexported`]). Also the families the scrape had, for the failure message.
async fn unexported_in(exprs: &[(String, String)]) -> (Vec<String>, Vec<String>) {
    let (_redis, _api, _proxy, text) = busy_proxy().await;
    let fams = families(&text);
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics.rs"))
        .unwrap_or_default();
    let mut problems = Vec::new();
    for (place, expr) in exprs {
        let names = metric_names(expr);
        if names.is_empty() {
            problems.push(format!("{place}: names no waitroom_ metric: {expr}"));
        }
        for name in names {
            if let Some(p) = unexported(&name, &fams, &source) {
                problems.push(format!("{place}: {name} {p}"));
            }
        }
    }
    (problems, fams.into_keys().collect())
}

/// What is wrong with querying `name`, given the families of a busy proxy's scrape (`fams`) and
/// the text of src/metrics.rs; None when the proxy exports it (`_bucket`/`_sum`/`_count` only on
/// histogram families).
fn unexported(name: &str, fams: &BTreeMap<String, String>, source: &str) -> Option<String> {
    let histogram_part = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .filter(|base| fams.get(*base).map(String::as_str) == Some("histogram"));
    match (fams.get(name).map(String::as_str), histogram_part) {
        (Some("histogram"), _) => Some("is a histogram: query its _bucket, _sum or _count".to_owned()),
        (Some(_), _) | (None, Some(_)) => None,
        (None, None) if source.contains(&format!("\"{name}\"")) => Some(
            "is registered in src/metrics.rs but had no series after busy_proxy's traffic: extend that traffic".to_owned(),
        ),
        (None, None) => Some("is not exported by the proxy".to_owned()),
    }
}

// ---- promtool -----------------------------------------------------------------------------------

/// Runs `promtool ARGS`, feeding `stdin`; fails loudly when promtool is not installed.
fn promtool(args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}). It is part of Debian's `prometheus` package: \
                 apt-get install -y prometheus"
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin)
        .expect("write to promtool");
    child.wait_with_output().expect("wait for promtool")
}

/// `promtool check metrics` accepts the names, help texts and types of a busy proxy's exposition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_exposition() {
    let (_redis, _api, _proxy, text) = busy_proxy().await;
    let out = promtool(&["check", "metrics"], text.as_bytes());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics ({}):\n{said}\n--- exposition ---\n{text}",
        out.status
    );
}

/// Every dashboard query is valid PromQL (`promtool check rules` on a rule per query, the
/// Grafana variables replaced by what they expand to).
#[test]
fn dashboard_queries_are_valid_promql() {
    let d = dashboard();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dashboard-rules.yml");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let queries = dashboard_queries(&d);
    for (i, (_, expr)) in queries.iter().enumerate() {
        if expr.starts_with("label_values(") {
            continue; // Grafana's variable function, not PromQL
        }
        let expr = expr
            .replace("$__rate_interval", "1m")
            .replace("$__interval", "1m")
            .replace("$__range", "1h")
            .replace("$job", ".*")
            .replace("$instance", ".*");
        let quoted = serde_json::to_string(&expr).unwrap(); // a JSON string is a YAML string
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {quoted}\n"
        ));
    }
    std::fs::write(&path, &rules).expect("write rules");
    let out = promtool(&["check", "rules", path.to_str().unwrap()], b"");
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}\n--- rules ---\n{rules}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- the alerting rules -------------------------------------------------------------------------

const ALERTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/alerts.yaml");
const ALERT_TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/alerts.test.yaml");

fn yaml_file(path: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

/// (alert name, expr) of every alerting rule in dashboards/alerts.yaml.
fn alert_rules() -> Vec<(String, String)> {
    let rules = yaml_file(ALERTS);
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            if let Some(name) = rule["alert"].as_str() {
                let expr = rule["expr"].as_str().expect("expr").to_owned();
                alerts.push((name.to_owned(), expr));
            }
        }
    }
    alerts
}

/// `promtool check rules` accepts dashboards/alerts.yaml and `promtool test rules` passes its
/// unit tests, in which every alert has a case where it fires and one where it stays quiet.
#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let alerts = alert_rules();
    let names: BTreeSet<&str> = alerts.iter().map(|(n, _)| n.as_str()).collect();
    for wanted in [
        "WaitroomRedisDown",
        "WaitroomLineNearCapacity",
        "WaitroomAdmissionStalled",
        "WaitroomUpstreamSlow",
        "WaitroomConfigReloadFailing",
    ] {
        assert!(
            names.contains(wanted),
            "{ALERTS} has no {wanted}: {names:?}"
        );
    }

    // Which alerts the unit tests see firing, and which they see quiet.
    let tests = yaml_file(ALERT_TESTS);
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for test in tests["tests"].as_sequence().expect("tests") {
        for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
            let seen = if expected > 0 { &mut fires } else { &mut quiet };
            seen.insert(name);
        }
    }
    for name in &names {
        assert!(
            fires.contains(*name),
            "{ALERT_TESTS}: no case where {name} fires"
        );
        assert!(
            quiet.contains(*name),
            "{ALERT_TESTS}: no case where {name} stays quiet"
        );
    }

    for args in [["check", "rules", ALERTS], ["test", "rules", ALERT_TESTS]] {
        let out = promtool(&args, b"");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The alerts can never watch a metric that does not exist (an alert on a missing series never
/// fires): every metric their expressions name is exported by a running proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_rules_use_only_metrics_the_proxy_exports() {
    let (problems, exported) = unexported_in(&alert_rules()).await;
    assert!(
        problems.is_empty(),
        "alert rule problems:\n  {}\n\nexported families: {exported:?}",
        problems.join("\n  "),
    );
}

// ---- logs ---------------------------------------------------------------------------------------

/// A full cycle with RUST_LOG=debug, in both log formats: enter, admitted, status READY, a
/// forwarded protected request that spends the token, a 403 with a wrong token and one with the
/// spent token. Neither the token nor the wrong one appears anywhere in the proxy's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_tokens_never_appear_in_the_logs() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--service-time-ms", "1"]);
    for format in ["text", "json"] {
        let proxy = Proxy::builder(&redis.url(), api.addr())
            .env("RUST_LOG", "debug")
            .env("WAITROOM_LOG_FORMAT", format)
            .start()
            .await;
        let user = format!("loguser-{format}");
        let token = proxy.until_ready(&user, Duration::from_secs(5)).await;
        let wrong = "3f0c1a9e-7d4b-4c2a-9e51-0a8b6c4d2e17";
        let r = proxy.order(&user, Some(wrong)).await;
        assert_eq!(r.status, 403, "wrong token: {}", r.body);
        let r = proxy.order(&user, Some(&token)).await;
        assert!(
            (200..300).contains(&r.status),
            "valid token: {} {}",
            r.status,
            r.body
        );
        let r = proxy.order(&user, Some(&token)).await;
        assert_eq!(r.status, 403, "spent token: {}", r.body);
        assert_eq!(status_of(&proxy.status(&user).await), "NOT_IN_QUEUE");

        // Access lines are written after each response: a last pass-through marks the end.
        assert_eq!(proxy.get("/observability-marker").await.status, 200);
        let done = |logs: &str| {
            logs.contains("/observability-marker")
                && logs
                    .lines()
                    .filter(|l| {
                        l.contains("/api/orders") && l.contains(&user) && l.contains("access")
                    })
                    .count()
                    >= 3
        };
        let complete = wait_until(Duration::from_secs(3), POLL, || {
            let ok = done(&proxy.logs());
            async move { ok }
        })
        .await;
        let logs = proxy.logs();
        assert!(
            complete,
            "{format}: access lines missing (marker and 3 orders of {user}):\n{logs}"
        );
        assert!(
            logs.contains("DEBUG"),
            "{format}: RUST_LOG=debug took effect:\n{logs}"
        );

        let simple = token.replace('-', "");
        for (what, secret) in [
            ("the entry token", token.as_str()),
            ("its hex form", simple.as_str()),
            ("the wrong token", wrong),
        ] {
            let hits: Vec<&str> = logs.lines().filter(|l| l.contains(secret)).collect();
            assert!(
                hits.is_empty(),
                "{format}: {what} {secret} is in the proxy's logs:\n{}",
                hits.join("\n")
            );
        }
    }
}
