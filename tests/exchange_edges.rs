//! One admission, one order, at the edges of the exchange (contract section 12): a body trickled
//! for longer than a claim would live alone, an order slower than `limits.upstream_timeout`, an
//! order that asks to switch protocols with bytes pipelined behind it, framing the connection
//! cannot vouch for, an order API that answers with a redirect, repaired request lines, and what
//! a pass-through response may carry to a client.
//!
//! The upstream is a [`Recorder`], which records an order once it has read it whole and answers
//! whatever became of its client, as Flask and most frameworks do: its count of requests is the
//! count of orders placed. Every request is sent on a raw socket, byte for byte.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Admission quick enough that a token comes at once.
const QUICK: &str = "admission: {interval: 20ms, batch_size: 50}";

async fn recorded(upstream: Recorder, yaml: &str) -> (RedisServer, Recorder, Proxy) {
    let redis = RedisServer::start();
    let proxy = Proxy::builder(&redis.url(), upstream.addr()).yaml(QUICK).yaml(yaml).start().await;
    (redis, upstream, proxy)
}



fn order(user: &str, token: &str, extra: &str, body: &str) -> String {
    format!(
        "POST /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: {user}\r\nX-Entry-Token: {token}\r\n{extra}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Orders the upstream has recorded so far.
fn orders(upstream: &Recorder) -> usize {
    upstream.lines().iter().filter(|line| line.starts_with("POST /api/orders ")).count()
}

/// Every response on one connection until the proxy closes it (or 10 s pass).
async fn responses_until_close(stream: &mut TcpStream) -> Vec<String> {
    let mut answers = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match try_read_response(stream, Duration::from_secs(3)).await {
            Some(answer) if !answer.is_empty() => answers.push(answer),
            _ => break,
        }
    }
    answers
}

/// A client that trickles its order's body for longer than `claim_timeout` keeps its claim: a
/// second order with the same token meanwhile is refused with 409 and never reaches the upstream,
/// the first is placed once, and the token is spent after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickled_past_claim_timeout_keeps_its_claim() {
    let (_redis, upstream, proxy) =
        recorded(Recorder::start(201).await, "token: {claim_timeout: 1s}\nlimits: {upstream_timeout: 900ms}").await;
    let token = proxy.until_ready("tess", Duration::from_secs(10)).await;
    let body = "{\"items\":[1,2,3]}";
    let head = order("tess", &token, "", body);
    let head = &head[..head.len() - body.len()];
    let mut slow = TcpStream::connect(proxy.addr()).await.unwrap();
    slow.write_all(head.as_bytes()).await.unwrap();
    // A byte every 150 ms: 2.5 s for the body, 2.5 claim_timeouts.
    let trickle = async {
        for byte in body.as_bytes() {
            tokio::time::sleep(Duration::from_millis(150)).await;
            slow.write_all(&[*byte]).await.unwrap();
        }
        read_response(&mut slow).await
    };
    let second = async {
        // Past claim_timeout from the claim, while the first is still trickling.
        tokio::time::sleep(Duration::from_millis(1_800)).await;
        raw_request(proxy.addr(), order("tess", &token, "Connection: close\r\n", "{}").as_bytes()).await
    };
    let (first, second) = tokio::join!(trickle, second);
    assert_eq!(http_status(&second), 409, "{second}");
    assert_eq!(json_body(&second), serde_json::json!({"error": "this entry token is already in use"}));
    assert_eq!(http_status(&first), 201, "{first}");
    let third = raw_request(proxy.addr(), order("tess", &token, "Connection: close\r\n", "{}").as_bytes()).await;
    assert_eq!(http_status(&third), 403, "{third}");
    assert_eq!(orders(&upstream), 1, "{:?}", upstream.lines());
}

