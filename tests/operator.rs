//! Operator control and origin commands (contract section 15), against a real Redis with two
//! proxies of one room: the admin API's fences (404 off, 401 without the token, 404/405 on
//! paths and methods), pause and resume, close and open, a restart, the origin's
//! `Waitroom-Command`, and the `waitroom room ...` command line.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const TOKEN_ENV: &str = "WAITROOM_TEST_ADMIN_TOKEN";
const TOKEN: &str = "op-3f1c-secret";
const BIN: &str = env!("CARGO_BIN_EXE_waitroom");
/// Contract section 15: every proxy follows a change within a second.
const FOLLOW: Duration = Duration::from_secs(1);

/// A room with the admin API on, its token in the proxies' environment.
fn admin_room(redis: &RedisServer, upstream: impl std::fmt::Display, yaml: &str) -> ProxyBuilder {
    Proxy::builder(&redis.url(), upstream)
        .yaml(&format!("admin: {{token_env: {TOKEN_ENV}}}"))
        .yaml(yaml)
        .env(TOKEN_ENV, TOKEN)
}

/// A fresh Redis and demo API, and an admin room on them with `yaml` merged in.
fn fresh_admin_room(yaml: &str) -> (RedisServer, DemoApi, ProxyBuilder) {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let room = admin_room(&redis, api.addr(), yaml);
    (redis, api, room)
}

