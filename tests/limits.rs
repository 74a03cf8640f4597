//! Connections under attack (contract section 16), from the outside with raw sockets against the
//! real binary and a real Redis: a trickled request head is cut at `header_timeout` (on a fresh
//! connection and on the second request of a keep-alive one), an idle connection at
//! `idle_timeout`, a head over `max_request_head` gets 431, a connection beyond
//! `max_connections` is refused while the others are served, so is one beyond
//! `max_connections_per_address` while other addresses are served, a silent upstream gets the
//! client a 504 within `upstream_timeout` (the order's outcome unknown), a stalled body on enter gets
//! 408, and a client that never reads its answers is closed once an answer has waited 30 s to be
//! written.
//!
//! Timings are checked with a lower bound (a limit never strikes early) and a generous upper
//! one (the suite shares two cores with everything else).

mod common;

use common::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Slack on top of a limit before a test calls it missed.
const SLACK: Duration = Duration::from_millis(2500);

async fn room(yaml: &str) -> (RedisServer, DemoApi, Proxy) {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = Proxy::builder(&redis.url(), api.addr()).yaml(yaml).start().await;
    settle(&proxy).await;
    (redis, api, proxy)
}

/// Waits until the proxy counts no open connection, so counts start at 0.
async fn settle(proxy: &Proxy) {
    let idle = open_connections_reach(proxy, 0, Duration::from_secs(5)).await;
    assert!(idle, "connections still open at start:\n{}", proxy.metrics().await);
}

/// Whether `waitroom_open_connections` reads `n` within `timeout`.
async fn open_connections_reach(proxy: &Proxy, n: u32, timeout: Duration) -> bool {
    wait_until(timeout, Duration::from_millis(20), || async {
        proxy.metric("waitroom_open_connections").await == Some(f64::from(n))
    })
    .await
}

/// `n` new connections to the proxy, nothing sent on them.
async fn connect_n(proxy: &Proxy, n: usize) -> Vec<TcpStream> {
    let mut open = Vec::new();
    for _ in 0..n {
        open.push(TcpStream::connect(proxy.addr()).await.unwrap());
    }
    open
}

fn status_request(user: &str) -> String {
    format!("GET /queue/status HTTP/1.1\r\nHost: waitroom\r\nX-User-Id: {user}\r\n\r\n")
}

/// Whether `buf` holds a whole HTTP/1 message whose body (if any) is framed by Content-Length.
fn message_complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    buf.len() >= end + 4 + len
}

