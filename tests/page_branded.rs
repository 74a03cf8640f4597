//! The shop's own page (contract section 10, `page.template_file`): the branded example in
//! `examples/branded-page/` served by a running proxy, the proxy's script inserted before its
//! `</body>`, and a shopper's whole wait through it in headless Chromium (the same
//! `tests/page/e2e.mjs` run as the built-in page's), with screenshots of WAITING and READY.
//! `WAITROOM_UPDATE_SCREENSHOTS=1` copies them to `docs/img/branded-*.png`.
//!
//! Needs what tests/page.rs needs: `node`, `npm` and Chromium (or `WAITROOM_CHROMIUM`).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn example_page() -> PathBuf {
    manifest_dir().join("examples/branded-page/page.html")
}

/// A room serving the branded example, with a sign-in link.
async fn branded_room(yaml: &str) -> (RedisServer, DemoApi, Proxy) {
    room(
        &[],
        &format!(
            "page: {{template_file: '{}', sign_in_url: '/account/login'}}\n{yaml}",
            example_page().display()
        ),
    )
    .await
}

#[tokio::test]
async fn the_branded_page_is_the_shops_html_with_the_proxys_script() {
    let (_redis, _api, proxy) = branded_room("").await;
    let r = proxy.get("/queue/").await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/html")));
    let shop = std::fs::read_to_string(example_page()).unwrap();
    let at = shop.rfind("</body>").unwrap();
    assert!(r.body.starts_with(&shop[..at]), "the shop's markup is sent as written");
    assert!(r.body.ends_with(&shop[at..]));
    let inserted = &r.body[at..r.body.len() - (shop.len() - at)];
    assert!(inserted.contains(r#"<script type="module">"#) && inserted.contains(r#""signInUrl":"/account/login""#));
    // Nothing external: the page stays self-contained.
    assert!(!r.body.contains("src=\"http") && !r.body.contains("href=\"http"));
}

#[tokio::test]
async fn a_template_that_breaks_is_refused_at_load_and_at_reload() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine.html"), "<html><body><p>no hooks</p></body></html>").unwrap();
    let config = dir.path().join("proxy.yaml");
    std::fs::write(&config, "upstream: 127.0.0.1:1\npage: {template_file: mine.html}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom")).arg("--config").arg(&config).arg("--check").output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.starts_with("page.template_file: ") && said.contains(r#"data-waitroom="state""#), "{said}");

    // Running with a good one, a reload to a broken one keeps the running page.
    let (_redis, _api, proxy) = branded_room("").await;
    let before = proxy.get("/queue/").await.body;
    std::fs::write(proxy.dir().join("broken.html"), "<p data-waitroom=\"state\"></p>").unwrap();
    let errors = proxy.counter(r#"waitroom_config_reloads_total{result="error"}"#).await;
    proxy.rewrite_config("page: {template_file: broken.html}");
    proxy.signal("HUP");
    let refused = wait_until(Duration::from_secs(5), Duration::from_millis(20), || async {
        proxy.counter(r#"waitroom_config_reloads_total{result="error"}"#).await > errors
    })
    .await;
    assert!(refused, "{}", proxy.logs());
    assert!(proxy.logs().contains("</body>"), "the reload's problem names what is missing");
    assert_eq!(proxy.get("/queue/").await.body, before);
}

fn require(program: &str) {
    let found = Command::new(program).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(found.is_ok_and(|s| s.success()), "`{program}` is needed for the branded page's browser test");
}

/// A shopper's wait through the branded page, as tests/page.rs runs the built-in one.
#[tokio::test]
async fn shopper_waits_and_orders_through_the_branded_page_in_chromium() {
    require("node");
    require("npm");
    let chromium = std::env::var_os("WAITROOM_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/chromium".into());
    assert!(chromium.exists(), "{} not found (apt-get install chromium)", chromium.display());
    let page_dir = manifest_dir().join("tests/page");
    if !page_dir.join("node_modules/playwright-core/package.json").exists() {
        let ok = Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&page_dir).status();
        assert!(ok.is_ok_and(|s| s.success()), "npm ci in tests/page");
    }
    let (_redis, api, proxy) = branded_room(
        "admission: {interval: 700ms, batch_size: 1}\nendpoints: {hold: ~}\npoll_after: [{min_wait: 0s, poll_after: 1s}]",
    )
    .await;
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| manifest_dir().join("target"));
    let artifacts = target.join("page-artifacts").join(format!("branded-{}", std::process::id()));
    std::fs::create_dir_all(&artifacts).unwrap();
    let started = Instant::now();
    let out = Command::new("node")
        .arg(page_dir.join("e2e.mjs"))
        .arg(proxy.url(""))
        .arg(&artifacts)
        .args(["--prefix", "/queue", "--fill", "5", "--ready-url", "/checkout", "--user", "branded-user"])
        .env("WAITROOM_CHROMIUM", &chromium)
        .current_dir(&page_dir)
        .output()
        .expect("run node e2e.mjs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "e2e.mjs failed after {:?}:\n{stdout}\n{}", started.elapsed(), String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("JSON summary");
    assert_eq!(summary["orderStatus"], 201, "{summary}\n{}", api.logs());
    for shot in ["waiting.png", "ready.png"] {
        let path = artifacts.join(shot);
        assert!(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) > 1000, "screenshot {}", path.display());
        if std::env::var_os("WAITROOM_UPDATE_SCREENSHOTS").is_some() {
            std::fs::copy(&path, manifest_dir().join("docs/img").join(format!("branded-{shot}"))).expect("copy screenshot");
        }
    }
}

/// `node tests/page/states.mjs` on `proxy`'s page until it shows `expect`; its JSON summary.
fn states(proxy: &Proxy, expect: &str, extra: &[&str]) -> serde_json::Value {
    let chromium = std::env::var_os("WAITROOM_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/chromium".into());
    let page_dir = manifest_dir().join("tests/page");
    let artifacts = tempfile::tempdir().unwrap();
    let out = Command::new("node")
        .arg(page_dir.join("states.mjs"))
        .arg(proxy.url(""))
        .arg(artifacts.path())
        .args(["--expect", expect, "--calls", "1"])
        .args(extra)
        .env("WAITROOM_CHROMIUM", &chromium)
        .current_dir(&page_dir)
        .output()
        .expect("run node states.mjs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "states.mjs {expect}:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("JSON summary")
}

/// What the page shows besides the line (contract sections 10 and 15), through the branded page:
/// the sign-in link on 401, the seed's committed hash during an event, and a paused room's wait.
#[tokio::test]
async fn the_page_links_sign_in_shows_the_seed_hash_and_says_when_admission_is_paused() {
    require("node");
    let (_redis, _api, proxy) = branded_room("").await;
    let shown = states(&proxy, "SIGN_IN", &["--no-identity"]);
    assert_eq!(shown["signIn"], "/account/login", "{shown}");

    // A pre-queue that opened a minute ago: the seed is committed, its hash on the page.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let opens = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(now_ms + 30 * 60_000)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (_redis, _api, event) = branded_room(&format!("event: {{opens_at: '{opens}', prequeue: 31m}}")).await;
    let committed = wait_until(Duration::from_secs(5), Duration::from_millis(50), || async {
        event.get("/queue/event").await.json()["seedSha256"].is_string()
    })
    .await;
    assert!(committed, "{}", event.logs());
    let hash = event.get("/queue/event").await.json()["seedSha256"].as_str().unwrap().to_owned();
    let shown = states(&event, "PREQUEUED", &[]);
    assert_eq!(shown["seed"], hash.as_str(), "{shown}");
    assert_eq!(shown["signIn"], serde_json::Value::Null, "{shown}");

    // Paused, with others ahead: the wait is not "any moment now" but paused.
    let (admin_env, token) = ("WAITROOM_TEST_BRANDED_ADMIN", "branded-admin");
    let redis = RedisServer::start();
    let upstream = Recorder::start(200).await;
    let paused = Proxy::builder(&redis.url(), upstream.addr())
        .yaml(&format!(
            "page: {{template_file: '{}'}}\nadmission: {{interval: 1h, batch_size: 1}}\nadmin: {{token_env: {admin_env}}}",
            example_page().display()
        ))
        .env(admin_env, token)
        .start()
        .await;
    for user in ["ahead-1", "ahead-2", "ahead-3"] {
        paused.enter(user).await;
    }
    let r = send(paused.client().post(paused.metrics_url("/admin/room/pause")).bearer_auth(token)).await;
    assert_eq!(r.json()["state"], "paused", "{}", r.body);
    let shown = states(&paused, "WAITING", &[]);
    assert!(shown["eta"].as_str().is_some_and(|e| e.contains("paused")), "{shown}");
    assert!(shown["message"].as_str().is_some_and(|m| m.contains("paused")), "{shown}");
}
