//! Status and enter calls answered in the connection loop, before pingora's session
//! (`src/proxy/early.rs`), checked from a raw socket: the bytes are the full path's bytes, each request the early path
//! does not take is answered by the full path exactly as before, a keep-alive connection goes
//! back and forth between the two, and a request's body is never read as a request of its own.
//! Which path answered is told by the proxy's debug line for an early answer. The differential
//! tests send the same bytes, hostile heads included, to a proxy with the early path and to one
//! without it (`tests/differential`), and compare what the client and the upstream get.

mod common;
mod differential;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const EARLY_LINE: &str = "answered before pingora's session";
/// Longer than the freshness of the proxy's line reading (50 ms), with room for a busy machine.
const SETTLE: Duration = Duration::from_millis(300);

/// A room where nobody is admitted, whose proxy logs each early answer, with `users` in line
/// and known to the proxy's view of the line (each has been answered once by Redis).
async fn room_with(users: &[&str]) -> (RedisServer, DemoApi, Proxy) {
    let (redis, api, builder) = quiet_builder("");
    let builder = builder.env("RUST_LOG", "info,waitroom::proxy::early=debug");
    let proxy = start_settled(&redis, &builder).await;
    for user in users {
        assert_eq!(proxy.enter(user).await.status, 200);
    }
    tokio::time::sleep(SETTLE).await;
    for user in users {
        assert_eq!(status_of(&proxy.status(user).await), "WAITING");
    }
    // Each early answer's line is written once the answer is out: all of these (an enter and a
    // status per user) are in the log before a test counts from them.
    assert_early_answers(&proxy, 2 * users.len(), "the room's enters and first polls").await;
    (redis, api, proxy)
}

fn early_answers(proxy: &Proxy) -> usize {
    proxy.logs().matches(EARLY_LINE).count()
}

/// Waits for the proxy's log to settle at `want` early answers (it is written as they happen).
async fn assert_early_answers(proxy: &Proxy, want: usize, ctx: &str) {
    wait_until(Duration::from_secs(2), Duration::from_millis(20), || async { early_answers(proxy) >= want }).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(early_answers(proxy), want, "{ctx}: early answers\n{}", proxy.logs());
}

/// Waits (half a second at most: well within a 1.5 s hold) for `waitroom_held_polls` to be `want`.
async fn assert_held(proxy: &Proxy, want: f64, ctx: &str) {
    let reached = wait_until(Duration::from_millis(500), Duration::from_millis(20), || async {
        proxy.metric("waitroom_held_polls").await == Some(want)
    })
    .await;
    assert!(reached, "{ctx}: waitroom_held_polls is not {want}");
}

/// The response with its `date` line's value blanked, after checking it is one (an IMF-fixdate,
/// 29 characters): the one thing two answers a moment apart may differ in.
fn dateless(response: &str) -> String {
    let mut dates = 0;
    let lines: Vec<String> = response
        .split("\r\n")
        .map(|line| match line.to_ascii_lowercase().strip_prefix("date: ") {
            Some(value) => {
                dates += 1;
                assert!(value.len() == 29 && value.ends_with(" gmt"), "a date: {line:?}");
                "date: -".to_owned()
            }
            None => line.to_owned(),
        })
        .collect();
    assert_eq!(dates, 1, "one date line in {response:?}");
    lines.join("\r\n")
}

