//! The API description, `docs/openapi.yaml` (issue 19), held against the contract and against a
//! running proxy:
//!
//! - openapi-spec-validator accepts it as OpenAPI 3.1;
//! - it lists, for every operation, each status the contract gives it, with `Retry-After` where
//!   the contract sends one and `Cache-Control: no-store` on every JSON answer of `listen`;
//! - schemathesis, generating valid and invalid requests from it (and, through its links, the
//!   enter -> status -> order flow with real tokens), finds live proxies true to it: real Redis,
//!   the demo order API as the upstream, no 5xx from a healthy room, and every status, content
//!   type, header and body as described, in a room that admits at once, in one whose upstream is
//!   gone (502), in a crowded one (FULL, LIMITED, TOO_EARLY) and in one whose Redis is gone (503).
//!
//! The tools are Python, pinned in `docs/requirements-api.txt` and installed by
//! `scripts/lib.sh`'s `ensure_api_tools` (run by `scripts/test.sh`) into `target/api-tools`. A
//! missing tool, or another version than the pinned one, fails the test with the command that
//! installs it: skipping would let CI pass without checking anything.
//!
//! Every operation is in one of the schemathesis runs: the event endpoints in a room with a
//! drop, the others in rooms without one; `every_operation_is_in_a_live_run` keeps a new tag
//! from hiding one.

mod common;

use common::*;
use serde_yaml::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn repo_file(relative: &str) -> PathBuf {
    Path::new(REPO).join(relative)
}

fn spec_path() -> PathBuf {
    repo_file("docs/openapi.yaml")
}

fn spec() -> Value {
    let text = std::fs::read_to_string(spec_path()).expect("read docs/openapi.yaml");
    serde_yaml::from_str(&text).expect("docs/openapi.yaml is YAML")
}

// ---- the pinned tools ---------------------------------------------------------------------------

// Found, and their pins checked, by `common::api_tool` (tests/common/api_tools.rs).
use common::api_tool as tool;

