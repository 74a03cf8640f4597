//! Checks the test harness itself, so a failing feature test points at the proxy, not the harness.
//! Nothing here needs the waitroom binary to run: the proxy side is checked through its pure parts.

mod common;

use common::*;
use serde_yaml::Value;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

async fn ping(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

async fn set(conn: &mut redis::aio::MultiplexedConnection, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

async fn get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

/// The tests beside this one connect and start servers in parallel, and an outgoing connection's
/// local port comes from the same ephemeral range: one port may be taken between the two binds
/// (seen once in a suite run here). Five in a row cannot all be.
#[test]
fn free_port_is_bindable() {
    let tries: Vec<std::io::Result<TcpListener>> =
        (0..5).map(|_| TcpListener::bind(("127.0.0.1", free_port()))).collect();
    assert!(tries.iter().any(Result::is_ok), "no port from free_port binds: {tries:?}");
}

/// Ports asked for together are distinct (a proxy's `listen` and `metrics_listen` come from one
/// call; the same port for both refuses the config).
#[test]
fn free_ports_are_distinct() {
    let ports = free_ports::<16>();
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
}

/// `closed_port()` refuses connections at once, stays the same for the binary's run, and nobody
/// can bind it meanwhile (it is held, not merely free).
#[test]
fn closed_port_refuses_and_cannot_be_taken() {
    let port = closed_port();
    assert_eq!(port, closed_port(), "one port per binary");
    assert_eq!(refused_addr().port(), port);
    let refused = std::net::TcpStream::connect_timeout(&refused_addr(), Duration::from_secs(1));
    assert_eq!(
        refused.map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
    assert!(TcpListener::bind(("127.0.0.1", port)).is_err(), "the port is held");
}

#[tokio::test]
async fn redis_answers_and_restart_without_aof_forgets() {
    let mut redis = RedisServer::start();
    let other = RedisServer::start();
    assert_ne!(redis.port(), other.port(), "each test gets its own server");
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));

    let mut conn = redis.conn().await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    set(&mut conn, "k", "v").await;

    let port = redis.port();
    redis.restart();
    assert_eq!(redis.port(), port, "restart keeps the port");
    let mut conn = redis.conn().await;
    let v = get(&mut conn, "k").await;
    assert_eq!(v, None, "no persistence: a restart starts empty");

    redis.stop();
    assert!(!redis.is_running());
    redis.restart(); // restart after stop works too
    assert_eq!(ping(&mut redis.conn().await).await.unwrap(), "PONG");
}

#[tokio::test]
async fn redis_with_aof_keeps_data_across_restart() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut conn = redis.conn().await;
    set(&mut conn, "k", "kept").await;

    redis.restart();
    let mut conn = redis.conn().await;
    let v = get(&mut conn, "k").await;
    assert_eq!(v.as_deref(), Some("kept"));
}