async fn exchange(proxy: &Proxy, request: &str) -> String {
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    read_response(&mut stream).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_answers_are_the_full_paths_byte_for_byte() {
    let (_redis, _api, proxy) = room_with(&["u1", "u2", "u3"]).await;
    let (prefix, id) = (proxy.endpoint_prefix(), proxy.identity_header());
    let at_start = early_answers(&proxy);
    // Each head as the early path takes it; the same with a `Keep-Alive` (no change to either's
    // answer) is the full path's.
    let cases = [
        ("a waiting user", format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: u2\r\n"), 200, "\"position\":2"),
        ("a query string", format!("GET {prefix}/status?t=17 HTTP/1.1\r\nHost: room\r\n{id}: u3\r\n"), 200, "\"position\":3"),
        ("keep-alive asked for", format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\nConnection: Keep-Alive\r\n{id}: u1\r\n"), 200, "\"position\":1"),
        ("no identity", format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n"), 401, "\"error\""),
        ("the identity twice", format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n{id}: u2\r\n"), 400, "\"error\""),
        // Only Redis can tell who is not in the line.
        ("a user not in line", format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: nobody\r\n"), 200, "NOT_IN_QUEUE"),
        ("an empty body declared", format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\nContent-Length: 0\r\n{id}: u1\r\n"), 200, "\"position\":1"),
        // A new user, early, then the same user again by the full path: one place.
        ("a new user's enter", format!("POST {prefix}/enter HTTP/1.1\r\nHost: room\r\nContent-Length: 0\r\n{id}: e4\r\n"), 200, "\"position\":4"),
        ("an enter of a waiting user", format!("POST {prefix}/enter HTTP/1.1\r\nHost: room\r\n{id}: u2\r\n"), 200, "\"position\":2"),
        ("an enter without identity", format!("POST {prefix}/enter HTTP/1.1\r\nHost: room\r\n"), 401, "\"error\""),
    ];
    for (n, (ctx, head, status, body)) in cases.iter().enumerate() {
        let early = exchange(&proxy, &format!("{head}\r\n")).await;
        assert_early_answers(&proxy, at_start + n + 1, ctx).await;
        let full = exchange(&proxy, &format!("{head}Keep-Alive: timeout=60\r\n\r\n")).await;
        assert_early_answers(&proxy, at_start + n + 1, &format!("{ctx}, by the full path")).await;
        assert!(early.starts_with(&format!("HTTP/1.1 {status} ")), "{ctx}: {early}");
        assert!(early.contains(body), "{ctx}: {early}");
        assert_eq!(dateless(&early), dateless(&full), "{ctx}");
    }
}

/// Heads the early path must not take, or must take exactly as pingora reads them: the same
/// bytes to a proxy with the early path and one without give the same answers, byte for byte, and
/// the same requests at the upstream, cut at the same places. Each case also says whether the
/// early path should have answered any of it, so a path that stops taking what it should (or
/// starts taking what it should not) is seen too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_heads_are_answered_alike_with_and_without_the_early_path() {
    let pair = differential::Pair::start("").await;
    let (prefix, id) = (pair.early.proxy.endpoint_prefix(), pair.early.proxy.identity_header());
    let status = format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n");
    let enter = format!("POST {prefix}/enter HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n");
    let forwarded = "POST /api/catalog HTTP/1.1\r\nHost: room\r\nContent-Length: 5\r\n\r\nhello".to_owned();
    let plain_status = format!("{status}\r\n");
    let one = |text: String| vec![text.into_bytes()];
    // (what, segments, answered early)
    let cases: Vec<(&str, Vec<Vec<u8>>, usize)> = vec![
        ("an enter, first", one(format!("{enter}\r\n")), 1),
        ("a plain status", one(plain_status.clone()), 1),
        ("obs-fold", one(format!("{status}X-Fold: a\r\n b\r\n\r\n")), 0),
        ("obs-fold in the identity", one(format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n\tu2\r\n\r\n")), 0),
        ("Content-Length twice, both 0", one(format!("{status}Content-Length: 0\r\nContent-Length: 0\r\n\r\n")), 0),
        ("Content-Length twice, different", one(format!("{enter}Content-Length: 0\r\nContent-Length: 2\r\n\r\n{{}}")), 0),
        ("Content-Length 00", one(format!("{status}Content-Length: 00\r\n\r\n")), 0),
        ("Content-Length +0", one(format!("{status}Content-Length: +0\r\n\r\n")), 0),
        ("Content-Length and chunked", one(format!("{enter}Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")), 0),
        ("chunked and Content-Length", one(format!("{enter}Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n0\r\n\r\n")), 0),
        ("chunked, then a status", one(format!("{enter}Transfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n{plain_status}")), 1),
        ("chunked, identity", one(format!("{enter}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n")), 0),
        ("Transfer-Encoding: xchunked", one(format!("{enter}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n")), 0),
        ("Transfer-Encoding twice", one(format!("{enter}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")), 0),
        ("a space before the colon", one(format!("{enter}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n")), 0),
        ("Transfer-Encoding: gzip", one(format!("{enter}Transfer-Encoding: gzip\r\n\r\n")), 0),
        ("bare LF line ends", one(format!("GET {prefix}/status HTTP/1.1\nHost: room\n{id}: u1\n\n")), 1),
        ("a NUL in a value", one(format!("{status}X-A: a\0b\r\n\r\n")), 0),
        ("a NUL in the target", one(format!("GET {prefix}/status?\0 HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n\r\n")), 0),
        ("a tab before the version", one(format!("GET {prefix}/status?a\tHTTP/1.1\r\nHost: room\r\n{id}: u1\r\n\r\n")), 0),
        ("two spaces before the version", one(format!("GET {prefix}/status  HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n\r\n")), 0),
        ("tabs in a value", one(format!("{status}X-A:\ta\tb\t\r\n\r\n")), 1),
        ("a long header", one(format!("{status}X-Long: {}\r\n\r\n", "a".repeat(16 * 1024))), 1),
        ("Expect: 100-continue", one(format!("{enter}Expect: 100-continue\r\nContent-Length: 0\r\n\r\n")), 0),
        ("Keep-Alive terms", one(format!("{status}Keep-Alive: timeout=5\r\n\r\n")), 0),
        ("Connection: close", one(format!("{status}Connection: close\r\n\r\n{plain_status}")), 0),
        ("Upgrade: h2c", one(format!("{status}Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABk\r\n\r\n")), 0),
        ("Upgrade: websocket", one(format!("{status}Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n")), 0),
        ("Host twice", one(format!("{status}Host: other\r\n\r\n")), 0),
        ("HTTP/1.0", one(format!("GET {prefix}/status HTTP/1.0\r\nHost: room\r\n{id}: u1\r\n\r\n")), 0),
        ("an absolute target", one(format!("GET http://room{prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n\r\n")), 0),
        ("a status with a body", one(format!("{status}Content-Length: {}\r\n\r\n{plain_status}", plain_status.len())), 0),
        (
            "forwarded chunked with trailers, then a status",
            one(format!("POST /api/catalog HTTP/1.1\r\nHost: room\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nX-T: 1\r\n\r\n{plain_status}")),
            1,
        ),
        (
            "forwarded with Content-Length and chunked, then a status",
            one(format!("POST /api/catalog HTTP/1.1\r\nHost: room\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{plain_status}")),
            0,
        ),
        (
            "forwarded with a body longer than declared",
            one(format!("POST /api/catalog HTTP/1.1\r\nHost: room\r\nContent-Length: 2\r\n\r\nabc{plain_status}")),
            0,
        ),
        (
            "pipelined: status, forwarded, status",
            one(format!("{plain_status}{forwarded}{plain_status}")),
            2,
        ),
        ("pipelined: a status and half a head", one(format!("{plain_status}GET {prefix}/status HTTP/1.1\r\nHo")), 1),
        ("pipelined: a status and garbage", one(format!("{plain_status}\x01\x02 garbage\r\n\r\n")), 1),
        (
            "split: a head cut everywhere, a body after",
            plain_status.as_bytes().chunks(7).map(<[u8]>::to_vec).chain([forwarded.clone().into_bytes()]).collect(),
            1,
        ),
        (
            "split: a forwarded body cut, then an enter",
            vec![forwarded[..forwarded.len() - 3].as_bytes().to_vec(), format!("{}{enter}\r\n", &forwarded[forwarded.len() - 3..]).into_bytes()],
            1,
        ),
    ];
    let mut early_at = pair.early_answers();
    for (what, segments, answered_early) in &cases {
        let (early, full) = pair.run(segments).await;
        assert!(early == full, "{what}: the two paths differ\n{}", differential::describe(segments, &early, &full));
        let statuses: Vec<&str> = early.client.split("HTTP/1.1 ").skip(1).map(|a| a.get(..3).unwrap_or(a)).collect();
        eprintln!("{what}: answers {statuses:?}, {} request(s) at the upstream", early.upstream.len());
        // The log line is written once the answer is out, which the client saw already.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let now = pair.early_answers();
        assert_eq!(now.1, 0, "{what}: the proxy without the early path answered early");
        assert_eq!(now.0 - early_at.0, *answered_early, "{what}: early answers\n{}", early.client);
        early_at = now;
        assert!(!early.client.is_empty(), "{what}: no answer at all");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_goes_between_both_paths() {
    let (_redis, _api, proxy) = room_with(&["u1", "u2"]).await;
    let (prefix, id) = (proxy.endpoint_prefix(), proxy.identity_header());
    let at_start = early_answers(&proxy);
    let status = |user: &str| format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: {user}\r\n\r\n");
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut ask = async |request: String| {
        stream.write_all(request.as_bytes()).await.unwrap();
        read_response(&mut stream).await
    };
    assert!(ask(status("u1")).await.contains("\"position\":1"));
    // The full path on the same connection (an enter with keep-alive terms), then the early one
    // again.
    let entered = ask(format!("POST {prefix}/enter HTTP/1.1\r\nHost: room\r\nKeep-Alive: timeout=60\r\n{id}: u3\r\n\r\n")).await;
    assert!(entered.starts_with("HTTP/1.1 200 ") && entered.contains("\"position\":3"), "{entered}");
    assert!(ask(status("u2")).await.contains("\"position\":2"));
    for _ in 0..3 {
        let answer = ask(status("u2")).await;
        assert!(answer.to_ascii_lowercase().contains("\r\nconnection: keep-alive\r\n"), "{answer}");
    }
    assert_early_answers(&proxy, at_start + 5, "u1, u2 and three more of u2").await;
}

/// Requests pipelined in one write (RFC 9112, 9.3.2) are each answered, in order, whichever path
/// takes each: the bytes after a head are the next requests, kept for the connection to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_each_answered_in_order() {
    let (_redis, _api, proxy) = room_with(&["u1", "u2"]).await;
    let (prefix, id) = (proxy.endpoint_prefix(), proxy.identity_header());
    let status = |user: &str| format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: {user}\r\n\r\n");
    // The full path: a status with keep-alive terms, an enter with a body, a request forwarded.
    let full = format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\nKeep-Alive: timeout=60\r\n{id}: u2\r\n\r\n");
    let with_body = format!("POST {prefix}/enter HTTP/1.1\r\nHost: room\r\nContent-Length: 2\r\n{id}: u3\r\n\r\n{{}}");
    let forwarded = "GET /api/catalog HTTP/1.1\r\nHost: room\r\n\r\n".to_owned();
    let cases: [(&str, Vec<String>, Vec<&str>); 4] = [
        ("three early ones", vec![status("u1"), status("u2"), status("u1")], vec!["\"position\":1,", "\"position\":2,", "\"position\":1,"]),
        ("early, full, early", vec![status("u2"), full, status("u1")], vec!["\"position\":2,", "\"position\":2,", "\"position\":1,"]),
        ("a body between", vec![status("u1"), with_body, status("u3")], vec!["\"position\":1,", "\"position\":3,", "\"position\":3,"]),
        ("one forwarded first", vec![forwarded, status("u2")], vec!["/api/catalog", "\"position\":2,"]),
    ];
    for (ctx, requests, bodies) in cases {
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        stream.write_all(requests.concat().as_bytes()).await.unwrap();
        for (i, body) in bodies.iter().enumerate() {
            let answer = read_response(&mut stream).await;
            assert!(answer.starts_with("HTTP/1.1 200 ") && answer.contains(body), "{ctx}, answer {i}: {answer:?}");
        }
    }
}

/// A request sent while the one before it is at the upstream (a pipelining client whose next
/// request is a packet of its own) waits for that answer, and both are answered in order on the
/// one connection, whichever path takes the next. (pingora read it as bytes sent after the end
/// of the body, dropped the forwarded request and answered neither.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_while_one_is_forwarded_waits_its_turn() {
    let redis = RedisServer::start();
    let upstream = Recorder::start_slow(200, Duration::from_millis(300)).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr()).yaml(NO_ADMISSION).start().await;
    let (prefix, id) = (proxy.endpoint_prefix(), proxy.identity_header());
    let forwarded = |path: &str| format!("POST {path} HTTP/1.1\r\nHost: room\r\nContent-Length: 2\r\n\r\n{{}}");
    let status = format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n\r\n");
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut seen = 0;
    for (ctx, next) in [("an early answer next", status.clone()), ("a forwarded one next", forwarded("/api/two"))] {
        stream.write_all(forwarded("/api/one").as_bytes()).await.unwrap();
        seen += 1;
        let reached = wait_until(Duration::from_secs(5), Duration::from_millis(5), || async { upstream.lines().len() == seen });
        assert!(reached.await, "{ctx}: the first request reached the upstream");
        stream.write_all(next.as_bytes()).await.unwrap();
        let answer = read_response(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 200 Recorded\r\n"), "{ctx}: the forwarded one's answer first: {answer:?}");
        let answer = read_response(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{ctx}: then the next's: {answer:?}");
        if next.contains("/api/two") {
            seen += 1;
            assert!(answer.contains("Recorded"), "{ctx}: {answer:?}");
        } else {
            assert!(answer.contains(r#""status":"NOT_IN_QUEUE""#), "{ctx}: {answer:?}");
        }
    }
    assert_eq!(upstream.lines(), ["POST /api/one HTTP/1.1", "POST /api/one HTTP/1.1", "POST /api/two HTTP/1.1"]);
}

/// A status head that declares a body, its body a request of its own: answered once, as the full
/// path answers it, the body read and dropped, never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_is_never_read_as_a_request() {
    let (_redis, _api, proxy) = room_with(&["u1"]).await;
    let (prefix, id) = (proxy.endpoint_prefix(), proxy.identity_header());
    let at_start = early_answers(&proxy);
    let inner = format!("GET {prefix}/status HTTP/1.1\r\n{id}: u1\r\n\r\n");
    let chunked = format!("{:x}\r\n{inner}\r\n0\r\n\r\n", inner.len());
    for (ctx, framing, body) in [
        ("Content-Length", format!("Content-Length: {}", inner.len()), inner.clone()),
        ("chunked", "Transfer-Encoding: chunked".to_owned(), chunked),
    ] {
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        let head = format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{framing}\r\n{id}: u1\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        // The body in a write of its own: the head alone is what the early path would look at.
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.write_all(body.as_bytes()).await.unwrap();
        let answer = read_response(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 200 ") && answer.contains("\"position\":1"), "{ctx}: {answer}");
        let mut more = [0u8; 64];
        let next = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut more)).await;
        assert!(
            !matches!(next, Ok(Ok(n)) if n > 0),
            "{ctx}: a second answer: {:?}",
            next.map(|r| r.map(|n| String::from_utf8_lossy(&more[..n]).into_owned()))
        );
    }
    assert_early_answers(&proxy, at_start, "a head with a body").await;
}

/// A poll near the front is held in the connection loop as on the full path: answered at the
/// hold's end (pollAfter 0) and the connection kept; a client that sends its next request during
/// the hold gets its answer, then the next request's, on the same connection; one that leaves is
/// let go at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_polls_are_held_in_the_connection_loop() {
    let (redis, _api, builder) = quiet_builder("endpoints: {hold: 1500ms}");
    let builder = builder.env("RUST_LOG", "info,waitroom::proxy::early=debug");
    let proxy = start_settled(&redis, &builder).await;
    assert_eq!(proxy.enter("u1").await.status, 200);
    // The enter's own line is written once its answer is out: counted before the polls'.
    assert_early_answers(&proxy, 1, "the enter").await;
    let (prefix, id) = (proxy.endpoint_prefix(), proxy.identity_header());
    let head = format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: u1\r\n\r\n");
    let at_start = early_answers(&proxy);

    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let (answer, took) = timed(async {
        stream.write_all(head.as_bytes()).await.unwrap();
        read_response(&mut stream).await
    })
    .await;
    assert!(took >= Duration::from_millis(1400), "held for {took:?}: {answer}");
    assert!(answer.contains(r#""position":1,"estimatedWaitTime":0,"pollAfter":0"#), "{answer}");
    assert!(answer.contains("\r\nConnection: keep-alive\r\n"), "{answer}");
    assert_early_answers(&proxy, at_start + 1, "one held poll").await;
    // The same connection carries the next poll, held again.
    stream.write_all(head.as_bytes()).await.unwrap();
    assert!(read_response(&mut stream).await.contains(r#""pollAfter":0"#));

    // The next request during the hold (a pipelining client): the held answer, then that
    // request's own, the connection kept.
    stream.write_all(head.as_bytes()).await.unwrap();
    assert_held(&proxy, 1.0, "the poll is held").await;
    let enter = format!("POST {prefix}/enter HTTP/1.1\r\nHost: room\r\n{id}: u2\r\n\r\n");
    stream.write_all(enter.as_bytes()).await.unwrap();
    let answer = read_response(&mut stream).await;
    assert!(answer.contains("\r\nConnection: keep-alive\r\n") && answer.contains(r#""position":1,"#), "{answer}");
    let answer = read_response(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 ") && answer.contains(r#""position":2,"#), "the enter sent during the hold: {answer}");
    assert_early_answers(&proxy, at_start + 4, "three held polls and the enter").await;

    // A client that leaves: its hold ends at once, and its line says nobody was answered.
    let mut leaving = TcpStream::connect(proxy.addr()).await.unwrap();
    leaving.write_all(head.as_bytes()).await.unwrap();
    assert_held(&proxy, 1.0, "the poll is held").await;
    drop(leaving);
    assert_held(&proxy, 0.0, "the hold of a client that left").await;
    assert_early_answers(&proxy, at_start + 5, "the poll left").await;
    assert!(proxy.logs().contains("status=0"), "{}", proxy.logs());
}
