//! Sale-day readiness (contract section 18, and the new sentences of sections 1 and 15), with
//! real sockets, a real Redis and a recording upstream: bypass by address and by header, a room
//! rehearsing in shadow, the paused answer, a closed event's state, `--check --no-env` and
//! `admin.listen`.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const BYPASS_ENV: &str = "WAITROOM_TEST_BYPASS_SECRET";
const SECRET: &str = "b7e2-shop-services";
const ADMIN_ENV: &str = "WAITROOM_TEST_SALE_DAY_ADMIN";
const ADMIN_TOKEN: &str = "sale-day-admin";
const BIN: &str = env!("CARGO_BIN_EXE_waitroom");

/// A client whose connections come from `source` (any 127.x address reaches a proxy on
/// 127.0.0.1): the peer address the proxy sees.
fn client_from(source: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(source.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn order_from(client: &reqwest::Client, proxy: &Proxy, user: Option<&str>) -> reqwest::RequestBuilder {
    let mut request = client.post(proxy.url("/api/orders")).body(r#"{"item":"widget"}"#);
    if let Some(user) = user {
        request = request.header("X-User-Id", user);
    }
    request
}

/// Whether the upstream saw a header named `name` on the `index`th request it recorded.
fn carried(seen: &[Seen], index: usize, name: &str) -> bool {
    let prefix = format!("{}:", name.to_ascii_lowercase());
    seen[index].headers.iter().any(|h| h.to_ascii_lowercase().starts_with(&prefix))
}

async fn counter(proxy: &Proxy, series: &str) -> f64 {
    proxy.counter(series).await
}

/// A fresh Redis, an upstream that records and answers 200, and a ready proxy between them with
/// `yaml` merged in and the admin API on (its token in `ADMIN_ENV`).
async fn admin_room(yaml: &str) -> (RedisServer, Recorder, Proxy) {
    let redis = RedisServer::start();
    let upstream = Recorder::start(200).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr())
        .yaml(yaml)
        .yaml(&format!("admin: {{token_env: {ADMIN_ENV}}}"))
        .env(ADMIN_ENV, ADMIN_TOKEN)
        .start()
        .await;
    (redis, upstream, proxy)
}

/// `GET /admin/room` on `metrics_listen`, with the admin token.
async fn admin_room_state(proxy: &Proxy) -> Value {
    send(proxy.client().get(proxy.metrics_url("/admin/room")).bearer_auth(ADMIN_TOKEN)).await.json()
}

/// `waitroom room status --config <the proxy's file>`, with the admin token in its environment.
fn room_status_command(proxy: &Proxy) -> std::process::Output {
    Command::new(BIN)
        .args(["room", "status", "--config"])
        .arg(proxy.config_path())
        .env(ADMIN_ENV, ADMIN_TOKEN)
        .output()
        .unwrap()
}

#[tokio::test]
async fn bypassing_addresses_are_the_client_address_and_never_a_forged_header() {
    let (_redis, upstream, proxy) =
        recorded_room(201, "abuse: {trusted_proxies: [127.0.0.2/32]}\nbypass: {addresses: [10.9.0.0/16, 127.0.0.3/32]}").await;

    // The peer itself in a bypass block: forwarded with no token and no identity.
    let r = send(order_from(&client_from("127.0.0.3"), &proxy, None)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    // A trusted proxy's X-Forwarded-For names the client.
    let r = send(order_from(&client_from("127.0.0.2"), &proxy, Some("u1")).header("X-Forwarded-For", "10.9.4.4")).await;
    assert_eq!(r.status, 201, "{}", r.body);
    // An untrusted peer writing the same header is refused as any tokenless order is.
    let r = send(order_from(&client_from("127.0.0.1"), &proxy, Some("u1")).header("X-Forwarded-For", "10.9.4.4")).await;
    assert_error("forged X-Forwarded-For", &r, 403);
    // Behind the trusted proxy, an entry to the right of the bypassing one is the client.
    let forged_left = "10.9.4.4, 203.0.113.9";
    let r = send(order_from(&client_from("127.0.0.2"), &proxy, Some("u1")).header("X-Forwarded-For", forged_left)).await;
    assert_error("forged entry left of the client", &r, 403);

    assert_eq!(upstream.lines(), vec!["POST /api/orders HTTP/1.1"; 2]);
    assert_eq!(counter(&proxy, r#"waitroom_protected_requests_total{result="bypassed"}"#).await, 2.0);
    assert_eq!(counter(&proxy, r#"waitroom_protected_requests_total{result="forbidden"}"#).await, 2.0);
    assert_eq!(counter(&proxy, r#"waitroom_protected_requests_total{result="forwarded"}"#).await, 0.0);
}

#[tokio::test]
async fn the_bypass_header_needs_its_secret_spends_nothing_and_never_reaches_the_upstream() {
    let redis = RedisServer::start();
    let upstream = Recorder::start(200).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr())
        .yaml(&format!(
            "admission: {{interval: 50ms}}\nprotected: [{{method: POST, path: /api/orders}}]\n\
             bypass: {{header: {{name: X-Waitroom-Bypass, secret_env: {BYPASS_ENV}}}}}"
        ))
        .env(BYPASS_ENV, SECRET)
        .start()
        .await;

    // A non-canonical target: bypassing, it is forwarded with the canonical path too.
    let r = send(proxy.client().post(proxy.url("/api//x/../orders")).header("X-Waitroom-Bypass", SECRET)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // A user holding a token bypasses: the token is neither claimed nor spent.
    let token = proxy.until_ready("alice", Duration::from_secs(5)).await;
    let r = send(proxy.order_request("alice", Some(&token)).header("X-Waitroom-Bypass", SECRET)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(counter(&proxy, "waitroom_tokens_consumed_total").await, 0.0);
    let r = proxy.order("alice", Some(&token)).await;
    assert_eq!(r.status, 200, "the token still works after a bypass: {}", r.body);
    assert_eq!(counter(&proxy, "waitroom_tokens_consumed_total").await, 1.0);

    // A wrong secret changes nothing: refused, and never seen upstream.
    for wrong in ["b7e2-shop-service", "B7E2-SHOP-SERVICES", ""] {
        let r = send(proxy.order_request("bob", None).header("X-Waitroom-Bypass", wrong)).await;
        assert_error(&format!("wrong secret {wrong:?}"), &r, 403);
    }
    // On a request the room does not protect the header changes nothing either: passed through,
    // without the secret.
    let r = send(proxy.client().get(proxy.url("/catalog")).header("X-Waitroom-Bypass", SECRET)).await;
    assert_eq!(r.status, 200);

    let seen = upstream.seen();
    let lines: Vec<&str> = seen.iter().map(|s| s.line.as_str()).collect();
    assert_eq!(
        lines,
        ["POST /api/orders HTTP/1.1", "POST /api/orders HTTP/1.1", "POST /api/orders HTTP/1.1", "GET /catalog HTTP/1.1"]
    );
    for i in 0..4 {
        assert!(!carried(&seen, i, "X-Waitroom-Bypass"), "the secret reached the upstream: {:?}", seen[i]);
    }
    assert!(!carried(&seen, 0, "X-Entry-Token"));
    assert_eq!(counter(&proxy, r#"waitroom_protected_requests_total{result="bypassed"}"#).await, 2.0);
    assert_eq!(counter(&proxy, r#"waitroom_protected_requests_total{result="forwarded"}"#).await, 1.0);
    assert_eq!(counter(&proxy, r#"waitroom_protected_requests_total{result="forbidden"}"#).await, 3.0);
}

/// `waitroom_shadow_passed_total` for the default room and `would`.
async fn shadow(proxy: &Proxy, would: &str) -> f64 {
    counter(proxy, &format!(r#"waitroom_shadow_passed_total{{room="default",would="{would}"}}"#)).await
}

#[tokio::test]
async fn a_room_in_shadow_forwards_every_protected_request_and_counts_what_it_would_refuse() {
    let redis = RedisServer::start();
    // The first order is slow, so a second one with the same token finds it claimed.
    let upstream = Recorder::start_slow_first(200, Duration::from_millis(800), 1).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr())
        .yaml(&format!("mode: shadow\nadmission: {{interval: 50ms}}\nadmin: {{token_env: {ADMIN_ENV}}}"))
        .env(ADMIN_ENV, ADMIN_TOKEN)
        .start()
        .await;
    let token = proxy.until_ready("alice", Duration::from_secs(5)).await;

    let slow = tokio::spawn({
        let request = proxy.order_request("alice", Some(&token));
        async move { send(request).await }
    });
    // Claimed once the upstream has the slow order.
    assert!(wait_until(Duration::from_secs(5), Duration::from_millis(10), || async { !upstream.lines().is_empty() }).await);
    assert_eq!(proxy.order("alice", Some(&token)).await.status, 200, "in use, forwarded");
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(proxy.order("alice", Some(&token)).await.status, 200, "spent, forwarded");
    assert_eq!(proxy.order("bob", None).await.status, 200, "no token, forwarded");
    let anonymous = send(proxy.client().post(proxy.url("/api/orders"))).await;
    assert_eq!(anonymous.status, 200, "no identity, forwarded");

    assert_eq!(upstream.lines().len(), 5, "every protected request reached the upstream");
    assert_eq!(counter(&proxy, "waitroom_tokens_consumed_total").await, 1.0, "the valid token was spent");
    assert_eq!(shadow(&proxy, "in_use").await, 1.0);
    assert_eq!(shadow(&proxy, "forbidden").await, 2.0);
    assert_eq!(shadow(&proxy, "unauthenticated").await, 1.0);
    let metrics = proxy.metrics().await;
    for result in ["forbidden", "unauthenticated", "in_use"] {
        let series = format!(r#"waitroom_protected_requests_total{{result="{result}"}}"#);
        assert_eq!(parse_metric(&metrics, &series).unwrap_or(0.0), 0.0, "{series}");
    }
    assert_eq!(parse_metric(&metrics, r#"waitroom_protected_requests_total{result="forwarded"}"#), Some(1.0));

    let room = admin_room_state(&proxy).await;
    assert_eq!(room["mode"], "shadow", "{room}");

    // Switched to active by a reload: refused again within a second.
    proxy.rewrite_config("mode: active");
    proxy.signal("HUP");
    let since = Instant::now();
    let refused = wait_until(Duration::from_secs(1), Duration::from_millis(10), || async {
        proxy.order("carol", None).await.status == 403
    })
    .await;
    assert!(refused, "mode: active not in force within 1 s:\n{}", proxy.logs());
    eprintln!("active after {:?}", since.elapsed());
    let room = admin_room_state(&proxy).await;
    assert_eq!(room["mode"], "active", "{room}");
    // ... and back.
    proxy.rewrite_config("mode: shadow");
    proxy.signal("HUP");
    let forwarded = wait_until(Duration::from_secs(1), Duration::from_millis(10), || async {
        proxy.order("carol", None).await.status == 200
    })
    .await;
    assert!(forwarded, "mode: shadow not in force within 1 s");
}

#[tokio::test]
async fn a_room_in_shadow_forwards_while_redis_is_down() {
    let (mut redis, _upstream, proxy) = recorded_room(200, "mode: shadow\nredis: {timeout: 200ms}").await;
    redis.stop();
    let r = proxy.order("alice", Some("00000000-0000-4000-8000-000000000000")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(shadow(&proxy, "unavailable").await, 1.0);
}

#[tokio::test]
async fn a_paused_room_gives_no_estimate() {
    let (_redis, _upstream, proxy) = admin_room(NO_ADMISSION).await;
    for user in ["u1", "u2", "u3"] {
        proxy.enter(user).await;
    }
    let before = proxy.status("u3").await.json();
    assert!(before["estimatedWaitTime"].as_u64().is_some(), "{before}");
    let paused = send(proxy.client().post(proxy.metrics_url("/admin/room/pause")).bearer_auth(ADMIN_TOKEN)).await;
    assert_eq!(paused.json()["state"], "paused");
    for answer in [proxy.status("u3").await, proxy.enter("u3").await, proxy.enter("u4").await] {
        let body = answer.json();
        assert_eq!(body["status"], "WAITING", "{body}");
        assert_eq!(body["estimatedWaitTime"], Value::Null, "{body}");
        assert!(body["pollAfter"].as_u64().is_some_and(|p| p >= 1), "{body}");
    }
    send(proxy.client().post(proxy.metrics_url("/admin/room/resume")).bearer_auth(ADMIN_TOKEN)).await;
    assert!(proxy.status("u3").await.json()["estimatedWaitTime"].as_u64().is_some());
}

#[tokio::test]
async fn a_room_whose_event_has_closed_is_described_as_closed() {
    let (_redis, _upstream, proxy) =
        admin_room("event: {opens_at: '2020-01-01T10:00:00Z', closes_at: '2020-01-01T12:00:00Z'}").await;
    let closed = wait_until(Duration::from_secs(3), Duration::from_millis(20), || async {
        let room = admin_room_state(&proxy).await;
        room["state"] == "closed" && room["event"] == "closed"
    })
    .await;
    assert!(closed, "{}", proxy.logs());
    let out = room_status_command(&proxy);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("state                  closed"), "{said}");
}

#[test]
fn check_no_env_checks_all_but_the_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.yaml");
    let check = |yaml: &str, args: &[&str]| {
        std::fs::write(&file, yaml).unwrap();
        Command::new(BIN)
            .arg("--config")
            .arg(&file)
            .args(args)
            .env_remove("WAITROOM_TEST_UNSET_A")
            .env_remove("WAITROOM_TEST_UNSET_B")
            .output()
            .unwrap()
    };
    let secrets = "upstream: 127.0.0.1:1\nadmin: {token_env: WAITROOM_TEST_UNSET_A}\n\
                   bypass: {header: {name: X-Bypass, secret_env: WAITROOM_TEST_UNSET_B}}\n";
    let without = check(secrets, &["--check"]);
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert_eq!(without.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("admin.token_env: environment variable WAITROOM_TEST_UNSET_A is not set"), "{stderr}");
    assert!(stderr.contains("bypass.header.secret_env: environment variable WAITROOM_TEST_UNSET_B is not set"), "{stderr}");
    let no_env = check(secrets, &["--check", "--no-env"]);
    assert_eq!(no_env.status.code(), Some(0), "{}", String::from_utf8_lossy(&no_env.stderr));
    // Everything else is still checked.
    let broken = check(&format!("{secrets}queue: {{capacity: 0}}\nmode: rehearse\n"), &["--check", "--no-env"]);
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert_eq!(broken.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("queue.capacity") && stderr.contains("mode: unknown variant `rehearse`"), "{stderr}");
    assert!(!stderr.contains("WAITROOM_TEST_UNSET"), "{stderr}");
    // --no-env only goes with --check: a proxy never starts without its secrets.
    assert_ne!(check(secrets, &["--no-env"]).status.code(), Some(0));
}

#[tokio::test]
async fn admin_listen_moves_the_admin_api_off_the_metrics_port() {
    let [admin_port] = free_ports();
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let (_redis, _upstream, proxy) = admin_room(&format!("admin: {{listen: '{admin}'}}")).await;
    let own = send(proxy.client().get(format!("http://{admin}/admin/room")).bearer_auth(ADMIN_TOKEN)).await;
    assert_eq!(own.status, 200, "{}", own.body);
    assert_eq!(own.json()["state"], "open");
    // Not on metrics_listen any more, and the probes are not on the admin address.
    let moved = send(proxy.client().get(proxy.metrics_url("/admin/room")).bearer_auth(ADMIN_TOKEN)).await;
    assert_eq!(moved.status, 404);
    assert_eq!(send(proxy.client().get(proxy.metrics_url("/metrics"))).await.status, 200);
    assert_eq!(send(proxy.client().get(format!("http://{admin}/metrics"))).await.status, 404);
    // The command line finds it there.
    let out = room_status_command(&proxy);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// In JWT mode the upstream trusts `forward_header` (X-User-Id): a request the room forwards with
/// no verified user (a refusal passed in shadow, a bypass without a JWT) carries none, whatever
/// the client wrote; a bypass with a valid JWT carries its verified user.
#[tokio::test]
async fn jwt_mode_never_forwards_an_unverified_identity_in_shadow_or_bypass() {
    const JWT_SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";
    let redis = RedisServer::start();
    let upstream = Recorder::start(200).await;
    let proxy = Proxy::builder(&redis.url(), upstream.addr())
        .yaml(&format!(
            "identity: {{jwt: {{secret_env: SALE_DAY_JWT}}}}\nmode: shadow\n\
             bypass: {{header: {{name: X-Waitroom-Bypass, secret_env: {BYPASS_ENV}}}}}"
        ))
        .env("SALE_DAY_JWT", JWT_SECRET)
        .env(BYPASS_ENV, SECRET)
        .start()
        .await;
    let jwt = hs256_jwt(JWT_SECRET, &serde_json::json!({"sub": "alice", "exp": jwt_exp_in(600)}));
    let order = || proxy.client().post(proxy.url("/api/orders")).header("x-user-id", "mallory");
    // Shadow, no JWT: forwarded as unauthenticated, without the forged identity.
    assert_eq!(send(order()).await.status, 200);
    // Bypass, no JWT: the same.
    assert_eq!(send(order().header("X-Waitroom-Bypass", SECRET)).await.status, 200);
    // Bypass with a JWT: the verified user.
    let with_jwt = order().header("X-Waitroom-Bypass", SECRET).header("authorization", format!("Bearer {jwt}"));
    assert_eq!(send(with_jwt).await.status, 200);
    let identities: Vec<Vec<String>> = upstream
        .seen()
        .iter()
        .map(|s| s.headers.iter().filter(|h| h.to_ascii_lowercase().starts_with("x-user-id:")).cloned().collect())
        .collect();
    assert_eq!(identities, vec![vec![], vec![], vec!["x-user-id: alice".to_owned()]], "{identities:?}");
    assert_eq!(shadow(&proxy, "unauthenticated").await, 1.0);
}