/// What a tool printed, each line cut to 600 characters: openapi-spec-validator prints the whole
/// document as the context of an error.
fn said(out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .map(|l| match l.char_indices().nth(600) {
            Some((cut, _)) => format!("{} [...]", &l[..cut]),
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---- the document itself ------------------------------------------------------------------------

#[test]
fn openapi_spec_validator_accepts_the_spec() {
    let out = Command::new(tool("openapi-spec-validator"))
        .arg(spec_path())
        .output()
        .expect("run openapi-spec-validator");
    assert!(
        out.status.success(),
        "openapi-spec-validator refuses docs/openapi.yaml:\n{}",
        said(&out)
    );
}

/// One operation of the spec.
struct Op {
    id: String,
    method: String,
    path: String,
    /// Served on `listen` (the document's own server), not on `metrics_listen` (a path-level
    /// server of its own).
    on_listen: bool,
    op: Value,
}

fn operations(spec: &Value) -> Vec<Op> {
    let mut ops = Vec::new();
    for (path, item) in spec["paths"].as_mapping().expect("paths") {
        for (method, op) in item.as_mapping().expect("path item") {
            let method = method.as_str().unwrap();
            if ["servers", "parameters", "summary", "description"].contains(&method) {
                continue;
            }
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path:?} has no operationId"));
            ops.push(Op {
                id: id.to_owned(),
                method: method.to_owned(),
                path: path.as_str().unwrap().to_owned(),
                on_listen: item.get("servers").is_none(),
                op: op.clone(),
            });
        }
    }
    ops
}

/// Follows a local `$ref` (`#/components/...`) until a non-reference.
fn resolve<'a>(spec: &'a Value, mut v: &'a Value) -> &'a Value {
    while let Some(r) = v.get("$ref").and_then(Value::as_str) {
        let pointer = r.strip_prefix("#/").expect("local $ref");
        v = pointer.split('/').fold(spec, |node, key| &node[key]);
    }
    v
}

/// The statuses the contract gives each operation (sections 3, 4, 9, 10, 12, 14, 15, 16), the
/// method check's 405 included. A status the contract adds must be added here and to the spec.
const CONTRACT: &[(&str, &[&str])] = &[
    (
        "enter",
        &[
            "200", "400", "401", "405", "408", "413", "429", "431", "503",
        ],
    ),
    (
        "status",
        &[
            "200", "400", "401", "405", "408", "413", "429", "431", "503",
        ],
    ),
    ("waitingPage", &["200"]),
    (
        "order",
        &[
            "400", "401", "403", "408", "409", "431", "502", "503", "504", "default",
        ],
    ),
    ("event", &["200", "405", "503"]),
    ("eventDraw", &["200", "404", "405", "503"]),
    ("metrics", &["200"]),
    ("healthz", &["200"]),
    ("readyz", &["200", "503"]),
    ("adminRoom", &["200", "401", "404", "405", "503"]),
    ("adminPause", &["200", "401", "404", "405", "409", "503"]),
    ("adminResume", &["200", "401", "404", "405", "409", "503"]),
    ("adminClose", &["200", "401", "404", "405", "409", "503"]),
    ("adminOpen", &["200", "401", "404", "405", "409", "503"]),
    ("adminRooms", &["200", "401", "404", "405", "503"]),
    ("adminNamedRoom", &["200", "401", "404", "405", "503"]),
    ("adminNamedCommand", &["200", "401", "404", "405", "409", "503"]),
];

#[test]
fn the_spec_lists_every_status_and_header_of_the_contract() {
    let spec = spec();
    let ops = operations(&spec);
    let mut problems = Vec::new();
    for (id, statuses) in CONTRACT {
        let Some(Op {
            method, path, op, ..
        }) = ops.iter().find(|o| o.id == *id)
        else {
            problems.push(format!("no operation {id}"));
            continue;
        };
        for status in *statuses {
            if op["responses"].get(*status).is_none() {
                problems.push(format!("{method} {path} ({id}): no {status} response"));
            }
        }
    }
    for Op {
        id,
        method,
        path,
        on_listen,
        op,
    } in &ops
    {
        if !CONTRACT.iter().any(|(c, _)| c == id) {
            problems.push(format!(
                "{method} {path} ({id}) is not in this test's CONTRACT table"
            ));
        }
        let on_listen = *on_listen;
        for (status, response) in op["responses"].as_mapping().unwrap() {
            let status = status.as_str().unwrap();
            let response = resolve(&spec, response);
            let headers = &response["headers"];
            let header = |name: &str| headers.get(name).map(|h| resolve(&spec, h));
            let json = response["content"].get("application/json").is_some();
            // FULL, TOO_EARLY, LIMITED (429) and Redis unavailable (503) carry Retry-After.
            if on_listen && (status == "429" || status == "503") && header("Retry-After").is_none()
            {
                problems.push(format!("{method} {path} {status}: no Retry-After"));
            }
            if let Some(h) = header("Retry-After") {
                if h["required"].as_bool() != Some(true) {
                    problems.push(format!(
                        "{method} {path} {status}: Retry-After not required"
                    ));
                }
            }
            if on_listen && json && status != "default" {
                let no_store = header("Cache-Control")
                    .map(|h| h["schema"]["const"].as_str() == Some("no-store"))
                    .unwrap_or(false);
                if !no_store {
                    problems.push(format!(
                        "{method} {path} {status}: a JSON answer of the proxy without \
                         Cache-Control: no-store"
                    ));
                }
            }
            if status == "405" && header("Allow").is_none() {
                problems.push(format!("{method} {path} 405: no Allow"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/openapi.yaml against the contract:\n  {}",
        problems.join("\n  ")
    );
}

/// The live runs choose operations by tag (`LISTEN`, `DROP`, `METRICS_LISTEN`): an operation
/// with none of their tags would be in no run at all.
#[test]
fn every_operation_is_in_a_live_run() {
    let spec = spec();
    let run_tags = ["queue", "page", "protected", "event", "operations", "admin"];
    for Op {
        id,
        method,
        path,
        op,
        ..
    } in operations(&spec)
    {
        let tags: Vec<&str> = op["tags"]
            .as_sequence()
            .map(|t| t.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(
            tags.iter().any(|t| run_tags.contains(t)),
            "{method} {path} ({id}) has tags {tags:?}, none of which a schemathesis run includes"
        );
    }
}

// ---- schemathesis against live proxies ---------------------------------------------------------

/// One schemathesis run of the spec against `base_url`, limited by `args` (operations, phases,
/// checks); `examples` test cases per operation and phase keep the whole test within a minute.
/// Runs in a temporary folder so nothing it writes lands in the repository. Fails with
/// schemathesis's own report, which names each failing request as a `curl` line and the seed
/// that replays the run.
async fn schemathesis(what: &str, base_url: String, examples: u32, args: &[&str]) {
    let st = tool("schemathesis");
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    // Blocking for the run's length: off the runtime's threads, which the test still uses.
    let (out, elapsed) = tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().expect("tempdir");
        let started = Instant::now();
        let out = Command::new(&st)
            .arg("--no-color")
            .arg("--config-file")
            .arg(repo_file("tests/openapi/schemathesis.toml"))
            .arg("run")
            .arg(spec_path())
            .args(["--url", &base_url])
            // Valid and invalid requests both (schemathesis's default, said out loud).
            .args(["--mode", "all"])
            .args(["--max-examples", &examples.to_string()])
            .args(["--request-timeout", "10"])
            .args(&args)
            .current_dir(dir.path())
            .output()
            .expect("run schemathesis");
        (out, started.elapsed())
    })
    .await
    .expect("schemathesis task");
    let report = said(&out);
    let summary = report.lines().rev().find(|l| l.starts_with('='));
    eprintln!(
        "schemathesis, {what}: {} in {elapsed:.1?}",
        summary.unwrap_or("(no summary)")
    );
    assert!(
        out.status.success(),
        "schemathesis found {what} untrue to docs/openapi.yaml ({}):\n{report}",
        out.status
    );
    // A run that tested nothing would pass too: make sure the operations were there.
    assert!(
        report.contains("Tested:") && !report.contains("Tested: 0"),
        "schemathesis tested no operation of {what}:\n{report}"
    );
}

/// The operations of `listen` in a room without an event: the queue, the page and the protected
/// order. (Without an `event` the event paths answer 404; `DROP` runs them in a room with one.)
const LISTEN: &[&str] = &[
    "--exclude-tag",
    "event",
    "--exclude-tag",
    "operations",
    "--exclude-tag",
    "admin",
];
/// The operator endpoints on `metrics_listen`, the admin API among them: the rooms below name
/// `ADMIN_TOKEN_ENV` in `admin.token_env`, and these runs send its token (schemathesis's
/// `ignored_auth` check still tries each operation without it and expects the 401).
const METRICS_LISTEN: &[&str] = &[
    "--include-tag",
    "operations",
    "--include-tag",
    "admin",
    "-H",
    "Authorization: Bearer schemathesis-admin-token",
];
/// The scheduled event's endpoints, in a room whose pre-queue is open.
const DROP: &[&str] = &["--include-tag", "event"];
const ADMIN_TOKEN_ENV: &str = "WAITROOM_OPENAPI_ADMIN_TOKEN";
const ADMIN_TOKEN: &str = "schemathesis-admin-token";
/// The operator endpoints have no links to follow.
const NO_STATEFUL: &[&str] = &["--phases", "examples,coverage,fuzzing"];

fn with<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    a.iter().chain(b).copied().collect()
}

/// A proxy on `redis` and `api` with `yaml` merged in and the admin API on (its token
/// `ADMIN_TOKEN`), so the run covers `/admin` too.
async fn with_admin(redis: &RedisServer, api: &DemoApi, yaml: &str) -> Proxy {
    Proxy::builder(&redis.url(), api.addr())
        .yaml(yaml)
        .yaml(&format!("admin: {{token_env: {ADMIN_TOKEN_ENV}}}"))
        .env(ADMIN_TOKEN_ENV, ADMIN_TOKEN)
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_the_proxy_true_to_the_spec() {
    let started = Instant::now();
    let redis = RedisServer::start();
    let api = DemoApi::start(&["--service-time-ms", "1"]);

    // A room that admits at once: enter answers READY, so the links (enter -> status -> order)
    // carry real tokens to the upstream, which spends them; reusing one gets 403.
    let flowing = with_admin(&redis, &api, "admission: {interval: 10ms, batch_size: 100, instant: true}").await;
    schemathesis(
        "a room that admits at once (listen)",
        flowing.url(""),
        20,
        LISTEN,
    )
    .await;
    schemathesis(
        "the operator endpoints (metrics_listen)",
        flowing.metrics_url(""),
        10,
        &with(METRICS_LISTEN, NO_STATEFUL),
    )
    .await;
    // The links carried real tokens to the upstream: without them the order would only ever
    // have been refused, and its forwarded path never checked.
    let spent = flowing.counter("waitroom_tokens_consumed_total").await;
    assert!(
        spent > 0.0,
        "no order of the run was forwarded and spent its token: the spec's links broke"
    );

    // Two rooms with a drop: one an hour away, its pre-queue open (the event answers its phase
    // and the seed's commitment, the draw 404 until the opening), and one that has opened (the
    // seed revealed, the draw listed).
    let rfc3339_in = |seconds: i64| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        chrono::DateTime::from_timestamp(now + seconds, 0)
            .expect("a time")
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let drop_room = |opens_at: String| {
        format!(
            "redis: {{key_prefix: {}}}\nevent: {{opens_at: \"{opens_at}\", prequeue: 2h}}",
            unique_prefix()
        )
    };
    let coming = Proxy::builder(&redis.url(), api.addr())
        .yaml(&drop_room(rfc3339_in(3600)))
        .start()
        .await;
    let opened = Proxy::builder(&redis.url(), api.addr())
        .yaml(&drop_room(rfc3339_in(2)))
        .start()
        .await;
    for user in ["ann", "ben", "cat"] {
        assert_eq!(opened.enter(user).await.status, 200, "{user} enters the pre-queue");
    }
    let client = http_client();
    let event_url = opened.url("/queue/event");
    let open = wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
        let req = client.get(&event_url);
        async move { try_send(req).await.is_ok_and(|r| r.body.contains("\"phase\":\"open\"")) }
    })
    .await;
    assert!(open, "the drop never opened");
    schemathesis("a drop's pre-queue (listen)", coming.url(""), 10, &with(DROP, NO_STATEFUL)).await;
    schemathesis("a drop that has opened (listen)", opened.url(""), 10, &with(DROP, NO_STATEFUL)).await;

    // A room whose upstream is gone: the same flow, but a real token's order finds nobody to
    // forward to, and the proxy answers 502 itself (the token kept). The 502 is the contract's
    // answer here, so not_a_server_error is left out; its status, headers and body are checked.
    let stranded = Proxy::builder(&redis.url(), refused_addr())
        .yaml("admission: {interval: 10ms, batch_size: 100, instant: true}")
        .start()
        .await;
    schemathesis(
        "a room whose upstream is gone (listen)",
        stranded.url(""),
        10,
        // Only the links lead to a forwarded order; the other phases add nothing here.
        &with(
            LISTEN,
            &[
                "--phases",
                "stateful",
                "--exclude-checks",
                "not_a_server_error",
            ],
        ),
    )
    .await;
    let metrics = stranded.metrics().await;
    assert!(
        parse_metric(
            &metrics,
            r#"waitroom_upstream_responses_total{class="error"}"#
        )
        .unwrap_or(0.0)
            > 0.0,
        "no order of the run reached the point of forwarding (no 502 seen):\n{metrics}"
    );

    // A crowded room: admission is held (one batch an hour, spent at start on an empty line), the
    // line holds 3, each address may bring 5 identities a minute, and polls are enforced. Its
    // answers are WAITING, FULL, LIMITED, TOO_EARLY and NOT_IN_QUEUE.
    let crowded = Proxy::builder(&redis.url(), api.addr())
        .yaml(
            "admission: {interval: 1h, batch_size: 1}\nqueue: {capacity: 3}\n\
             abuse: {identities_per_address: 5}\npolling: {enforce: true}",
        )
        .start()
        .await;
    schemathesis(
        "a crowded room (listen)",
        crowded.url(""),
        15,
        &with(LISTEN, &["--phases", "coverage,fuzzing"]),
    )
    .await;
    let metrics = crowded.metrics().await;
    for series in [
        r#"waitroom_enter_total{result="full"}"#,
        r#"waitroom_enter_total{result="limited"}"#,
        r#"waitroom_status_total{status="TOO_EARLY"}"#,
    ] {
        assert!(
            parse_metric(&metrics, series).unwrap_or(0.0) > 0.0,
            "the crowded room never answered {series}: the run did not see that answer\n{metrics}"
        );
    }

    // A room whose Redis is gone: enter, status and the order fail closed with 503 and
    // Retry-After, /readyz answers 503. Here 503 is the contract's answer, so not_a_server_error
    // is left out; the status, headers and body are still checked.
    let mut lost = RedisServer::start();
    let orphan = with_admin(&lost, &api, "redis: {timeout: 200ms}").await;
    lost.crash();
    let noticed = orphan.until_readyz(503, Duration::from_secs(5)).await;
    assert!(noticed, "the proxy did not notice its Redis was gone");
    let no_5xx_check = ["--exclude-checks", "not_a_server_error"];
    schemathesis(
        "a room whose Redis is gone (listen)",
        orphan.url(""),
        5,
        // Every answer waits for Redis to fail: the coverage phase's valid and invalid cases
        // are enough here.
        &with(&with(LISTEN, &["--phases", "coverage"]), &no_5xx_check),
    )
    .await;
    schemathesis(
        "the operator endpoints while Redis is gone (metrics_listen)",
        orphan.metrics_url(""),
        5,
        &with(&with(METRICS_LISTEN, NO_STATEFUL), &no_5xx_check),
    )
    .await;
    let metrics = orphan.metrics().await;
    assert!(
        parse_metric(&metrics, r#"waitroom_enter_total{result="error"}"#).unwrap_or(0.0) > 0.0,
        "the orphaned room never answered enter with 503:\n{metrics}"
    );
    eprintln!("schemathesis: all runs in {:.1?}", started.elapsed());
}
