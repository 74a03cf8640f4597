//! No way around the room (contract section 12): headers a client could use to slip an order
//! past the room's checks, tried with raw sockets against the real proxy, a real Redis and the
//! demo order API's echo, which shows what the upstream received.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A room whose protected route is the demo API's echo, so the upstream's view of a protected
/// request can be read back. Admission is quick so tokens come at once.
const ECHO_ROOM: &str = "admission: {interval: 20ms, batch_size: 50}\nprotected: [{method: POST, path: /api/echo}]";



/// Every value of `name` the upstream saw, from the echo's `headers` list.
fn echoed(echo: &Value, name: &str) -> Vec<String> {
    echo["headers"]
        .as_array()
        .expect("echo lists headers")
        .iter()
        .filter(|pair| pair[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .map(|pair| pair[1].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn connection_cannot_drop_the_identity_or_the_token_header() {
    let (_redis, _api, proxy) = room(&[], ECHO_ROOM).await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let request = format!(
        "POST /api/echo HTTP/1.1\r\nHost: shop\r\nX-User-Id: alice\r\nX-Entry-Token: {token}\r\n\
         Connection: close, X-User-Id, X-Entry-Token\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let raw = raw_request(proxy.addr(), request.as_bytes()).await;
    assert_eq!(http_status(&raw), 200, "{raw}");
    let echo = json_body(&raw);
    assert_eq!(echoed(&echo, "x-user-id"), ["alice"], "{echo}");
    assert_eq!(echoed(&echo, "x-entry-token"), [token.clone()], "{echo}");

    // A pass-through request keeps them too: the upstream may read the identity anywhere.
    let raw = raw_request(
        proxy.addr(),
        b"GET /api/other HTTP/1.1\r\nHost: shop\r\nX-User-Id: bob\r\nConnection: x-user-id, close\r\n\r\n",
    )
    .await;
    assert_eq!(echoed(&json_body(&raw), "x-user-id"), ["bob"], "{raw}");
}

#[tokio::test]
async fn a_second_token_header_is_refused_before_the_upstream() {
    let (_redis, api, proxy) = room(&[], "admission: {interval: 20ms, batch_size: 50}").await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    for second in [token.as_str(), "forged"] {
        let request = format!(
            "POST /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: alice\r\nX-Entry-Token: {token}\r\n\
             X-Entry-Token: {second}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
        );
        let raw = raw_request(proxy.addr(), request.as_bytes()).await;
        assert_eq!(http_status(&raw), 400, "{raw}");
        assert_eq!(json_body(&raw), serde_json::json!({"error": "the entry token header must be sent once"}));
    }
    assert_eq!(api.stats().await["completed"], 0, "nothing reached the order API");
    // The token was never claimed or spent: one copy of it still orders.
    assert_eq!(proxy.order("alice", Some(&token)).await.status, 201);
}

/// Section 12: a switch to anything but WebSocket is forwarded without `Upgrade` and
/// `HTTP2-Settings`, whether or not `Connection` names them; a WebSocket upgrade keeps `Upgrade`,
/// unless the request is protected (a protected request never switches). Read from the header
/// lines a recording upstream received (the demo API's echo leaves hop-by-hop fields out, so it
/// cannot tell).
#[tokio::test]
async fn an_h2c_upgrade_is_forwarded_without_its_upgrade_headers() {
    let redis = RedisServer::start();
    let upstream = Recorder::start(200).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr()).yaml("admission: {interval: 20ms, batch_size: 50}").start().await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let settings = "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n";
    let order = format!("POST /api/orders HTTP/1.1\r\nX-User-Id: alice\r\nX-Entry-Token: {token}\r\nContent-Length: 0\r\n");
    // (what, head without its end, the Upgrade the upstream should see)
    let cases = [
        ("h2c, named by Connection", format!("GET /1 HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n{settings}"), None),
        ("h2c, Connection silent", format!("GET /2 HTTP/1.1\r\nUpgrade: h2c\r\n{settings}"), None),
        ("h2c, Connection: keep-alive", format!("GET /3 HTTP/1.1\r\nConnection: keep-alive\r\nUpgrade: h2c\r\n{settings}"), None),
        ("h2c and websocket offered", format!("GET /4 HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket, h2c\r\n{settings}"), None),
        // pingora drops an h2c switch by itself; any other protocol is this rule's alone.
        ("another protocol, named by Connection", "GET /6 HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: TLS/1.2\r\n".to_owned(), None),
        ("another protocol, Connection silent", format!("GET /7 HTTP/1.1\r\nUpgrade: foo/2\r\n{settings}"), None),
        (
            "websocket",
            "GET /5 HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                .to_owned(),
            Some("websocket"),
        ),
        ("websocket on a protected order", format!("{order}Connection: Upgrade\r\nUpgrade: websocket\r\n"), None),
    ];
    for (n, (what, head, upgrade)) in cases.into_iter().enumerate() {
        let raw = raw_request(proxy.addr(), format!("{head}Host: shop\r\n\r\n").as_bytes()).await;
        assert_eq!(http_status(&raw), 200, "{what}: no switch of protocols: {raw}");
        let seen = upstream.seen();
        assert_eq!(seen.len(), n + 1, "{what}: one request each");
        let fields: Vec<String> = seen[n].headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        let upgrades: Vec<&str> = fields.iter().filter_map(|h| h.strip_prefix("upgrade:")).map(str::trim).collect();
        assert_eq!(upgrades, upgrade.into_iter().collect::<Vec<_>>(), "{what}: {fields:?}");
        assert!(!fields.iter().any(|h| h.starts_with("http2-settings")), "{what}: {fields:?}");
    }
}

/// Section 15: `Waitroom-Command` is removed from every response, a value the proxy does not
/// know included, on a protected response too; and an unknown value changes nothing.
#[tokio::test]
async fn an_unknown_waitroom_command_is_removed_and_ignored() {
    let redis = RedisServer::start();
    let upstream = Recorder::start_with_headers(200, &[("Waitroom-Command", "reopen-everything")]).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr()).yaml("admission: {interval: 20ms, batch_size: 50}").start().await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let order = format!(
        "POST /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: alice\r\nX-Entry-Token: {token}\r\n\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let raw = raw_request(proxy.addr(), order.as_bytes()).await;
    assert_eq!(http_status(&raw), 200, "{raw}");
    assert!(!raw.to_ascii_lowercase().contains("waitroom-command"), "{raw}");
    assert_eq!(upstream.lines(), ["POST /api/orders HTTP/1.1"], "the order reached the upstream");
    let enter = proxy.enter("bob").await;
    assert_eq!(enter.json()["status"], "WAITING", "the room is unchanged: {}", enter.body);
}

#[tokio::test]
async fn every_forwarded_for_line_counts_toward_the_client_address() {
    let (_redis, _api, proxy) = room(&[], "abuse: {identities_per_address: 1, trusted_proxies: ['127.0.0.1/32']}").await;
    // The client forges a first line; the balancer in front appends its own with the real
    // address. Each user forges another first line.
    let enter = |user: &str, forged: &str| {
        format!(
            "POST /queue/enter HTTP/1.1\r\nHost: shop\r\nX-User-Id: {user}\r\nX-Forwarded-For: {forged}\r\n\
             X-Forwarded-For: 203.0.113.7\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    let first = raw_request(proxy.addr(), enter("u1", "198.51.100.1").as_bytes()).await;
    assert_eq!(json_body(&first)["status"], "WAITING", "{first}");
    let second = raw_request(proxy.addr(), enter("u2", "198.51.100.2").as_bytes()).await;
    assert_eq!(http_status(&second), 429, "{second}");
    assert_eq!(json_body(&second)["status"], "LIMITED", "{second}");
}

#[tokio::test]
async fn jwt_mode_forwards_the_verified_identity_not_the_clients() {
    const SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = Proxy::builder(&redis.url(), api.addr())
        .yaml(ECHO_ROOM)
        .yaml("identity: {jwt: {secret_env: AROUND_JWT_SECRET}}")
        .env("AROUND_JWT_SECRET", SECRET)
        .start()
        .await;
    let jwt = hs256_jwt(SECRET, &serde_json::json!({"sub": "alice", "exp": jwt_exp_in(600)}));
    let bearer = format!("Bearer {jwt}");
    let client = proxy.client();
    send(client.post(proxy.url("/queue/enter")).header("authorization", &bearer)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let token = loop {
        let body = send(client.get(proxy.url("/queue/status")).header("authorization", &bearer)).await.json();
        if body["status"] == "READY" {
            break body["token"].as_str().unwrap().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "alice not READY within 10 s: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let echo = send(
        client
            .post(proxy.url("/api/echo"))
            .header("authorization", &bearer)
            .header("x-entry-token", &token)
            .header("x-user-id", "mallory"),
    )
    .await;
    assert_eq!(echo.status, 200, "{}", echo.body);
    assert_eq!(echoed(&echo.json(), "x-user-id"), ["alice"], "{}", echo.body);
}

/// Sends one raw request (closing the connection after it) and returns the status.
async fn raw_status(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let raw = raw_request(addr, request.as_bytes()).await;
    (http_status(&raw), raw)
}

fn post(target: &str, extra: &str) -> String {
    format!("POST {target} HTTP/1.1\r\nHost: shop\r\nX-User-Id: alice\r\n{extra}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}")
}

/// Each of `targets`, POSTed as alice's order, is refused with 400 and `{"error": error}`.
async fn assert_refused_as_ambiguous(proxy: &Proxy, targets: &[&str], error: &str) {
    for target in targets {
        let (status, raw) = raw_status(proxy.addr(), &post(target, "")).await;
        assert_eq!(status, 400, "{target}: {raw}");
        assert_eq!(json_body(&raw), serde_json::json!({"error": error}), "{target}: {raw}");
    }
}

#[tokio::test]
async fn rewritten_order_paths_never_reach_the_upstream_without_a_token() {
    let (_redis, upstream, proxy) = recorded_room(201, "").await;
    // Each is the order handler on some real backend (Express, Tomcat/Spring, Go's mux, Flask).
    for target in [
        "/api/orders",
        "/api/orders/",
        "/API/orders",
        "/api/%6Frders",
        "/api/%6frders",
        "/api/orders;x=1",
        "//api/orders",
        "/api/./orders",
        "/api/x/../orders",
        "/api//orders?x=1",
        "http://shop/api/orders",
    ] {
        let (status, raw) = raw_status(proxy.addr(), &post(target, "")).await;
        assert_eq!(status, 403, "{target}: {raw}");
        assert_eq!(json_body(&raw), serde_json::json!({"error": "an entry token is required"}), "{target}");
    }
    // The method in another case, or named by an override header on a GET.
    let lower = "post /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: alice\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let (status, raw) = raw_status(proxy.addr(), lower).await;
    // Section 12: the method matches case-insensitively, so `post` is a protected request with
    // no token: 403, as POST would get.
    assert_eq!(status, 403, "post: {raw}");
    assert_eq!(json_body(&raw), serde_json::json!({"error": "an entry token is required"}), "post");
    for header in ["X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"] {
        let request = format!("GET /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: alice\r\n{header}: post\r\nConnection: close\r\n\r\n");
        let (status, raw) = raw_status(proxy.addr(), &request).await;
        assert_eq!(status, 403, "{header}: {raw}");
    }
    assert_eq!(upstream.lines(), Vec::<String>::new(), "nothing may reach the upstream");
    // The recorder does see what is let through.
    let (status, _) = raw_status(proxy.addr(), "GET /api/catalog HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 201);
    assert_eq!(upstream.lines(), ["GET /api/catalog HTTP/1.1"]);
}

#[tokio::test]
async fn ambiguous_targets_are_refused_before_the_upstream() {
    let (_redis, upstream, proxy) = recorded_room(201, "").await;
    let targets = ["/api%2Forders", "/api%2forders", "/api%5Corders", "/api%5corders", "/api\\orders"];
    assert_refused_as_ambiguous(&proxy, &targets, "the path is ambiguous: it could name a protected path").await;
    // Climbing above the root is refused whatever the request.
    let (status, raw) =
        raw_status(proxy.addr(), "GET /../etc/passwd HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 400, "{raw}");
    assert_eq!(json_body(&raw), serde_json::json!({"error": "the path climbs above the root"}), "{raw}");
    assert_eq!(upstream.lines(), Vec::<String>::new());
}

/// Node's `new URL(req.url, base)` and Python's `urlsplit` read `//host/api/orders` as the host
/// `host` and the path `/api/orders`, which such a backend routes to its order handler; the
/// canonical path, `/host/api/orders`, is not protected.
#[tokio::test]
async fn a_target_read_as_host_and_path_is_refused_when_the_path_is_protected() {
    let (_redis, upstream, proxy) = recorded_room(201, "").await;
    let targets = ["//host/api/orders", "//host/api/orders?id=1", "/\\host/api/orders", "///host/api/orders"];
    let error = "the request target is ambiguous: read as //host/path it could name a protected path";
    assert_refused_as_ambiguous(&proxy, &targets, error).await;
    assert_eq!(upstream.lines(), Vec::<String>::new(), "nothing may reach the upstream");
    // Read either way, this path is not protected: it passes through as it came.
    let (status, raw) =
        raw_status(proxy.addr(), "GET //cdn/static/app.js HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 201, "{raw}");
    assert_eq!(upstream.lines(), ["GET //cdn/static/app.js HTTP/1.1"]);
}

#[tokio::test]
async fn a_protected_request_is_forwarded_with_the_path_that_was_checked() {
    let (_redis, upstream, proxy) = recorded_room(500, "admission: {interval: 20ms, batch_size: 50}").await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let extra = format!("X-Entry-Token: {token}\r\n");
    // 500: the token stays, so each try is checked and forwarded.
    for (target, forwarded) in [
        ("/api//./%6Frders;v=1?src=%2Fapp&x", "POST /api/orders;v=1?src=%2Fapp&x HTTP/1.1"),
        ("/API/Orders/", "POST /API/Orders/ HTTP/1.1"),
        ("/api/orders", "POST /api/orders HTTP/1.1"),
    ] {
        let (status, raw) = raw_status(proxy.addr(), &post(target, &extra)).await;
        assert_eq!(status, 500, "{target}: {raw}");
        assert_eq!(upstream.lines().last().map(String::as_str), Some(forwarded), "{target}");
    }
    // Pass-through requests keep their target byte for byte.
    raw_status(proxy.addr(), "GET /shop//a/./b%6F?q HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n").await;
    assert_eq!(upstream.lines().last().map(String::as_str), Some("GET /shop//a/./b%6F?q HTTP/1.1"));
}

#[tokio::test]
async fn a_prefix_rule_protects_everything_below_its_path() {
    let (_redis, upstream, proxy) = recorded_room(200, "protected: [{method: POST, path: /api/orders, match: prefix}]").await;
    for target in ["/api/orders", "/api/orders/42/pay", "/API/ORDERS/42/", "/api/orders;v=2/42"] {
        let (status, raw) = raw_status(proxy.addr(), &post(target, "")).await;
        assert_eq!(status, 403, "{target}: {raw}");
    }
    assert_eq!(upstream.lines(), Vec::<String>::new());
    let (status, _) = raw_status(proxy.addr(), &post("/api/ordersX", "")).await;
    assert_eq!(status, 200, "a longer name is another path");
    assert_eq!(upstream.lines(), ["POST /api/ordersX HTTP/1.1"]);
}

// ---- one admission, one order ----------------------------------------------------------------

#[tokio::test]
async fn parallel_orders_with_one_token_forward_exactly_one() {
    let (_redis, api, proxy) = room(&["--service-time-ms", "400"], "admission: {interval: 20ms, batch_size: 50}").await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let answers = futures::future::join_all((0..8).map(|_| send(proxy.order_request("alice", Some(&token))))).await;
    let mut statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    statuses.sort();
    assert_eq!(statuses, [201, 409, 409, 409, 409, 409, 409, 409], "{answers:?}");
    for refused in answers.iter().filter(|r| r.status == 409) {
        assert_eq!(refused.json(), serde_json::json!({"error": "this entry token is already in use"}));
    }
    assert_eq!(api.stats().await["completed"], 1, "one order reached the order API");
    assert_eq!(proxy.metric(r#"waitroom_protected_requests_total{result="in_use"}"#).await, Some(7.0));
    assert_eq!(proxy.order("alice", Some(&token)).await.status, 403, "spent with the one order");
}

#[tokio::test]
async fn a_failed_order_releases_the_claim_for_an_immediate_retry() {
    let (_redis, _api, proxy) = room(&[], "admission: {interval: 20ms, batch_size: 50}").await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let failed = send(proxy.order_request("alice", Some(&token)).header("x-demo-fail", "500")).await;
    assert_eq!(failed.status, 500, "{}", failed.body);
    assert_eq!(proxy.order("alice", Some(&token)).await.status, 201, "retried at once, not 409");
}

#[tokio::test]
async fn an_unreachable_upstream_releases_the_claim() {
    let redis = RedisServer::start();
    let proxy = Proxy::builder(&redis.url(), refused_addr())
        .yaml("admission: {interval: 20ms, batch_size: 50}")
        .start()
        .await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    for attempt in 0..2 {
        let r = proxy.order("alice", Some(&token)).await;
        assert_eq!(r.status, 502, "attempt {attempt}: {}", r.body);
        assert_eq!(r.json(), serde_json::json!({"error": "the upstream could not be reached"}));
    }
    // Nothing left, so nothing can have been placed: not an unknown outcome.
    assert_eq!(proxy.metric(r#"waitroom_protected_requests_total{result="unknown"}"#).await, None);
}

/// A proxy killed while its order is at the upstream leaves the claim behind: the room refuses the
/// token (409) until `token.claim_timeout`, then it works again through any proxy.
#[tokio::test]
async fn a_claim_left_by_a_dead_proxy_expires_with_claim_timeout() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--service-time-ms", "5000"]);
    let room = Proxy::builder(&redis.url(), api.addr())
        .yaml("admission: {interval: 20ms, batch_size: 50}\ntoken: {claim_timeout: 2s}\nlimits: {upstream_timeout: 1s}");
    let dying = room.start().await;
    let token = dying.until_ready("alice", Duration::from_secs(10)).await;
    let order = tokio::spawn(send(dying.order_request("alice", Some(&token))));
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(10), || async {
            api.stats().await["inFlight"].as_u64() == Some(1)
        })
        .await,
        "the order reached the order API"
    );
    // The claim was taken just before the order was forwarded, so it ends claim_timeout after
    // about now. Timed from here, not from the second proxy's start: that start takes most of a
    // second in a debug build, and a test timed from it saw an on-time expiry as 1.3 s.
    let claimed_at = std::time::Instant::now();
    dying.kill();
    let _ = order.await;
    let other = room.start().await;
    let r = other.order("alice", Some(&token)).await;
    assert_eq!(r.status, 409, "{}", r.body);
    api_set_fast(&api).await;
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(100), || async {
            other.order("alice", Some(&token)).await.status == 201
        })
        .await,
        "the claim never expired"
    );
    // Less than 2 s by the forwarding's delay and the 10 ms poll above; 1.8 s leaves that room.
    assert!(claimed_at.elapsed() >= Duration::from_millis(1800), "expired too early: {:?}", claimed_at.elapsed());
}

/// Orders take 1 ms from now on.
async fn api_set_fast(api: &DemoApi) {
    let r = http_client().put(api.url("/admin/service-time")).body(r#"{"ms":1}"#).send().await.unwrap();
    assert!(r.status().is_success(), "{r:?}");
}

// ---- an order's answer is heard, whatever its client does ------------------------------------

/// The raw order `user` sends with `token`, keeping the connection open; its body chunked or
/// of a declared length.
fn raw_order(user: &str, token: &str, chunked: bool) -> String {
    let body = if chunked { "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" } else { "Content-Length: 2\r\n\r\n{}" };
    format!("POST /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: {user}\r\nX-Entry-Token: {token}\r\n{body}")
}

/// A client that makes a move while its order is at the upstream (half-closes, closes or resets
/// its connection, or sends its next request) cannot end the order there: the upstream, a
/// backend that goes on with an order whatever its connection does, answers 201 and that answer
/// spends the token, so the same token never places a second order. (pingora dropped the
/// order at the upstream at the client's first move and the claim was released: one token
/// placed an order per try.) A client still reading gets its answer, and a next request sent
/// meanwhile is answered after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_settled_by_its_answer_whatever_its_client_does() {
    let redis = RedisServer::start();
    let upstream = Recorder::start_slow(201, Duration::from_millis(300)).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr())
        .yaml("admission: {interval: 20ms, batch_size: 50}")
        .start()
        .await;
    let moves = ["half-closes", "closes", "resets", "sends its next request"];
    let tries = moves.iter().flat_map(|m| [(*m, false), (*m, true)]);
    for (i, (move_, chunked)) in tries.enumerate() {
        let move_ = format!("{move_}{}", if chunked { " (chunked order)" } else { "" });
        let user = format!("user{i}");
        let token = proxy.until_ready(&user, Duration::from_secs(10)).await;
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        stream.write_all(raw_order(&user, &token, chunked).as_bytes()).await.unwrap();
        let reached = wait_until(Duration::from_secs(5), Duration::from_millis(5), || async { upstream.lines().len() == i + 1 });
        assert!(reached.await, "{move_}: the order reached the upstream");
        match move_.split(" (").next().unwrap() {
            "half-closes" => {
                stream.shutdown().await.unwrap();
                let answer = read_response(&mut stream).await;
                assert!(answer.starts_with("HTTP/1.1 201 "), "{move_}: {answer:?}");
            }
            "closes" => drop(stream),
            "resets" => {
                stream.set_zero_linger().unwrap();
                drop(stream);
            }
            _ => {
                let next = format!("GET /queue/status HTTP/1.1\r\nHost: shop\r\nX-User-Id: {user}\r\n\r\n");
                stream.write_all(next.as_bytes()).await.unwrap();
                let answer = read_response(&mut stream).await;
                assert!(answer.starts_with("HTTP/1.1 201 "), "{move_}: the order's answer first: {answer:?}");
                let answer = read_response(&mut stream).await;
                assert!(answer.contains(r#"{"status":"NOT_IN_QUEUE","pollAfter":null}"#), "{move_}: then the next: {answer:?}");
            }
        }
        // While the order is out its claim holds (409); once answered the token is spent (403).
        // The order takes 300 ms upstream; a claim still held after 10 s was never settled.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let repeat = loop {
            let r = proxy.order(&user, Some(&token)).await;
            if r.status != 409 {
                break r;
            }
            assert!(std::time::Instant::now() < deadline, "{move_}: the claim still held 10 s later");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(repeat.status, 403, "{move_}: the repeat with the token: {}", repeat.body);
        assert_eq!(upstream.lines().len(), i + 1, "{move_}: one order reached the upstream");
    }
}
