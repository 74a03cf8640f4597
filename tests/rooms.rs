//! Several rooms in one proxy (contract section 17), against a real Redis and real sockets: each
//! room's own line, tokens and keys; a request of one room never changing the other; routing by
//! prefix, protected rules and host; the room label; a reload adding and removing a room while
//! users wait in the other.

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;

/// Two drops: `sneakers` admits one user an hour (its line stays put), `console` five every
/// 100 ms (its users are READY at once) and sends its orders to its own upstream.
fn two_drops(console_upstream: &str) -> String {
    format!(
        r#"
rooms:
  - name: sneakers
    endpoints: {{ prefix: /drops/sneakers/queue }}
    protected:
      - {{ method: POST, path: /api/drops/sneakers/orders }}
    admission: {{ interval: 1h, batch_size: 1 }}
  - name: console
    endpoints: {{ prefix: /drops/console/queue }}
    protected:
      - {{ method: POST, path: /api/orders }}
    admission: {{ interval: 100ms, batch_size: 5 }}
    upstream: "{console_upstream}"
"#
    )
}

/// The admin API's token in the rooms' proxies below.
const ADMIN_TOKEN: &str = "rooms-admin-secret";

/// [`two_drops`] with the admin API on.
fn admin_drops(redis: &RedisServer, api: &DemoApi) -> ProxyBuilder {
    Proxy::builder(&redis.url(), api.addr())
        .yaml("admin: { token_env: WAITROOM_ROOMS_ADMIN }")
        .yaml(&two_drops(&api.addr().to_string()))
        .env("WAITROOM_ROOMS_ADMIN", ADMIN_TOKEN)
}

async fn enter(p: &Proxy, room: &str, user: &str) -> Resp {
    send(p.client().post(p.url(&format!("/drops/{room}/queue/enter"))).header("X-User-Id", user)).await
}

async fn status(p: &Proxy, room: &str, user: &str) -> Value {
    send(p.client().get(p.url(&format!("/drops/{room}/queue/status"))).header("X-User-Id", user)).await.json()
}

/// An order at `room`'s protected path (console's is the demo API's own `/api/orders`, so its
/// upstream counts it).
async fn order(p: &Proxy, room: &str, user: &str, token: &str) -> Resp {
    let path = if room == "console" { "/api/orders".to_owned() } else { format!("/api/drops/{room}/orders") };
    send(
        p.client()
            .post(p.url(&path))
            .header("X-User-Id", user)
            .header("X-Entry-Token", token)
            .body("{}"),
    )
    .await
}

async fn until_ready(p: &Proxy, room: &str, user: &str) -> String {
    assert_eq!(enter(p, room, user).await.status, 200);
    let ready = wait_until(Duration::from_secs(5), Duration::from_millis(20), || async {
        status(p, room, user).await["status"] == "READY"
    })
    .await;
    assert!(ready, "{user} not READY in {room}");
    status(p, room, user).await["token"].as_str().expect("a token").to_owned()
}