async fn admin_call(proxy: &Proxy, method: &str, path: &str, token: Option<&str>) -> Resp {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = proxy.client().request(method, proxy.metrics_url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    send(request).await
}

/// `GET /admin/room` with the token; asserts 200 and the JSON headers.
async fn look(proxy: &Proxy) -> Value {
    let r = admin_call(proxy, "GET", "/admin/room", Some(TOKEN)).await;
    assert_own_headers("GET /admin/room", r.header("content-type"), r.header("cache-control"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// `POST /admin/room/{command}` with the token; asserts 200 and returns the body.
async fn command(proxy: &Proxy, command: &str) -> Value {
    let r = admin_call(proxy, "POST", &format!("/admin/room/{command}"), Some(TOKEN)).await;
    assert_eq!(r.status, 200, "{command}: {}", r.body);
    assert_own_headers(command, r.header("content-type"), r.header("cache-control"));
    r.json()
}

/// The state `waitroom_room_state` marks with 1, when exactly one does.
async fn gauge_state(proxy: &Proxy) -> Option<&'static str> {
    let text = proxy.metrics().await;
    let on: Vec<&'static str> = ["open", "paused", "closed"]
        .into_iter()
        .filter(|s| parse_metric(&text, &format!("waitroom_room_state{{state=\"{s}\"}}")) == Some(1.0))
        .collect();
    (on.len() == 1).then(|| on[0])
}

async fn gauge_reaches(proxy: &Proxy, state: &str, within: Duration) -> bool {
    let since = Instant::now();
    let reached =
        wait_until(within, Duration::from_millis(10), || async { gauge_state(proxy).await == Some(state) }).await;
    eprintln!("waitroom_room_state {state}: {:?}", since.elapsed());
    reached
}

/// Waits until every proxy has made `n` more admission calls that admitted nobody because the
/// room was not open: `n` intervals have passed for each of them.
async fn idle_ticks(proxies: &[&Proxy], n: f64) {
    let series = "waitroom_admission_ticks_total{result=\"early\"}";
    for proxy in proxies {
        let from = proxy.counter(series).await;
        let ticked = wait_until(Duration::from_secs(10), Duration::from_millis(20), || async {
            proxy.counter(series).await >= from + n
        })
        .await;
        assert!(ticked, "no {n} idle ticks:\n{}", proxy.logs());
    }
}

fn room_body(state: &str, queue: u64, batch: u64, tokens: u64, admitted: u64) -> Value {
    json!({"state": state, "queueLength": queue, "batch": batch, "activeTokens": tokens,
           "admittedLastMinute": admitted, "event": null, "mode": "active"})
}

#[tokio::test]
async fn without_admin_token_env_there_is_no_admin_api() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let proxy = Proxy::builder(&redis.url(), api.addr()).start().await;
    for (method, path) in [("GET", "/admin/room"), ("POST", "/admin/room/close"), ("GET", "/admin")] {
        let r = admin_call(&proxy, method, path, Some(TOKEN)).await;
        assert_error(&format!("{method} {path}"), &r, 404);
    }
    assert_eq!(proxy.enter("alice").await.json()["status"], "WAITING", "the room is untouched");

    // Naming a variable that holds no token is a configuration error, with its key path.
    let yaml = format!("upstream: 127.0.0.1:1\nadmin: {{token_env: {TOKEN_ENV}}}\n");
    for (env, why) in [(vec![], "is not set"), (vec![(TOKEN_ENV, "")], "is empty")] {
        let out = run_check_env(&yaml, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&format!("admin.token_env: environment variable {TOKEN_ENV} {why}")), "{stderr}");
    }
    let ok = run_check_env(&yaml, &[(TOKEN_ENV, TOKEN)]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
}

#[test]
fn an_admin_token_with_whitespace_at_either_end_is_a_configuration_error() {
    // A token read from a secret file keeps the file's newline; no client sends it back.
    let yaml = format!("upstream: 127.0.0.1:1\nadmin: {{token_env: {TOKEN_ENV}}}\n");
    for padded in [format!("{TOKEN}\n"), format!(" {TOKEN}"), format!("{TOKEN}\t")] {
        let out = run_check_env(&yaml, &[(TOKEN_ENV, &padded)]);
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(2), "{padded:?}: {said}");
        assert!(said.contains(&format!("admin.token_env: environment variable {TOKEN_ENV} starts or ends with whitespace")), "{said}");
        assert!(!said.contains(TOKEN), "the token is never printed: {said}");
    }
}

#[tokio::test]
async fn the_admin_api_wants_the_bearer_token_a_known_path_and_the_right_method() {
    let (_redis, _api, room) = fresh_admin_room("admission: {batch_size: 7}");
    let proxy = room.start().await;

    for (token, ctx) in [(None, "no token"), (Some("op-3f1c-secreT"), "wrong token"), (Some(""), "empty token")] {
        for (method, path) in [("GET", "/admin/room"), ("POST", "/admin/room/close"), ("GET", "/admin/unknown")] {
            let r = admin_call(&proxy, method, path, token).await;
            assert_error(&format!("{ctx}: {method} {path}"), &r, 401);
            assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{ctx}");
        }
    }
    let basic = send(proxy.client().get(proxy.metrics_url("/admin/room")).basic_auth("admin", Some(TOKEN))).await;
    assert_error("Basic auth", &basic, 401);
    assert_eq!(look(&proxy).await["state"], "open", "the refused close changed nothing");

    for path in ["/admin/nothing", "/admin/room/", "/admin/room/shutdown", "/admin/roomy"] {
        assert_error(path, &admin_call(&proxy, "GET", path, Some(TOKEN)).await, 404);
    }
    for (method, path, allow) in [
        ("POST", "/admin/room", "GET"),
        ("DELETE", "/admin/room", "GET"),
        ("GET", "/admin/room/pause", "POST"),
        ("PUT", "/admin/room/close", "POST"),
    ] {
        let r = admin_call(&proxy, method, path, Some(TOKEN)).await;
        assert_error(&format!("{method} {path}"), &r, 405);
        assert_eq!(r.header("allow"), Some(allow), "{method} {path}");
    }
    assert_eq!(look(&proxy).await, room_body("open", 0, 7, 0, 0));
    // The operator endpoints beside it are unchanged.
    assert_eq!(send(proxy.client().get(proxy.metrics_url("/healthz"))).await.status, 200);
}

/// Pause holds from the moment its answer arrives, on every proxy of the room, the instant pass
/// included; the line keeps accepting and keeps its order. Resume admits again within an
/// interval.
#[tokio::test]
async fn pause_stops_admission_at_once_and_resume_restarts_it() {
    let (_redis, _api, room) = fresh_admin_room("admission: {interval: 100ms, batch_size: 1, instant: true}");
    let (a, b) = (room.start().await, room.start().await);

    let paused = command(&a, "pause").await;
    assert_eq!(paused["state"], "paused");
    // Nobody waits and the interval has room: open, this would be an instant pass.
    assert_eq!(b.enter("u0").await.json()["status"], "WAITING", "no instant pass while paused");
    for i in 1..10 {
        assert_eq!(a.enter(&format!("u{i}")).await.json()["status"], "WAITING");
    }
    assert!(gauge_reaches(&b, "paused", FOLLOW).await, "proxy b follows the pause within a second");
    idle_ticks(&[&a, &b], 3.0).await;
    let still = look(&b).await;
    assert_eq!((still["state"].clone(), still["queueLength"].clone()), (json!("paused"), json!(10)), "{still}");
    assert_eq!(b.status("u0").await.json()["position"], 1, "places are kept");
    assert_eq!(a.status("u9").await.json()["position"], 10);

    let resumed = command(&b, "resume").await;
    assert_eq!(resumed["state"], "open");
    let since = Instant::now();
    let ready = wait_until(FOLLOW, Duration::from_millis(5), || async {
        a.status("u0").await.json()["status"] == "READY"
    })
    .await;
    let took = since.elapsed();
    eprintln!("resume -> first admission seen: {took:?}");
    assert!(ready, "the first in line is admitted within a second of resume");
    assert!(gauge_reaches(&a, "open", FOLLOW).await);
    // Resuming an open room changes nothing.
    assert_eq!(command(&a, "resume").await["state"], "open");
}

/// Close empties the line at once: waiting users hear CLOSED at their next status on any proxy,
/// newcomers are refused with CLOSED, and READY users keep their tokens and may still order.
/// Open starts a new, empty line.
#[tokio::test]
async fn close_reaches_waiting_users_within_a_second_and_open_starts_a_new_line() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let conn = redis.conn().await;
    let room = admin_room(&redis, api.addr(), "admission: {interval: 1h, batch_size: 1, instant: true}");
    let a = room.start_settled(&conn).await;
    let b = room.start().await;

    let alice = a.enter("alice").await.json();
    assert_eq!(alice["status"], "READY", "the interval's one place: {alice}");
    let token = alice["token"].as_str().unwrap().to_owned();
    for user in ["bob", "carol", "dave"] {
        assert_eq!(a.enter(user).await.json()["status"], "WAITING");
        // Learned by proxy b, so that b would answer the next poll from its own view of the line.
        assert_eq!(b.status(user).await.json()["status"], "WAITING");
    }

    let closed = command(&a, "close").await;
    assert_eq!(closed, room_body("closed", 0, 1, 1, 1));
    let since = Instant::now();
    for user in ["bob", "carol", "dave"] {
        let heard = wait_until(FOLLOW, Duration::from_millis(5), || async {
            b.status(user).await.json()["status"] == "CLOSED"
        })
        .await;
        assert!(heard, "{user} hears CLOSED on the other proxy within a second");
    }
    eprintln!("close -> all three waiting users CLOSED on the other proxy: {:?}", since.elapsed());
    assert_answer("status after close", &b.status("bob").await, 200, json!({"status": "CLOSED", "pollAfter": null}));
    assert_answer("enter after close", &b.enter("erin").await, 200, json!({"status": "CLOSED", "pollAfter": null}));
    assert_eq!(a.enter("bob").await.json()["status"], "CLOSED", "a lost place is not taken again");
    assert_eq!(queue_len(&redis, &a).await, 0);
    assert!(gauge_reaches(&b, "closed", FOLLOW).await);
    assert_eq!(b.counter("waitroom_enter_total{result=\"closed\"}").await, 1.0);

    // READY users keep their token and their order goes through.
    assert_eq!(b.status("alice").await.json()["status"], "READY");
    assert_eq!(b.enter("alice").await.json()["status"], "READY");
    assert_eq!(b.order("alice", Some(&token)).await.status, 201);

    // Pause and resume cannot reopen a closed room by accident.
    for verb in ["pause", "resume"] {
        let r = admin_call(&b, "POST", &format!("/admin/room/{verb}"), Some(TOKEN)).await;
        assert_error(verb, &r, 409);
    }
    assert_eq!(look(&a).await["state"], "closed");

    let opened = command(&b, "open").await;
    assert_eq!(opened, room_body("open", 0, 1, 0, 1));
    assert!(gauge_reaches(&a, "open", FOLLOW).await);
    assert_eq!(a.status("bob").await.json(), not_in_queue(), "the old line is gone");
    assert_eq!(a.enter("bob").await.json()["position"], 1, "a new, empty line");
}