/// An order slower than `limits.upstream_timeout`: the client learns that its outcome is unknown
/// (504). By default the token is spent and the retry refused (403): the order API, which
/// finished the first order anyway, places one order. With `token.unknown_outcome: release`, for
/// an order API that deduplicates on the token, the retry goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_slower_than_the_upstream_timeout_has_an_unknown_outcome() {
    let spent = "the order's outcome is unknown: the upstream did not answer in time; the entry token is spent";
    let kept = "the order's outcome is unknown: the upstream did not answer in time; the entry token may be used again";
    for (unknown_outcome, said, retried, placed) in [("spend", spent, 403, 1), ("release", kept, 201, 2)] {
        let slow = Recorder::start_slow_first(201, Duration::from_millis(1_500), 1).await;
        let yaml = format!("token: {{claim_timeout: 1s, unknown_outcome: {unknown_outcome}}}\nlimits: {{upstream_timeout: 500ms}}");
        let (_redis, upstream, proxy) = recorded(slow, &yaml).await;
        let token = proxy.until_ready("uma", Duration::from_secs(10)).await;
        let first = raw_request(proxy.addr(), order("uma", &token, "", "{}").as_bytes()).await;
        assert_eq!(http_status(&first), 504, "{unknown_outcome}: {first}");
        assert_eq!(json_body(&first), serde_json::json!({ "error": said }));
        assert_eq!(proxy.metric(r#"waitroom_protected_requests_total{result="unknown"}"#).await, Some(1.0));
        let retry = raw_request(proxy.addr(), order("uma", &token, "", "{}").as_bytes()).await;
        assert_eq!(http_status(&retry), retried, "{unknown_outcome}: {retry}");
        let after = raw_request(proxy.addr(), order("uma", &token, "", "{}").as_bytes()).await;
        assert_eq!(http_status(&after), 403, "{unknown_outcome}: spent by now: {after}");
        assert_eq!(orders(&upstream), placed, "{unknown_outcome}: {:?}", upstream.lines());
    }
}

/// A client that leaves before its body is whole has placed no order: the upstream holds an
/// unfinished request. The claim is released and the retry goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_whose_body_never_came_whole_keeps_its_token() {
    let (_redis, upstream, proxy) = recorded(Recorder::start(201).await, "").await;
    let token = proxy.until_ready("ben", Duration::from_secs(10)).await;
    let whole = order("ben", &token, "", "{\"items\":[1,2,3]}");
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream.write_all(&whole.as_bytes()[..whole.len() - 5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(stream);
    let retried = wait_until(Duration::from_secs(5), Duration::from_millis(50), || async {
        let retry = raw_request(proxy.addr(), order("ben", &token, "", "{}").as_bytes()).await;
        http_status(&retry) != 409
    });
    assert!(retried.await, "the claim was released");
    let spent = raw_request(proxy.addr(), order("ben", &token, "", "{}").as_bytes()).await;
    assert_eq!(http_status(&spent), 403, "the retry placed the order: {spent}");
    assert_eq!(orders(&upstream), 1, "{:?}", upstream.lines());
}

/// An order that asks to switch protocols (h2c, WebSocket) with bytes pipelined behind it is
/// forwarded without `Upgrade` and `HTTP2-Settings`, answered, and settled by its answer: three
/// tries place one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_with_upgrade_and_pipelined_bytes_places_one_order() {
    let (_redis, upstream, proxy) = recorded(Recorder::start_slow(201, Duration::from_millis(300)).await, "").await;
    let token = proxy.until_ready("xena", Duration::from_secs(10)).await;
    let switches = [
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
        "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        "Upgrade: anything\r\n",
    ];
    let mut statuses = Vec::new();
    for switch in switches {
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        stream.write_all(order("xena", &token, switch, "{}").as_bytes()).await.unwrap();
        // Sent while the backend works on the order.
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.write_all(b"GET /after HTTP/1.1\r\nHost: shop\r\n\r\n").await.unwrap();
        let answers = responses_until_close(&mut stream).await;
        let first = answers.first().cloned().unwrap_or_default();
        statuses.push(http_status(&first));
        let last = answers.last().unwrap();
        assert!(
            answers.len() == 2 || last.to_ascii_lowercase().contains("\r\nconnection: close\r\n"),
            "every pipelined request answered, or the last answer says close: {answers:?}"
        );
    }
    assert_eq!(statuses, [201, 403, 403]);
    assert_eq!(orders(&upstream), 1, "{:?}", upstream.lines());
    let seen = upstream.seen();
    let placed = seen.iter().find(|s| s.line.starts_with("POST /api/orders ")).unwrap();
    for header in &placed.headers {
        let name = header.split(':').next().unwrap().to_ascii_lowercase();
        assert!(name != "upgrade" && name != "http2-settings", "forwarded with {header}: {placed:?}");
    }
}

/// Framing the connection cannot vouch for is refused before the claim: the order never reaches
/// the upstream, the token stays the user's, and the answer closes the connection.
#[tokio::test]
async fn an_order_framed_ambiguously_is_refused_before_its_claim() {
    let (_redis, upstream, proxy) = recorded(Recorder::start(201).await, "").await;
    let token = proxy.until_ready("yara", Duration::from_secs(10)).await;
    let head = format!("POST /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: yara\r\nX-Entry-Token: {token}\r\n");
    for framing in [
        "Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    ] {
        let raw = raw_request(proxy.addr(), format!("{head}{framing}GET /next HTTP/1.1\r\nHost: shop\r\n\r\n").as_bytes()).await;
        let status = http_status(&raw);
        // pingora refuses some of these itself (400 too); none may reach the upstream.
        assert_eq!(status, 400, "{framing:?}: {raw}");
        assert!(raw.to_ascii_lowercase().contains("\r\nconnection: close\r\n"), "{framing:?}: {raw}");
    }
    assert_eq!(orders(&upstream), 0, "{:?}", upstream.lines());
    let plain = raw_request(proxy.addr(), order("yara", &token, "", "{}").as_bytes()).await;
    assert_eq!(http_status(&plain), 201, "{plain}");
}

/// Requests pipelined behind a request whose framing is not plain, or behind a refused order
/// with a body, are all answered in order, or the last answer given says `Connection: close`.
#[tokio::test]
async fn every_pipelined_request_is_answered_or_the_last_answer_says_close() {
    let (_redis, _upstream, proxy) = recorded(Recorder::start(200).await, "").await;
    let next = "GET /next HTTP/1.1\r\nHost: shop\r\n\r\nGET /last HTTP/1.1\r\nHost: shop\r\n\r\n";
    for first in [
        "POST /form HTTP/1.1\r\nHost: shop\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "POST /form HTTP/1.1\r\nHost: shop\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        "POST /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: zed\r\nContent-Length: 2\r\n\r\n{}",
        "POST /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: zed\r\nX-Entry-Token: made-up\r\nContent-Length: 2\r\n\r\n{}",
        "POST /queue/enter HTTP/1.1\r\nHost: shop\r\nX-User-Id: zed\r\nContent-Length: 2\r\n\r\n{}",
    ] {
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        stream.write_all(format!("{first}{next}").as_bytes()).await.unwrap();
        let answers = responses_until_close(&mut stream).await;
        assert!(!answers.is_empty(), "{first:?}: no answer");
        let last = answers.last().unwrap().to_ascii_lowercase();
        assert!(
            answers.len() == 3 || last.contains("\r\nconnection: close\r\n"),
            "{first:?}: {} of 3 answered, the last: {last}",
            answers.len()
        );
    }
}

/// An order API that answers a placed order with a redirect (POST, then 303) places an order per
/// try unless `token.spend_on_redirect` says a 3xx spends.
#[tokio::test]
async fn a_redirect_spends_the_token_only_when_configured() {
    for (spend, second) in [(false, 303), (true, 403)] {
        let (_redis, upstream, proxy) =
            recorded(Recorder::start(303).await, &format!("token: {{spend_on_redirect: {spend}}}")).await;
        let token = proxy.until_ready("abe", Duration::from_secs(10)).await;
        let first = raw_request(proxy.addr(), order("abe", &token, "", "{}").as_bytes()).await;
        assert_eq!(http_status(&first), 303, "{first}");
        let retry = raw_request(proxy.addr(), order("abe", &token, "", "{}").as_bytes()).await;
        assert_eq!(http_status(&retry), second, "spend_on_redirect: {spend}: {retry}");
        assert_eq!(orders(&upstream), if spend { 1 } else { 2 });
    }
}

/// A request line that is not exactly `METHOD SP target SP HTTP/1.x` gets 400 and reaches
/// nobody: pingora would repair `/api/orders  HTTP/1.1` into `/api/orders%20`, which no rule
/// protects and a backend that trims paths routes as the order handler.
#[tokio::test]
async fn a_request_line_that_would_be_repaired_is_refused() {
    let (_redis, upstream, proxy) = recorded(Recorder::start(201).await, "").await;
    for separator in ["  ", "\t", " \t", "\x0b ", "\0 ", "\r "] {
        let request = format!("POST /api/orders{separator}HTTP/1.1\r\nHost: shop\r\nX-User-Id: al\r\nContent-Length: 2\r\n\r\n{{}}");
        let raw = raw_request(proxy.addr(), request.as_bytes()).await;
        assert_eq!(http_status(&raw), 400, "{separator:?}: {raw}");
        assert_eq!(
            json_body(&raw),
            serde_json::json!({"error": "the request line must be METHOD, one space, the target, one space, HTTP/1.x"}),
        );
        assert!(raw.contains("\r\nConnection: close\r\n"), "{raw}");
    }
    assert!(upstream.lines().is_empty(), "{:?}", upstream.lines());
    // A plain line on the same proxy is served.
    let raw = raw_request(proxy.addr(), b"GET /plain HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n").await;
    assert_eq!(http_status(&raw), 201, "{raw}");
}

/// `Waitroom-Command` is obeyed on protected responses only, and reaches no client on any.
#[tokio::test]
async fn waitroom_command_never_reaches_a_client() {
    for value in ["close", "pause", "something-else"] {
        let upstream = Recorder::start_with_headers(200, &[("Waitroom-Command", value)]).await;
        let (_redis, _upstream, proxy) = recorded(upstream, "").await;
        let raw = raw_request(proxy.addr(), b"GET /api/products HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n").await;
        assert_eq!(http_status(&raw), 200, "{raw}");
        assert!(!raw.to_ascii_lowercase().contains("waitroom-command"), "{value}: {raw}");
        // Not obeyed on a pass-through response: the room is still open.
        let enter = proxy.enter("newcomer").await;
        assert_ne!(enter.json()["status"], "CLOSED", "{value}: {}", enter.body);
    }
}

/// A request that asks to switch to anything but WebSocket is forwarded without `Upgrade` and
/// `HTTP2-Settings`, whatever its `Connection` says; a WebSocket upgrade keeps them.
#[tokio::test]
async fn only_a_websocket_upgrade_reaches_the_upstream() {
    let (_redis, upstream, proxy) = recorded(Recorder::start(200).await, "").await;
    let cases = [
        ("/h2c", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABk\r\n", false),
        ("/h2c-bare", "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABk\r\n", false),
        ("/other", "Connection: upgrade\r\nUpgrade: TLS/1.2\r\n", false),
        ("/ws", "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", true),
    ];
    for (path, fields, keeps) in cases {
        let request = format!("GET {path} HTTP/1.1\r\nHost: shop\r\n{fields}\r\n");
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
        let seen = upstream.seen();
        let forwarded = seen.iter().find(|s| s.line.starts_with(&format!("GET {path} "))).expect("forwarded");
        let names: Vec<String> =
            forwarded.headers.iter().map(|h| h.split(':').next().unwrap().to_ascii_lowercase()).collect();
        assert_eq!(names.contains(&"upgrade".to_owned()), keeps, "{path}: {names:?}");
        assert!(!names.contains(&"http2-settings".to_owned()), "{path}: {names:?}");
    }
}