/// Reads one response whose body is framed by Content-Length; returns head and body.
async fn read_response(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if message_complete(&buf) {
            return String::from_utf8_lossy(&buf).into_owned();
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("a response within 10 s")
            .expect("read a response");
        assert!(n > 0, "closed before the response was complete: {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Whether the server closed `s` (EOF or reset) within `within`; any bytes it sends instead are
/// returned as an error.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Result<bool, String> {
    let mut chunk = [0u8; 1024];
    match tokio::time::timeout(within, s.read(&mut chunk)).await {
        Err(_) => Ok(false),
        Ok(Ok(0)) | Ok(Err(_)) => Ok(true),
        Ok(Ok(n)) => Err(String::from_utf8_lossy(&chunk[..n]).into_owned()),
    }
}

/// How long after `since` the server closed `s` without a word (None: still open at `give_up`).
async fn time_to_close(s: &mut TcpStream, since: Instant, give_up: Duration) -> Option<Duration> {
    let left = give_up.saturating_sub(since.elapsed());
    match closed_within(s, left).await {
        Ok(true) => Some(since.elapsed()),
        Ok(false) => None,
        Err(answer) => panic!("an idle connection was sent {answer:?}"),
    }
}

/// Writes a never-ending request head one byte every 50 ms until the server closes the
/// connection; returns how long that took from `since` (None: still open after `give_up`).
async fn trickle_until_closed(s: &mut TcpStream, since: Instant, give_up: Duration) -> Option<Duration> {
    let head = b"GET /queue/status HTTP/1.1\r\nHost: waitroom\r\nX-Pad: ";
    let mut i = 0usize;
    while since.elapsed() < give_up {
        let byte = head.get(i).copied().unwrap_or(b'a');
        i += 1;
        if s.write_all(&[byte]).await.is_err() {
            return Some(since.elapsed());
        }
        match closed_within(s, Duration::from_millis(50)).await {
            Ok(true) => return Some(since.elapsed()),
            Ok(false) => {}
            Err(answer) => panic!("a trickled head was answered: {answer:?}"),
        }
    }
    None
}

/// A keep-alive connection that has been served one status poll.
async fn served_connection(proxy: &Proxy) -> TcpStream {
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(status_request("alice").as_bytes()).await.unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    s
}

/// `waitroom_connections_closed_total{limit}` counted exactly `count` closes.
async fn assert_closed_by(proxy: &Proxy, limit: &str, count: f64) {
    let series = format!(r#"waitroom_connections_closed_total{{limit="{limit}"}}"#);
    assert_eq!(proxy.metric(&series).await, Some(count), "{series}");
}

#[tokio::test]
async fn a_head_trickled_byte_by_byte_is_cut_at_header_timeout() {
    let (_redis, _api, proxy) = room("limits: {header_timeout: 1s, idle_timeout: 30s}").await;
    let started = Instant::now();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let closed = trickle_until_closed(&mut s, started, Duration::from_secs(1) + SLACK).await;
    let closed = closed.expect("a trickling connection still open past header_timeout");
    assert!(closed >= Duration::from_millis(950), "closed before header_timeout: {closed:?}");
    assert_closed_by(&proxy, "header_timeout", 1.0).await;
    // Other clients were served all along.
    assert_eq!(proxy.status("alice").await.status, 200);
}

#[tokio::test]
async fn the_second_head_on_a_keep_alive_connection_is_cut_at_header_timeout_too() {
    let (_redis, _api, proxy) = room("limits: {header_timeout: 1s, idle_timeout: 30s}").await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(status_request("alice").as_bytes()).await.unwrap();
    let first = read_response(&mut s).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // Idle for longer than header_timeout: the next head's clock starts at its first byte.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = Instant::now();
    let closed = trickle_until_closed(&mut s, started, Duration::from_secs(1) + SLACK).await;
    let closed = closed.expect("the second, trickled head was never cut");
    assert!(closed >= Duration::from_millis(950), "closed before header_timeout: {closed:?}");
}

#[tokio::test]
async fn an_idle_connection_is_closed_at_idle_timeout_whether_or_not_it_served_a_request() {
    let (_redis, _api, proxy) = room("limits: {header_timeout: 5s, idle_timeout: 1s}").await;
    // After one request.
    let mut served = served_connection(&proxy).await;
    let served_since = Instant::now();
    // And one that never sent anything.
    let silent_since = Instant::now();
    let mut silent = TcpStream::connect(proxy.addr()).await.unwrap();
    let give_up = Duration::from_secs(1) + SLACK;
    let (served_closed, silent_closed) = tokio::join!(
        time_to_close(&mut served, served_since, give_up),
        time_to_close(&mut silent, silent_since, give_up)
    );
    for (name, closed) in [("served", served_closed), ("silent", silent_closed)] {
        let closed = closed.unwrap_or_else(|| panic!("the {name} connection is still open past idle_timeout"));
        assert!(closed >= Duration::from_millis(950), "the {name} connection closed early: {closed:?}");
    }
    assert_closed_by(&proxy, "idle_timeout", 2.0).await;
}

#[tokio::test]
async fn a_head_over_max_request_head_gets_431_and_the_connection_is_closed() {
    let (_redis, _api, proxy) = room("limits: {max_request_head: 2KiB}").await;
    let head = |pad: usize| {
        format!(
            "GET /queue/status HTTP/1.1\r\nHost: waitroom\r\nX-User-Id: alice\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(pad)
        )
    };
    // Just under the limit: served.
    let fits = head(2048 - head(0).len());
    assert_eq!(fits.len(), 2048);
    let answer = raw_request(proxy.addr(), fits.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // One byte over, in one piece and trickled in 100-byte pieces.
    let over = head(2049 - head(0).len());
    for pieces in [over.len(), 100] {
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        for part in over.as_bytes().chunks(pieces) {
            if s.write_all(part).await.is_err() {
                break;
            }
        }
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(read.is_ok(), "not closed after the 431: {answer}");
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("content-type: application/json"), "{answer}");
        assert!(lower.contains("cache-control: no-store"), "{answer}");
        assert!(lower.contains("connection: close"), "{answer}");
        assert!(answer.ends_with(r#"{"error":"request header too large"}"#), "{answer}");
    }
    assert_closed_by(&proxy, "head_too_large", 2.0).await;
}

#[tokio::test]
async fn a_connection_beyond_max_connections_is_refused_while_the_others_are_served() {
    let (_redis, _api, proxy) = room("limits: {max_connections: 3, header_timeout: 30s, idle_timeout: 30s}").await;
    let mut open = connect_n(&proxy, 3).await;
    let counted = open_connections_reach(&proxy, 3, Duration::from_secs(5)).await;
    assert!(counted, "three connections not counted:\n{}", proxy.metrics().await);

    let mut fourth = TcpStream::connect(proxy.addr()).await.unwrap();
    let _ = fourth.write_all(status_request("dave").as_bytes()).await;
    assert_eq!(closed_within(&mut fourth, Duration::from_secs(2)).await, Ok(true), "the fourth was not refused");
    assert!(proxy.metric(r#"waitroom_connections_closed_total{limit="max_connections"}"#).await >= Some(1.0));

    // The three are served meanwhile.
    for (i, s) in open.iter_mut().enumerate() {
        s.write_all(status_request(&format!("user{i}")).as_bytes()).await.unwrap();
        let answer = read_response(s).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    // A freed slot takes a new connection again.
    drop(open.pop());
    let freed = open_connections_reach(&proxy, 2, Duration::from_secs(5)).await;
    assert!(freed);
    let answer = raw_request(proxy.addr(), status_request("erin").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn connections_beyond_max_connections_per_address_are_refused_while_other_addresses_are_served() {
    let (_redis, _api, proxy) = room(
        "limits: {max_connections: 10000, max_connections_per_address: 100, header_timeout: 30s, idle_timeout: 30s}",
    )
    .await;
    // The first 100 from 127.0.0.1, each holding its slot before the next 200 arrive.
    let mut first = connect_n(&proxy, 100).await;
    let counted = open_connections_reach(&proxy, 100, Duration::from_secs(10)).await;
    assert!(counted, "the first 100 not counted:\n{}", proxy.metrics().await);
    let mut beyond = connect_n(&proxy, 200).await;
    for (i, s) in beyond.iter_mut().enumerate() {
        assert_eq!(closed_within(s, Duration::from_secs(5)).await, Ok(true), "connection {} from 127.0.0.1 was kept", 101 + i);
    }

    // Another address is served while 127.0.0.1 is at its limit (the listener is on 127.0.0.1;
    // the bystander's side of the socket is 127.0.0.2).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from(([127, 0, 0, 2], 0))).unwrap();
    let mut bystander = socket.connect(proxy.addr()).await.unwrap();
    bystander.write_all(status_request("bystander").as_bytes()).await.unwrap();
    let answer = read_response(&mut bystander).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // The first 100 are still open, and served.
    for (i, s) in first.iter_mut().enumerate() {
        match s.try_read(&mut [0u8; 64]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("connection {} of the first 100 is not open and quiet: {other:?}", i + 1),
        }
        s.write_all(status_request(&format!("user{i}")).as_bytes()).await.unwrap();
        let answer = read_response(s).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "connection {}: {answer}", i + 1);
    }
    assert_eq!(proxy.metric("waitroom_open_connections").await, Some(101.0));
    assert_eq!(
        proxy.metric(r#"waitroom_connections_closed_total{limit="max_connections_per_address"}"#).await,
        Some(200.0)
    );
    assert_eq!(proxy.metric(r#"waitroom_connections_closed_total{limit="max_connections"}"#).await, None);
}

/// An upstream whose first connection is accepted and never answered; later ones get a 201 to
/// whatever they send.
async fn silent_then_answering_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut silent = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            if silent.is_empty() {
                silent.push(s);
                continue;
            }
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head, then the body its Content-Length announces.
                while !message_complete(&buf) {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_silent_upstream_gets_504_within_upstream_timeout_and_the_outcome_is_unknown() {
    let redis = RedisServer::start();
    let upstream = silent_then_answering_upstream().await;
    let proxy = Proxy::builder(&redis.url(), upstream)
        .yaml("limits: {upstream_timeout: 1s}\nadmission: {interval: 100ms, batch_size: 10}")
        .start()
        .await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;

    let started = Instant::now();
    let timed_out = proxy.order("alice", Some(&token)).await;
    let took = started.elapsed();
    assert_eq!(timed_out.status, 504, "{}", timed_out.body);
    assert!(timed_out.json()["error"].is_string(), "{}", timed_out.body);
    assert_eq!(timed_out.header("cache-control"), Some("no-store"));
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(1) + SLACK,
        "504 after {took:?}"
    );
    // Counted in pingora's logging phase, which runs once the 504 has been written: await it.
    let counted = wait_until(Duration::from_secs(2), Duration::from_millis(10), || async {
        proxy.metric(r#"waitroom_upstream_responses_total{class="error"}"#).await == Some(1.0)
    })
    .await;
    assert!(counted, "the timeout is counted as an upstream error");

    // The order reached the upstream and no status line came back: the upstream may have placed
    // it, so the token is spent (section 12) and the retry refused.
    assert_eq!(proxy.metric("waitroom_tokens_consumed_total").await, Some(1.0));
    assert_eq!(proxy.order("alice", Some(&token)).await.status, 403);
}

/// A client that sends request after request and never reads an answer: once its answers fill
/// the socket, the proxy's write of the next one waits at most 30 s (the bound pingora puts on its
/// own writes), then the connection is closed; meanwhile everyone else is answered. Without the
/// bound, the connection would hold its slot and its buffers for as long as the client liked.
#[tokio::test]
async fn a_client_that_never_reads_is_closed_when_its_answer_cannot_be_written() {
    const WRITE_BOUND: Duration = Duration::from_secs(30);
    let (_redis, _api, proxy) = room("limits: {header_timeout: 60s, idle_timeout: 120s}").await;
    // On a connection of its own, closed, so the gauge below counts only the stuck one.
    let mut entering = TcpStream::connect(proxy.addr()).await.unwrap();
    let enter = "POST /queue/enter HTTP/1.1\r\nHost: waitroom\r\nX-User-Id: alice\r\nContent-Length: 0\r\n\r\n";
    entering.write_all(enter.as_bytes()).await.unwrap();
    assert!(read_response(&mut entering).await.starts_with("HTTP/1.1 200"));
    drop(entering);

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small receive window, so the answers soon fill it.
    socket.set_recv_buffer_size(4096).unwrap();
    let stuck = socket.connect(proxy.addr()).await.unwrap();
    let (_unread, mut writer) = stuck.into_split();
    // Requests until the proxy stops reading them.
    let polls = status_request("alice").repeat(100);
    let mut sent = 0;
    while tokio::time::timeout(Duration::from_secs(2), writer.write_all(polls.as_bytes())).await.is_ok() {
        sent += 100;
        assert!(sent < 1_000_000, "the proxy kept reading requests whose answers nobody read");
    }
    // The kernel grows the proxy's send buffer for a while after that; the proxy is blocked on
    // an answer once it has answered nothing for a few seconds (a status call is counted once
    // its answer is written).
    let answered = || async { proxy.counter(r#"waitroom_request_duration_seconds_count{endpoint="status"}"#).await };
    let (mut last, mut blocked) = (answered().await, Instant::now());
    while blocked.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = answered().await;
        if now != last {
            (last, blocked) = (now, Instant::now());
        }
    }
    let open = || async { proxy.metric("waitroom_open_connections").await };

    tokio::time::sleep_until((blocked + WRITE_BOUND - Duration::from_secs(4)).into()).await;
    assert_eq!(open().await, Some(1.0), "closed before the write bound (or the entering one still open)");
    let mut other = served_connection(&proxy).await;
    other.write_all(status_request("alice").as_bytes()).await.unwrap();
    assert!(read_response(&mut other).await.starts_with("HTTP/1.1 200"), "another client is answered");
    drop(other);

    let closed = wait_until(Duration::from_secs(4) + SLACK, Duration::from_millis(100), || async {
        open().await == Some(0.0)
    })
    .await;
    assert!(closed, "still open {:?} after the proxy's answer stopped being written", blocked.elapsed());
}

#[tokio::test]
async fn a_stalled_body_on_enter_gets_408_within_header_timeout() {
    let (_redis, _api, proxy) = room("limits: {header_timeout: 1s}").await;
    let started = Instant::now();
    let answer = raw_request(
        proxy.addr(),
        b"POST /queue/enter HTTP/1.1\r\nHost: waitroom\r\nX-User-Id: bob\r\nContent-Length: 10\r\n\r\nabc",
    )
    .await;
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let lower = answer.to_ascii_lowercase();
    assert!(lower.contains("content-type: application/json") && lower.contains("cache-control: no-store"), "{answer}");
    assert!(answer.ends_with(r#"{"error":"the request body did not arrive in time"}"#), "{answer}");
    assert!(took >= Duration::from_millis(950) && took < Duration::from_secs(1) + SLACK, "408 after {took:?}");
}

#[tokio::test]
async fn limits_reload_without_a_restart_and_apply_to_the_next_connection() {
    let (_redis, _api, proxy) = room("limits: {max_connections: 100, header_timeout: 30s, idle_timeout: 30s}").await;
    let mut kept = served_connection(&proxy).await;

    proxy.rewrite_config("limits: {max_connections: 1, idle_timeout: 1s}");
    proxy.signal("HUP");
    let reloaded = wait_until(Duration::from_secs(10), Duration::from_millis(20), || async {
        proxy.metric(r#"waitroom_config_reloads_total{result="ok"}"#).await == Some(1.0)
    })
    .await;
    assert!(reloaded, "no reload:\n{}", proxy.logs());
    assert!(!proxy.logs().contains("needs a restart"), "{}", proxy.logs());

    // The open connection keeps its slot; a second one is now over the limit.
    let mut second = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(closed_within(&mut second, Duration::from_secs(2)).await, Ok(true), "the second was not refused");
    // The kept connection's next wait for a head runs on the new idle_timeout.
    kept.write_all(status_request("alice").as_bytes()).await.unwrap();
    assert!(read_response(&mut kept).await.starts_with("HTTP/1.1 200"));
    let since = Instant::now();
    let closed = time_to_close(&mut kept, since, Duration::from_secs(1) + SLACK).await;
    assert!(closed.is_some_and(|c| c >= Duration::from_millis(950)), "closed after {closed:?}");
}

#[test]
fn check_refuses_limits_that_would_break_serving_and_names_each() {
    let out = run_check(
        "upstream: 127.0.0.1:8081\nlimits: {header_timeout: 0s, idle_timeout: 10ms, upstream_timeout: 2d, \
         max_connections: 0, max_connections_per_address: -1, max_request_head: 32KB}\n",
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let keys: Vec<&str> = stderr.lines().filter_map(|l| l.split(':').next()).collect();
    assert_eq!(
        keys,
        [
            "limits.header_timeout",
            "limits.idle_timeout",
            "limits.upstream_timeout",
            "limits.max_connections",
            "limits.max_connections_per_address",
            "limits.max_request_head"
        ],
        "{stderr}"
    );
    let too_large = run_check("upstream: 127.0.0.1:8081\nlimits: {max_request_head: 1MiB}\n");
    assert_eq!(too_large.status.code(), Some(2), "1MiB is above the largest head served as written");
    let ok = run_check(
        "upstream: 127.0.0.1:8081\nlimits: {header_timeout: 100ms, idle_timeout: 24h, max_connections: 1, \
         upstream_timeout: 1s, max_request_head: 512KiB}\n",
    );
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
}