/// The state lives in Redis: proxies started after a change (every one of the room's proxies
/// restarted) keep it.
#[tokio::test]
async fn the_state_survives_a_restart_of_every_proxy() {
    let (_redis, _api, room) = fresh_admin_room("admission: {interval: 100ms, batch_size: 5}");
    let (a, b) = (room.start().await, room.start().await);
    assert_eq!(command(&a, "pause").await["state"], "paused");
    drop((a, b));

    let c = room.start().await;
    // The gauge first: a look through the admin API would tell this proxy itself.
    assert!(gauge_reaches(&c, "paused", FOLLOW).await, "a new proxy reads the state it starts into");
    assert_eq!(look(&c).await["state"], "paused");
    assert_eq!(c.enter("u1").await.json()["status"], "WAITING");
    idle_ticks(&[&c], 3.0).await;
    assert_eq!(c.status("u1").await.json()["status"], "WAITING", "still paused after the restart");

    assert_eq!(command(&c, "close").await["state"], "closed");
    c.kill();
    let d = room.start().await;
    assert!(gauge_reaches(&d, "closed", FOLLOW).await);
    assert_eq!(look(&d).await["state"], "closed");
    assert_eq!(d.enter("u2").await.json()["status"], "CLOSED");
}

/// The order API closes (or pauses) the room with a response header, which no client ever
/// sees; with `admin.origin_commands: false` the header is still removed, and ignored.
#[tokio::test]
async fn the_origin_header_steers_the_room_and_never_reaches_the_client() {
    let redis = RedisServer::start();
    let conn = redis.conn().await;
    let closing = Recorder::start_with_headers(200, &[("Waitroom-Command", "close")]).await;
    let room = admin_room(&redis, closing.addr(), "admission: {interval: 1h, batch_size: 1, instant: true}");
    let a = room.start_settled(&conn).await;
    let b = room.start().await;

    let token = a.enter("alice").await.json()["token"].as_str().expect("instant READY").to_owned();
    assert_eq!(a.enter("bob").await.json()["status"], "WAITING");
    let order = a.order("alice", Some(&token)).await;
    assert_eq!(order.status, 200, "{}", order.body);
    assert_eq!(order.header("waitroom-command"), None, "the header never reaches the client");
    assert_eq!(closing.lines().len(), 1, "the order reached the origin");
    // Obeyed before the order's answer left: the room is closed for everyone now.
    assert_eq!(b.status("bob").await.json()["status"], "CLOSED");
    assert_eq!(look(&b).await["state"], "closed");
    assert!(gauge_reaches(&b, "closed", FOLLOW).await);
    // The room's stored state names who changed it: the origin, not an operator.
    let by: Option<String> = redis::cmd("HGET")
        .arg(keys(&a).room)
        .arg("by")
        .query_async(&mut conn.clone())
        .await
        .expect("HGET room by");
    assert_eq!(by.as_deref(), Some("origin"), "the stored state names the origin as who closed the room");
    // A pass-through response is the origin's own business: not a command.
    assert_eq!(a.get("/anything").await.status, 200);

    let pausing = Recorder::start_with_headers(200, &[("Waitroom-Command", "pause")]).await;
    let room = admin_room(&redis, pausing.addr(), "admission: {interval: 1h, batch_size: 1, instant: true}");
    let p = room.start_settled(&conn).await;
    let token = p.enter("carol").await.json()["token"].as_str().expect("instant READY").to_owned();
    let order = p.order("carol", Some(&token)).await;
    assert_eq!((order.status, order.header("waitroom-command")), (200, None));
    assert_eq!(look(&p).await["state"], "paused");

    let ignoring = admin_room(&redis, closing.addr(), "admission: {interval: 1h, batch_size: 1, instant: true}")
        .yaml("admin: {origin_commands: false}");
    let q = ignoring.start_settled(&conn).await;
    let token = q.enter("dave").await.json()["token"].as_str().expect("instant READY").to_owned();
    assert_eq!(q.enter("erin").await.json()["status"], "WAITING");
    let order = q.order("dave", Some(&token)).await;
    assert_eq!((order.status, order.header("waitroom-command")), (200, None), "removed even when ignored");
    assert_eq!(look(&q).await["state"], "open");
    assert_eq!(q.status("erin").await.json()["status"], "WAITING");
}