/// The place `user` holds in `room`'s line.
async fn position(p: &Proxy, room: &str, user: &str) -> u64 {
    let body = status(p, room, user).await;
    assert_eq!(body["status"], "WAITING", "{user} in {room}: {body}");
    body["position"].as_u64().expect("a position")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rooms_keep_their_own_lines_tokens_keys_and_series() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--service-time-ms", "1"]);
    let console_api = DemoApi::start(&["--service-time-ms", "1"]);
    let p = Proxy::builder(&redis.url(), api.addr()).yaml(&two_drops(&console_api.addr().to_string())).start().await;
    let prefix = p.key_prefix();

    // Sneakers: the first user may take the hour's one admission; the next three wait, in order.
    for user in ["s0", "s1", "s2", "s3"] {
        assert_eq!(enter(&p, "sneakers", user).await.status, 200);
    }
    let waiting: Vec<u64> = [position(&p, "sneakers", "s2").await, position(&p, "sneakers", "s3").await].to_vec();
    assert_eq!(waiting[1], waiting[0] + 1, "sneakers' line: {waiting:?}");

    // Console: its own line and rate. A user waiting in sneakers gets a place of their own here,
    // and neither line moves the other.
    let token = until_ready(&p, "console", "s3").await;
    assert_eq!(position(&p, "sneakers", "s3").await, waiting[1], "entering console moved s3's sneakers place");

    // A console token buys a console order, at console's own upstream; sneakers refuses it.
    let refused = order(&p, "sneakers", "s3", &token).await;
    assert_eq!(refused.status, 403, "a console token at sneakers: {}", refused.body);
    let placed = order(&p, "console", "s3", &token).await;
    assert!((200..300).contains(&placed.status), "{}", placed.body);
    assert_eq!(console_api.stats().await["completed"], 1, "console's upstream took the order");
    assert_eq!(api.stats().await["completed"], 0, "the proxy's upstream did not");

    // Each room's keys under its own hash tag.
    let conn = redis.conn().await;
    let queued: u64 = redis::cmd("ZCARD").arg(format!("{{{prefix}:sneakers}}:queue")).query_async(&mut conn.clone()).await.unwrap();
    assert!(queued >= 3, "sneakers' line under {{{prefix}:sneakers}}: {queued}");
    let default_queue: u64 = redis::cmd("EXISTS").arg(format!("{{{prefix}}}:queue")).query_async(&mut conn.clone()).await.unwrap();
    assert_eq!(default_queue, 0, "no room default runs beside configured rooms");

    // The top-level prefix is no room's: it passes through to the upstream.
    let top = p.get("/queue/status").await;
    assert_eq!(top.status, 200, "{}", top.body);
    assert!(top.body.contains("/queue/status"), "the demo API's echo: {}", top.body);

    // Series by room.
    let metrics = p.metrics().await;
    for (series, want) in [
        (r#"waitroom_enter_total{result="queued",room="sneakers"}"#, 4.0),
        (r#"waitroom_tokens_consumed_total{room="console"}"#, 1.0),
        (r#"waitroom_tokens_consumed_total{room="sneakers"}"#, 0.0),
    ] {
        assert_eq!(parse_metric(&metrics, series), Some(want), "{series}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_with_a_host_serves_only_that_host() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    // One prefix and one order path, each room on its own host.
    let room = |name: &str| format!("{{ name: {name}, host: {name}.shop.example, endpoints: {{ prefix: /q }} }}");
    let yaml = format!("rooms: [{}, {}]", room("eu"), room("us"));
    let p = Proxy::builder(&redis.url(), api.addr()).yaml(&yaml).start().await;
    let enter_at = |host: &'static str, user: &'static str| {
        send(p.client().post(p.url("/q/enter")).header("Host", host).header("X-User-Id", user))
    };
    for user in ["a", "b", "c"] {
        assert_eq!(enter_at("EU.shop.example:8080", user).await.status, 200);
    }
    // us has a line of its own: its first user is not behind eu's three.
    let us = enter_at("us.shop.example", "z").await.json();
    assert!(us["position"].as_u64().unwrap_or(0) <= 1, "us's first user: {us}");
    // A host no room names: the path is nobody's, and passes through.
    let other = enter_at("other.example", "y").await;
    assert!(other.body.contains("/q/enter"), "the demo API's echo: {}", other.body);
}

/// A reload that changes a running room's protected rules is followed by the next request, in
/// the routing of every room; its host and prefix wait for a restart (section 17), logged so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_a_rooms_rules_and_keeps_its_host_and_prefix() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let drop = |host: &str, prefix: &str, order: &str| {
        format!(
            "rooms:\n  - {{ name: other, endpoints: {{ prefix: /other }}, protected: [{{ method: POST, path: /api/other }}] }}\n  - {{ name: drop, host: {host}, endpoints: {{ prefix: {prefix} }}, protected: [{{ method: POST, path: {order} }}] }}\n"
        )
    };
    let p = Proxy::builder(&redis.url(), api.addr()).yaml(&drop("old.shop.example", "/q", "/api/a")).start().await;
    let post = |host: &'static str, path: &'static str| {
        send(p.client().post(p.url(path)).header("Host", host).header("X-User-Id", "u").header("X-Entry-Token", "nope"))
    };
    assert_eq!(post("old.shop.example", "/api/a").await.status, 403, "the room's order path, a wrong token");
    assert_eq!(post("old.shop.example", "/api/b").await.status, 200, "not protected yet: passes through");

    p.rewrite_config(&drop("new.shop.example", "/line", "/api/b"));
    p.signal("HUP");
    let applied = wait_until(Duration::from_secs(2), Duration::from_millis(20), || async {
        post("old.shop.example", "/api/b").await.status == 403
    })
    .await;
    assert!(applied, "the room's new order path not protected after the reload:\n{}", p.logs());
    assert_eq!(post("old.shop.example", "/api/a").await.status, 200, "the old order path passes through");
    // Host and prefix as they were, until a restart.
    let enter = send(p.client().post(p.url("/q/enter")).header("Host", "old.shop.example").header("X-User-Id", "a")).await;
    assert_eq!(enter.json()["position"].as_u64(), Some(1), "{}", enter.body);
    assert_eq!(post("new.shop.example", "/api/b").await.status, 200, "another host: not the room's");
    let logs = p.logs();
    for key in ["rooms.endpoints.prefix", "rooms.host"] {
        assert!(logs.contains(&format!("needs a restart to take effect; keeping the running value key=\"{key}\"")), "{key} not logged:\n{logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_and_removes_a_room_while_users_wait_in_the_other() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let one_room = r#"
rooms:
  - name: sneakers
    endpoints: { prefix: /drops/sneakers/queue }
    protected: [{ method: POST, path: /api/drops/sneakers/orders }]
    admission: { interval: 1h, batch_size: 1 }
"#;
    let p = Proxy::builder(&redis.url(), api.addr()).yaml(one_room).start().await;
    for user in ["s0", "s1", "s2"] {
        assert_eq!(enter(&p, "sneakers", user).await.status, 200);
    }
    let s2 = position(&p, "sneakers", "s2").await;

    // Add console: it answers within a second; sneakers' line is as it was.
    p.rewrite_config(&two_drops(&api.addr().to_string()));
    p.signal("HUP");
    let added = wait_until(Duration::from_secs(1), Duration::from_millis(20), || async {
        enter(&p, "console", "c1").await.json()["status"].is_string()
    })
    .await;
    assert!(added, "console not served within 1 s of the reload:\n{}", p.logs());
    assert_eq!(position(&p, "sneakers", "s2").await, s2);

    // Remove sneakers: its paths pass through; its line stays in Redis, and comes back with it.
    let console_only = two_drops(&api.addr().to_string()).replace(
        "  - name: sneakers\n    endpoints: { prefix: /drops/sneakers/queue }\n    protected:\n      - { method: POST, path: /api/drops/sneakers/orders }\n    admission: { interval: 1h, batch_size: 1 }\n",
        "",
    );
    assert!(!console_only.contains("sneakers"), "{console_only}");
    p.rewrite_config(&console_only);
    p.signal("HUP");
    let removed = wait_until(Duration::from_secs(2), Duration::from_millis(20), || async {
        enter(&p, "sneakers", "s9").await.body.contains("/drops/sneakers/queue/enter")
    })
    .await;
    assert!(removed, "sneakers still served after its removal:\n{}", p.logs());
    assert!(enter(&p, "console", "c2").await.json()["status"].is_string(), "console goes on");
    // Its series go with it: a frozen queue gauge would keep a removed room's alerts firing.
    let forgotten = wait_until(Duration::from_secs(2), Duration::from_millis(50), || async {
        !p.metrics().await.contains("room=\"sneakers\"")
    })
    .await;
    let leftover: Vec<String> =
        p.metrics().await.lines().filter(|line| line.contains("room=\"sneakers\"")).map(str::to_owned).collect();
    assert!(forgotten, "a removed room's series are still exported: {leftover:#?}");
    assert!(p.metrics().await.contains("waitroom_queue_length{room=\"console\"}"), "console's series stay");

    p.rewrite_config(&two_drops(&api.addr().to_string()));
    p.signal("HUP");
    let back = wait_until(Duration::from_secs(2), Duration::from_millis(20), || async {
        status(&p, "sneakers", "s2").await["position"].as_u64() == Some(s2)
    })
    .await;
    assert!(back, "sneakers' line not resumed: {}", status(&p, "sneakers", "s2").await);
    let gauge_back = wait_until(Duration::from_secs(2), Duration::from_millis(50), || async {
        // The line is s0 to s2, and s9 when its probe came before the removal took effect.
        let text = p.metrics().await;
        [s2, s2 + 1].iter().any(|length| text.contains(&format!("waitroom_queue_length{{room=\"sneakers\"}} {length}\n")))
    })
    .await;
    let now: Vec<String> = p.metrics().await.lines().filter(|line| line.contains("queue_length")).map(str::to_owned).collect();
    assert!(gauge_back, "sneakers' queue gauge not back after it was added again (s2 at {s2}): {now:#?}");
}

/// `/admin/rooms` lists every room in configuration order; `/admin/rooms/NAME/...` acts on one
/// room, and a pause there leaves the other admitting; an unknown name is a 404 naming it; the
/// `waitroom room --room NAME` client reaches the same room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_names_each_room() {
    const TOKEN: &str = ADMIN_TOKEN;
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--service-time-ms", "1"]);
    let p = admin_drops(&redis, &api).start().await;
    let admin = |method: &'static str, path: &'static str| {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        send(p.client().request(method, p.metrics_url(path)).bearer_auth(TOKEN))
    };
    let all = admin("GET", "/admin/rooms").await;
    assert_eq!(all.status, 200, "{}", all.body);
    let names: Vec<String> = all.json()["rooms"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(names, ["sneakers", "console"]);
    // The GET /admin/room body with "name" first, keys in the contract's order.
    let first = all.body.split("},{").next().unwrap();
    let at = |key: &str| first.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("no {key}: {first}"));
    let order = ["name", "state", "queueLength", "batch", "activeTokens", "admittedLastMinute", "event", "mode"].map(at);
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{first}");
    assert!(first.starts_with(r#"{"rooms":[{"name":"sneakers","state":"#), "{first}");

    let paused = admin("POST", "/admin/rooms/console/pause").await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    assert_eq!(paused.json()["state"], "paused");
    assert_eq!(admin("GET", "/admin/rooms/sneakers").await.json()["state"], "open", "the other room is untouched");
    let unknown = admin("GET", "/admin/rooms/shoes").await;
    assert_eq!((unknown.status, unknown.json()), (404, serde_json::json!({"error": "no room shoes"})));
    // Two rooms and no `default`: the unnamed path names none.
    assert_eq!(admin("GET", "/admin/room").await.status, 404);

    // A paused console admits nobody; sneakers still answers its own line.
    assert_eq!(enter(&p, "console", "c1").await.status, 200);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(status(&p, "console", "c1").await["status"], "WAITING", "a paused room admitted");

    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["room", "resume", "--room", "console", "--config"])
        .arg(p.config_path())
        .env("WAITROOM_ROOMS_ADMIN", TOKEN)
        .output()
        .expect("run waitroom room");
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    assert_eq!(admin("GET", "/admin/rooms/console").await.json()["state"], "open");
    let ready = wait_until(Duration::from_secs(3), Duration::from_millis(20), || async {
        status(&p, "console", "c1").await["status"] == "READY"
    })
    .await;
    assert!(ready, "console admits again after resume");
}

/// What the proxy sent Redis while `for_how_long` passed, as MONITOR saw it: each command by
/// name, the commands a script ran inside Redis left out (they are not calls the proxy made).
async fn calls_sent(redis: &RedisServer, for_how_long: Duration) -> std::collections::BTreeMap<String, u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut monitor = tokio::net::TcpStream::connect(redis.addr()).await.unwrap();
    monitor.write_all(b"MONITOR\r\n").await.unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + for_how_long;
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, monitor.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let mut calls = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&seen).lines() {
        // +1700000000.123456 [0 127.0.0.1:40000] "evalsha" ...   (a script's own: [0 lua])
        let Some((_, rest)) = line.split_once(']') else { continue };
        if line.contains(" lua]") {
            continue;
        }
        let name = rest.trim().split('"').nth(1).unwrap_or("?").to_ascii_lowercase();
        *calls.entry(name).or_insert(0) += 1;
    }
    calls
}

/// A room nobody uses costs each proxy at most 5 Redis calls a second (contract section 17),
/// for one room and for fifty, and wakes at its next request: the first enter is admitted within
/// the interval. Every call counts, the proxy's own keep-alive pings included: a proxy whose one
/// room is idle is held to the 5 as well. The numbers are printed:
/// `cargo test --test rooms idle -- --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_room_costs_a_few_calls_a_second_and_wakes_at_its_next_request() {
    for rooms in [1usize, 50] {
        let redis = RedisServer::start();
        let api = DemoApi::start(&[]);
        let yaml: String = (0..rooms)
            .map(|i| format!("  - {{ name: r{i}, endpoints: {{ prefix: /r{i}/queue }}, protected: [{{ method: POST, path: /api/r{i}/orders }}] }}\n"))
            .collect();
        let p = Proxy::builder(&redis.url(), api.addr()).yaml(&format!("rooms:\n{yaml}")).start().await;
        // One poll opens the request path's connection (and its keepalive), as any proxy that
        // served a request has it; then quiet once nothing has asked for 5 s, the line empty.
        let poll = send(p.client().get(p.url("/r0/queue/status")).header("X-User-Id", "nobody")).await;
        assert_eq!(poll.status, 200, "{}", poll.body);
        tokio::time::sleep(Duration::from_millis(6500)).await;
        let window = Duration::from_secs(5);
        let calls = calls_sent(&redis, window).await;
        let pings = calls.get("ping").copied().unwrap_or(0);
        let all: u64 = calls.values().sum();
        let per_room = all as f64 / window.as_secs_f64() / rooms as f64;
        println!("{rooms} idle room(s): {per_room:.2} calls a second each, {pings} of them keep-alive pings in {window:?}; {calls:?}");
        assert!(per_room <= 5.0, "{rooms} idle rooms: {per_room:.2} calls a second each: {calls:?}");

        // The next request wakes the room: its first user is admitted within the interval
        // (100 ms), give or take the polls.
        let entered = std::time::Instant::now();
        let first = send(p.client().post(p.url("/r0/queue/enter")).header("X-User-Id", "first")).await;
        assert_eq!(first.status, 200, "{}", first.body);
        let ready = wait_until(Duration::from_secs(1), Duration::from_millis(10), || async {
            send(p.client().get(p.url("/r0/queue/status")).header("X-User-Id", "first")).await.json()["status"] == "READY"
        })
        .await;
        println!("{rooms} room(s): READY {:?} after the first enter", entered.elapsed());
        assert!(ready, "a woken room admitted nobody within a second");
    }
}

/// Two proxies of one fleet (one Redis, one key prefix) serve the same two rooms: a room's line,
/// tokens and state are the room's on both, and nothing of one room reaches the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_serve_the_same_rooms() {
    const TOKEN: &str = ADMIN_TOKEN;
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--service-time-ms", "1"]);
    let fleet = admin_drops(&redis, &api);
    let (a, b) = (fleet.start().await, fleet.start().await);

    // One sneakers line across both proxies.
    for user in ["s0", "s1", "s2"] {
        assert_eq!(enter(&a, "sneakers", user).await.status, 200);
    }
    let on_a = position(&a, "sneakers", "s2").await;
    assert_eq!(position(&b, "sneakers", "s2").await, on_a, "the same place through the other proxy");
    assert_eq!(enter(&b, "sneakers", "s3").await.json()["position"].as_u64(), Some(on_a + 1));

    // A console token from one proxy buys a console order on the other, and nothing at sneakers.
    let token = until_ready(&a, "console", "c1").await;
    assert_eq!(order(&b, "sneakers", "c1", &token).await.status, 403);
    let placed = order(&b, "console", "c1", &token).await;
    assert!((200..300).contains(&placed.status), "{}", placed.body);

    // A pause of console through one proxy's admin API is followed by the other within a second,
    // and leaves sneakers open on both.
    let paused = send(a.client().post(a.metrics_url("/admin/rooms/console/pause")).bearer_auth(TOKEN)).await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    let followed = wait_until(Duration::from_secs(1), Duration::from_millis(20), || async {
        send(b.client().get(b.metrics_url("/admin/rooms/console")).bearer_auth(TOKEN)).await.json()["state"] == "paused"
    })
    .await;
    assert!(followed, "the other proxy did not follow console's pause within a second");
    let sneakers = send(b.client().get(b.metrics_url("/admin/rooms/sneakers")).bearer_auth(TOKEN)).await.json();
    assert_eq!(sneakers["state"], "open", "{sneakers}");
}