#[tokio::test]
async fn redis_freeze_hangs_and_thaw_resumes() {
    let redis = RedisServer::start();
    let mut conn = redis.conn().await;

    redis.freeze();
    // A hanging server: the kernel still accepts connections, but nothing answers.
    tokio::net::TcpStream::connect(redis.addr())
        .await
        .expect("frozen server still accepts");
    let started = Instant::now();
    let frozen = tokio::time::timeout(Duration::from_millis(300), ping(&mut conn)).await;
    assert!(frozen.is_err(), "PING answered while frozen: {frozen:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));

    redis.thaw();
    let answered = wait_until(
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async { matches!(ping(&mut redis.conn().await).await.as_deref(), Ok("PONG")) },
    )
    .await;
    assert!(answered, "no PONG after thaw");
}

#[tokio::test]
async fn wait_until_reports_success_and_timeout() {
    let start = Instant::now();
    let deadline = start + Duration::from_millis(50);
    assert!(
        wait_until(Duration::from_secs(2), Duration::from_millis(5), || async {
            Instant::now() >= deadline
        })
        .await
    );
    assert!(start.elapsed() < Duration::from_secs(1));

    let start = Instant::now();
    let never = wait_until(
        Duration::from_millis(100),
        Duration::from_millis(10),
        || async { false },
    );
    assert!(!never.await);
    assert!(start.elapsed() >= Duration::from_millis(100));
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[test]
fn config_merge_fills_base_and_deep_merges_overlays() {
    let builder = Proxy::builder("redis://127.0.0.1:7777", addr(8081))
        .yaml("admission: {interval: 100ms, batch_size: 5}\nqueue: {capacity: 500}")
        .yaml("admission: {batch_size: 7}\nredis: {timeout: 200ms}");
    let cfg = builder.config(addr(1000), addr(1001));

    assert_eq!(cfg["listen"].as_str(), Some("127.0.0.1:1000"));
    assert_eq!(cfg["metrics_listen"].as_str(), Some("127.0.0.1:1001"));
    assert_eq!(cfg["upstream"].as_str(), Some("127.0.0.1:8081"));
    assert_eq!(cfg["redis"]["url"].as_str(), Some("redis://127.0.0.1:7777"));
    assert_eq!(
        cfg["redis"]["timeout"].as_str(),
        Some("200ms"),
        "nested keys merge"
    );
    assert_eq!(
        cfg["admission"]["interval"].as_str(),
        Some("100ms"),
        "earlier overlay kept"
    );
    assert_eq!(
        cfg["admission"]["batch_size"].as_u64(),
        Some(7),
        "later overlay wins"
    );
    assert_eq!(cfg["queue"]["capacity"].as_u64(), Some(500));

    let prefix = cfg["redis"]["key_prefix"].as_str().unwrap().to_owned();
    assert!(
        prefix.starts_with('t') && prefix.len() == 13,
        "unique prefix, got {prefix}"
    );
    // One builder, many proxies: same room. Separate builders: separate rooms.
    assert_eq!(
        builder.config(addr(2000), addr(2001))["redis"]["key_prefix"].as_str(),
        Some(&*prefix)
    );
    let other = Proxy::builder("redis://127.0.0.1:7777", addr(8081)).config(addr(1), addr(2));
    assert_ne!(other["redis"]["key_prefix"].as_str(), Some(&*prefix));

    let named = builder.clone().key_prefix("room1").config(addr(1), addr(2));
    assert_eq!(named["redis"]["key_prefix"].as_str(), Some("room1"));
    let via_yaml = builder
        .yaml("redis: {key_prefix: room2}")
        .config(addr(1), addr(2));
    assert_eq!(via_yaml["redis"]["key_prefix"].as_str(), Some("room2"));
    assert_eq!(
        via_yaml["redis"]["url"].as_str(),
        Some("redis://127.0.0.1:7777")
    );
}

#[test]
fn merged_config_yaml_replaces_sequences_and_null_removes() {
    let base = base_config(addr(1), addr(2), "127.0.0.1:3", "redis://127.0.0.1:4", "p");
    let text = merged_config_yaml(
        base,
        &[
            "protected: [{method: POST, path: /a}, {method: PUT, path: /b}]",
            "protected: [{method: POST, path: /c}]",
            "redis: {url: ~, cluster: ['redis://127.0.0.1:7000']}",
            "", // empty overlay changes nothing
        ],
    );
    let cfg: Value = serde_yaml::from_str(&text).expect("merged text is YAML");
    let protected = cfg["protected"].as_sequence().unwrap();
    assert_eq!(protected.len(), 1, "sequences are replaced, not appended");
    assert_eq!(protected[0]["path"].as_str(), Some("/c"));
    assert!(cfg["redis"].get("url").is_none(), "null removes the key");
    assert_eq!(
        cfg["redis"]["cluster"][0].as_str(),
        Some("redis://127.0.0.1:7000")
    );
    assert_eq!(cfg["redis"]["key_prefix"].as_str(), Some("p"));
    assert_eq!(cfg["listen"].as_str(), Some("127.0.0.1:1"));
}

#[test]
fn parse_metric_finds_exact_series() {
    let text = "# HELP waitroom_enter_total enters\n# TYPE waitroom_enter_total counter\n\
                waitroom_enter_total{result=\"queued\"} 12\nwaitroom_enter_total{result=\"full\"} 3\n\
                waitroom_queue_length 7\nwaitroom_queue_length_x 9\n";
    assert_eq!(
        parse_metric(text, "waitroom_enter_total{result=\"full\"}"),
        Some(3.0)
    );
    assert_eq!(parse_metric(text, "waitroom_queue_length"), Some(7.0));
    assert_eq!(parse_metric(text, "waitroom_admitted_total"), None);
}

#[tokio::test]
async fn demo_api_starts_and_echoes() {
    let api = DemoApi::start(&["--slots", "4", "--service-time-ms", "1"]);
    let client = http_client();

    let echo = send(
        client
            .post(api.url("/hello?x=1"))
            .header("X-Probe", "abc")
            .body("payload"),
    )
    .await;
    assert_eq!(echo.status, 200, "{}", echo.body);
    echo.json(); // the echo is JSON
    for (part, what) in [("/hello", "the path"), ("abc", "the headers")] {
        assert!(echo.body.contains(part), "the echo carries {what}: {}", echo.body);
    }

    let stats = api.stats().await;
    assert!(stats.get("peakInFlight").is_some(), "stats: {stats}");

    let raw = raw_request(api.addr(), b"GET /raw HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(raw.starts_with("HTTP/1.1 200"), "raw response: {raw:?}");
    assert!(
        raw.contains("/raw"),
        "raw response complete by Content-Length: {raw:?}"
    );
}
