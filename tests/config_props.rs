//! Contract section 16: any configuration value is either served as written or refused by
//! `--check`. Over generated configurations (proptest's strategies, drawn afresh each run; the
//! failing overlay is printed): every one that `--check` accepts starts against a real Redis
//! and admits a user within a few intervals, and none panics; every one it refuses is refused
//! with exit code 2. The bound of `admission.interval` (1 ms served, 200 us refused) is tried in
//! every run, and every run must have seen both a served and a refused configuration.

mod common;

use std::time::Duration;

use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as Cases, TestRunner};

/// Configurations per run, started four at a time: a few seconds in all.
const CASES: usize = 24;

/// The admission, queue, polling and token keys, near and past their bounds.
fn overlay() -> impl Strategy<Value = String> {
    // Mostly values the check should accept, and now and then one just past a bound.
    let interval = prop_oneof![
        1 => Just("200us"),
        2 => Just("1ms"),
        2 => Just("3ms"),
        2 => Just("40ms"),
        2 => Just("250ms"),
        1 => Just("1s"),
    ];
    let batch = prop_oneof![1 => Just(0u32), 9 => 1u32..=12];
    let adaptive = proptest::option::of((prop_oneof![1 => Just(0u32), 6 => 1u32..=4], 1u64..=400));
    let tiers = (1u64..=3, proptest::option::of((1u64..=3, 5u64..=60)));
    (
        (interval, batch, any::<bool>(), 0u64..=3, adaptive),
        (1u64..=40, tiers, prop_oneof![3 => Just(0u64), 2 => 1u64..=9]),
        (any::<bool>(), 0u32..=95, prop_oneof![Just("1s"), Just("30s"), Just("5m")], 50u64..=1000),
    )
        .prop_map(|(admission, queue, rest)| {
            let (interval, batch, instant, max_active, adaptive) = admission;
            let (capacity, (poll_after, upper_tier), abandon_after) = queue;
            let (enforce, grace, ttl, redis_timeout) = rest;
            let adaptive = adaptive.map_or(String::new(), |(min_batch, p95)| {
                format!(", adaptive: {{min_batch: {min_batch}, target_p95: {p95}ms}}")
            });
            let upper = upper_tier.map_or(String::new(), |(poll, wait)| {
                format!("{{min_wait: {wait}s, poll_after: {poll}s}}, ")
            });
            format!(
                "admission: {{interval: {interval}, batch_size: {batch}, instant: {instant}, max_active: {max_active}{adaptive}}}\n\
                 queue: {{capacity: {capacity}, abandon_after: {abandon_after}s}}\n\
                 poll_after: [{upper}{{min_wait: 0s, poll_after: {poll_after}s}}]\n\
                 polling: {{enforce: {enforce}, grace: {grace}%}}\n\
                 token: {{ttl: {ttl}}}\n\
                 redis: {{timeout: {redis_timeout}ms}}\n"
            )
        })
}

/// One configuration: refused with 2, or served (started, a user admitted, no panic).
async fn try_configuration(redis: &RedisServer, api: &DemoApi, overlay: String) -> Result<&'static str, String> {
    let builder = Proxy::builder(&redis.url(), api.addr()).yaml(&overlay);
    let [listen, metrics] = free_ports().map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    let full = serde_yaml::to_string(&builder.config(listen, metrics)).expect("yaml");
    let checked = run_check(&full);
    match checked.status.code() {
        Some(0) => {}
        Some(2) => return Ok("refused"),
        other => {
            return Err(format!(
                "--check exited {other:?}:\n{}",
                String::from_utf8_lossy(&checked.stderr)
            ))
        }
    }
    let proxy = builder.spawn();
    proxy.wait_ready(Duration::from_secs(20)).await?;
    let entered = proxy.enter("someone").await;
    if entered.status != 200 {
        return Err(format!("enter: {} {}", entered.status, entered.body));
    }
    let admitted = key_appears(redis, &keys(&proxy).token("someone"), Duration::from_secs(5)).await;
    let logs = proxy.logs();
    if logs.contains("panicked") || !proxy.is_running() {
        return Err(format!("the proxy panicked or died:\n{logs}"));
    }
    if !admitted {
        return Err(format!("nobody admitted within 5 s:\n{logs}"));
    }
    Ok("served")
}

/// The interval's bound (contract section 16: "an `interval` of 1 ms is the smallest"), tried
/// in every run next to the random cases, which draw `200us` only one time in ten: just past the
/// bound is refused by `--check`, the bound itself is served and admits.
const BOUNDARY: [(&str, &str); 2] = [
    ("admission: {interval: 200us, batch_size: 1}\n", "refused"),
    ("admission: {interval: 1ms, batch_size: 1}\n", "served"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_configuration_check_accepts_starts_and_admits() {
    let (redis, api) = (RedisServer::start(), DemoApi::start(&[]));
    let mut runner = TestRunner::new(Cases::default());
    let strategy = overlay();
    let mut overlays: Vec<(String, Option<&str>)> =
        BOUNDARY.iter().map(|(o, want)| (o.to_string(), Some(*want))).collect();
    overlays.extend(
        (0..CASES).map(|_| (strategy.new_tree(&mut runner).expect("a case").current(), None)),
    );
    let mut outcomes = Vec::new();
    for group in overlays.chunks(4) {
        let tried = futures::future::join_all(
            group.iter().map(|(o, _)| try_configuration(&redis, &api, o.clone())),
        )
        .await;
        for ((overlay, want), outcome) in group.iter().zip(tried) {
            match outcome {
                Ok(what) => {
                    if let Some(want) = want {
                        assert_eq!(what, *want, "the boundary case\n{overlay}");
                    }
                    outcomes.push(what)
                }
                Err(problem) => panic!("configuration\n{overlay}\n{problem}"),
            }
        }
    }
    println!("configurations (the {} boundary cases first): {outcomes:?}", BOUNDARY.len());
    // Both sides of the property were exercised, whatever the random cases drew.
    for side in ["served", "refused"] {
        assert!(outcomes.contains(&side), "no configuration was {side}: {outcomes:?}");
    }
}