fn cli(config: &std::path::Path, args: &[&str], token: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("room").args(args).arg("--config").arg(config).env_remove(TOKEN_ENV);
    if let Some(token) = token {
        cmd.env(TOKEN_ENV, token);
    }
    cmd.output().expect("run waitroom room")
}

fn stdout(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn failure(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn the_command_line_shows_and_steers_the_room() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let conn = redis.conn().await;
    let proxy = admin_room(&redis, api.addr(), NO_ADMISSION).start_settled(&conn).await;
    for user in ["u1", "u2"] {
        proxy.enter(user).await;
    }
    let config = proxy.config_path().to_owned();
    let table = |state: &str, waiting: u64| {
        format!(
            "state                  {state}\n\
             mode                   active\n\
             waiting                {waiting}\n\
             batch                  1 per 1h\n\
             active tokens          0\n\
             admitted (last 60 s)   0\n\
             event                  none\n"
        )
    };
    let open = "open: users join the line and are admitted";
    assert_eq!(stdout(&cli(&config, &["status"], Some(TOKEN))), table(open, 2));
    assert_eq!(
        stdout(&cli(&config, &["pause"], Some(TOKEN))),
        format!(
            "room paused: admission stopped, the line keeps its places\n\n{}",
            table("paused: users join the line, nobody is admitted", 2)
        )
    );
    assert_eq!(
        stdout(&cli(&config, &["resume"], Some(TOKEN))),
        format!("room resumed: admission runs\n\n{}", table(open, 2))
    );
    assert_eq!(
        stdout(&cli(&config, &["close"], Some(TOKEN))),
        format!(
            "room closed: nobody new gets in, waiting users hear CLOSED\n\n{}",
            table("closed: nobody new joins; holders of a token may still order", 0)
        )
    );
    assert_eq!(look(&proxy).await["state"], "closed", "the command line acted on the room");
    let refused = failure(&cli(&config, &["pause"], Some(TOKEN)));
    assert!(refused.contains("refused (409): the room is closed; only open reopens it"), "{refused}");
    assert_eq!(stdout(&cli(&config, &["open"], Some(TOKEN))), format!("room opened\n\n{}", table(open, 0)));

    let wrong = failure(&cli(&config, &["status"], Some("not-the-token")));
    assert!(wrong.starts_with("waitroom room: ") && wrong.contains("refused the token (401)"), "{wrong}");
    let unset = cli(&config, &["status"], None);
    assert_eq!(unset.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unset.stderr).contains("admin.token_env: environment variable"));

    // A configuration without admin.token_env, and a proxy that runs without it.
    let plain = Proxy::builder(&redis.url(), api.addr()).start().await;
    let not_configured = failure(&cli(plain.config_path(), &["status"], Some(TOKEN)));
    assert!(not_configured.contains("the admin API is not enabled in") && not_configured.contains("admin.token_env"));
    let mut with_admin = plain.config();
    merge_yaml(&mut with_admin, serde_yaml::from_str(&format!("admin: {{token_env: {TOKEN_ENV}}}")).unwrap());
    let elsewhere = plain.dir().join("with-admin.yaml");
    std::fs::write(&elsewhere, serde_yaml::to_string(&with_admin).unwrap()).unwrap();
    let not_enabled = failure(&cli(&elsewhere, &["status"], Some(TOKEN)));
    assert!(not_enabled.contains("has no admin API (404)"), "{not_enabled}");

    proxy.kill();
    let unreachable = failure(&cli(&config, &["status"], Some(TOKEN)));
    assert!(unreachable.contains("cannot reach the admin API at"), "{unreachable}");
}

/// `lua/room.lua` on its own: which command leads where (open keeps a paused line, only open
/// leaves closed), and the minute of admissions counting only the last 60 seconds of its ring.
#[tokio::test]
async fn the_room_script_moves_between_states_and_counts_one_minute() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let room = library_room(&redis, &prefix);
    let keys = Keys::new(&prefix);
    let state = |report: &waitroom::store::RoomReport| (report.before.clone(), report.state.clone(), report.refused.is_some());
    let s = |a: &str, b: &str, refused: bool| (a.to_owned(), b.to_owned(), refused);

    assert_eq!(state(&room.room_command("", "admin", false).await.unwrap()), s("open", "open", false));
    assert!(matches!(enter_room(&room, "u1", 10).await.unwrap(), waitroom::store::EnterOutcome::Waiting { .. }));
    assert_eq!(state(&room.room_command("pause", "admin", false).await.unwrap()), s("open", "paused", false));
    assert_eq!(state(&room.room_command("pause", "admin", false).await.unwrap()), s("paused", "paused", false));
    let opened = room.room_command("open", "admin", false).await.unwrap();
    assert_eq!((state(&opened), opened.waiting), (s("paused", "open", false), 1), "open keeps a paused line");
    let closed = room.room_command("close", "origin", false).await.unwrap();
    assert_eq!((state(&closed), closed.waiting), (s("open", "closed", false), 0));
    assert!(closed.since_ms.is_some());
    for verb in ["pause", "resume"] {
        assert_eq!(state(&room.room_command(verb, "admin", false).await.unwrap()), s("closed", "closed", true), "{verb}");
    }
    assert_eq!(
        enter_room(&room, "u2", 10).await.unwrap(),
        waitroom::store::EnterOutcome::Closed,
        "a closed room queues nobody"
    );
    let by: Option<String> =
        redis::cmd("HGET").arg(&keys.room).arg("by").query_async(&mut redis.conn().await).await.unwrap();
    assert_eq!(by.as_deref(), Some("origin"), "who changed it is stored with the state");

    // Seconds 10 and 30 ago count; 75 and 100 ago are past the minute (each in its own slot).
    let mut conn = redis.conn().await;
    let now_s = redis_now_ms(&mut conn).await / 1000;
    for (age, n) in [(10, 3), (30, 2), (75, 7), (100, 11)] {
        let second = now_s - age;
        let slot = second % 60;
        let _: () = redis::cmd("HSET")
            .arg(&keys.admitted_minute)
            .arg(format!("s{slot}"))
            .arg(second)
            .arg(format!("n{slot}"))
            .arg(n)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert_eq!(room.room_command("", "admin", false).await.unwrap().admitted_last_minute, 5);
}
