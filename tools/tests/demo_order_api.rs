//! Tests of the demo order backend, run as the real binary over real sockets: the proxy's
//! integration tests and the benchmarks trust what it reports, so it is checked the way they use it.
//!
//! Every test starts its own server, so stats never leak between tests running in parallel.
//! Timing assertions are lower bounds only: the CI machines are small and noisy.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use waitroom_tools::demo_api::MAX_DELAY_MS;

struct DemoApi {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl DemoApi {
    async fn start(slots: u32, service_time_ms: u64) -> Result<Self> {
        DemoApi::start_with(slots, service_time_ms, &[]).await
    }

    /// As [`DemoApi::start`], with more flags (`--client-delays`).
    async fn start_with(slots: u32, service_time_ms: u64, flags: &[&str]) -> Result<Self> {
        // The free port may be taken by someone else between our probe and the child's bind; the
        // child then exits, and we try again on another port rather than fail the test.
        for _ in 0..5 {
            let addr = free_port()?;
            let mut child = Command::new(env!("CARGO_BIN_EXE_demo-order-api"))
                .args(["--listen", &addr.to_string()])
                .args(["--slots", &slots.to_string()])
                .args(["--service-time-ms", &service_time_ms.to_string()])
                .args(flags)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .context("spawning demo-order-api")?;
            if wait_for_port(&mut child, addr).await? {
                return Ok(DemoApi {
                    child,
                    base: format!("http://{addr}"),
                    http: reqwest::Client::new(),
                });
            }
        }
        bail!("demo-order-api did not come up")
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn order(&self) -> reqwest::RequestBuilder {
        self.http.post(self.url("/api/orders"))
    }

    async fn stats(&self) -> Result<Value> {
        let resp = self.http.get(self.url("/admin/stats")).send().await?;
        assert_eq!(resp.status(), StatusCode::OK);
        Ok(resp.json().await?)
    }

    /// Polls the stats until `key` reaches `value`: the event a test waits for (an order holding
    /// its slot, a waiter leaving) happens inside the server, where the test cannot await it.
    async fn wait_for_stat(&self, key: &str, value: u64) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let stats = self.stats().await?;
            if stats[key] == value {
                return Ok(stats);
            }
            if Instant::now() > deadline {
                bail!("{key} never reached {value}: {stats}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for DemoApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server with a single slot, held by an order of `service_time_ms` that is running when this
/// returns (its answer is the handle's).
async fn one_slot_held(
    service_time_ms: u64,
) -> Result<(DemoApi, JoinHandle<reqwest::Result<reqwest::Response>>)> {
    let api = DemoApi::start(1, service_time_ms).await?;
    let holder = tokio::spawn(api.order().send());
    api.wait_for_stat("inFlight", 1).await?;
    Ok((api, holder))
}

fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// True once the port accepts connections; false if the child exited first (port taken).
async fn wait_for_port(child: &mut Child, addr: SocketAddr) -> Result<bool> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(false);
        }
        if TcpStream::connect(addr).is_ok() {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = child.kill();
    bail!("demo-order-api did not listen on {addr} within 10 s")
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    keys.sort_unstable();
    keys
}

#[tokio::test]
async fn order_answers_201_with_id_and_user() -> Result<()> {
    let api = DemoApi::start(20, 10).await?;

    let resp = api.order().header("X-User-Id", "alice").send().await?;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let first: Value = resp.json().await?;
    assert_eq!(keys(&first), ["orderId", "user"]);
    assert_eq!(first["user"], "alice");

    let resp = api.order().send().await?;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let second: Value = resp.json().await?;
    assert_eq!(second["user"], Value::Null, "no X-User-Id: user is null");
    assert!(second["orderId"].as_u64() > first["orderId"].as_u64());

    let stats = api.stats().await?;
    assert_eq!(stats["completed"], 2);
    assert_eq!(stats["failed"], 0);
    assert_eq!(stats["inFlight"], 0);
    Ok(())
}

#[tokio::test]
async fn forced_failure_answers_that_status_without_a_slot() -> Result<()> {
    // A failure that queued for the slot would take 2 s.
    let (api, slow) = one_slot_held(2000).await?;

    let started = Instant::now();
    for status in [500u16, 409, 400] {
        let resp = api
            .order()
            .header("X-Demo-Fail", status.to_string())
            .send()
            .await?;
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(
            resp.json::<Value>().await?,
            json!({"error": "forced failure"})
        );
    }
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "failures must not wait for a slot"
    );

    let stats = api.stats().await?;
    assert_eq!(stats["failed"], 3);
    assert_eq!(stats["peakInFlight"], 1);
    assert_eq!(stats["peakWaiting"], 0);

    let bad = api.order().header("X-Demo-Fail", "boom").send().await?;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert_eq!(slow.await??.status(), StatusCode::CREATED);
    Ok(())
}

#[tokio::test]
async fn echo_returns_the_request_unchanged() -> Result<()> {
    let api = DemoApi::start(20, 10).await?;

    let resp = api
        .http
        .patch(api.url("/some/path?a=1&b=two%20words"))
        .header("X-Custom", "v1")
        .header("X-Repeat", "first")
        .header("X-Repeat", "second")
        .body("hello body")
        .send()
        .await?;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-echo"], "yes");
    assert_eq!(resp.headers()["content-type"], "application/json");
    let echo: Value = resp.json().await?;
    assert_eq!(keys(&echo), ["body", "headers", "method", "path", "query"]);
    assert_eq!(echo["method"], "PATCH");
    assert_eq!(echo["path"], "/some/path");
    assert_eq!(echo["query"], "a=1&b=two%20words");
    assert_eq!(echo["body"], "hello body");
    let headers = echo["headers"].as_array().context("headers is an array")?;
    let pair = |name: &str, value: &str| json!([name, value]);
    assert!(headers.contains(&pair("x-custom", "v1")));
    assert!(headers.contains(&pair("content-length", "10")));
    let repeats: Vec<&Value> = headers.iter().filter(|h| h[0] == "x-repeat").collect();
    assert_eq!(
        repeats,
        [&pair("x-repeat", "first"), &pair("x-repeat", "second")]
    );

    // Only POST /api/orders is an order; other methods on that path are echoed too.
    let resp = api.http.get(api.url("/api/orders")).send().await?;
    assert_eq!(resp.status(), StatusCode::OK);
    let echo: Value = resp.json().await?;
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["query"], Value::Null);
    assert_eq!(echo["body"], "");

    let resp = api
        .http
        .delete(api.url("/anything"))
        .header("X-Echo-Status", "503")
        .send()
        .await?;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["x-echo"], "yes");
    assert_eq!(resp.json::<Value>().await?["path"], "/anything");
    Ok(())
}

#[tokio::test]
async fn slots_cap_concurrency_and_the_rest_wait() -> Result<()> {
    let api = DemoApi::start(20, 200).await?;

    let started = Instant::now();
    let orders: Vec<_> = (0..40).map(|_| tokio::spawn(api.order().send())).collect();
    let mut ids = Vec::new();
    for order in orders {
        let resp = order.await??;
        assert_eq!(resp.status(), StatusCode::CREATED);
        ids.push(
            resp.json::<Value>().await?["orderId"]
                .as_u64()
                .context("orderId")?,
        );
    }
    let elapsed = started.elapsed();

    // 40 orders through 20 slots of 200 ms each need two rounds.
    assert!(
        elapsed >= Duration::from_millis(380),
        "took only {elapsed:?}"
    );
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 40, "order ids are unique");

    let stats = api.stats().await?;
    assert_eq!(stats["peakInFlight"], 20);
    assert!(stats["peakWaiting"].as_u64() >= Some(1), "{stats}");
    assert_eq!(stats["completed"], 40);
    assert_eq!(stats["inFlight"], 0);
    assert_eq!(stats["waiting"], 0);
    assert_eq!(stats["slots"], 20);

    let resp = api.http.post(api.url("/admin/reset")).send().await?;
    assert_eq!(resp.status(), StatusCode::OK);
    let stats = api.stats().await?;
    for key in ["peakInFlight", "peakWaiting", "completed", "failed"] {
        assert_eq!(stats[key], 0, "{key} after reset");
    }
    Ok(())
}

#[tokio::test]
async fn service_time_can_be_changed_at_run_time() -> Result<()> {
    let api = DemoApi::start(20, 3000).await?;
    assert_eq!(api.stats().await?["serviceTimeMs"], 3000);

    let resp = api
        .http
        .put(api.url("/admin/service-time"))
        .json(&json!({"ms": 50}))
        .send()
        .await?;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(api.stats().await?["serviceTimeMs"], 50);

    let started = Instant::now();
    assert_eq!(api.order().send().await?.status(), StatusCode::CREATED);
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "the old 3 s service time was used"
    );

    let resp = api
        .http
        .put(api.url("/admin/service-time"))
        .body("fifty")
        .send()
        .await?;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(api.stats().await?["serviceTimeMs"], 50);
    Ok(())
}

#[tokio::test]
async fn with_client_delays_the_delay_header_overrides_the_service_time() -> Result<()> {
    let api = DemoApi::start_with(20, 0, &["--client-delays"]).await?;
    let started = Instant::now();
    let resp = api.order().header("X-Demo-Delay-Ms", "300").send().await?;
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let bad = api.order().header("X-Demo-Delay-Ms", "soon").send().await?;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    Ok(())
}

/// By default a client cannot choose how long its order takes (it could outlast the proxy's
/// upstream timeout): the header is ignored, a malformed one too.
#[tokio::test]
async fn without_client_delays_the_delay_header_is_ignored() -> Result<()> {
    let api = DemoApi::start(20, 0).await?;
    // Honoured, this order would take an hour: the timeout only bounds a 0 ms order.
    let resp = api
        .order()
        .header("X-Demo-Delay-Ms", MAX_DELAY_MS.to_string())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .context("the order waited for its own delay")?;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = api.order().header("X-Demo-Delay-Ms", "soon").send().await?;
    assert_eq!(resp.status(), StatusCode::CREATED, "a malformed header is not read");
    assert_eq!(api.stats().await?["completed"], 2);
    Ok(())
}

#[tokio::test]
async fn an_abandoned_order_leaves_no_phantom_waiter() -> Result<()> {
    let (api, holder) = one_slot_held(1500).await?;

    // This client gives up while queued for the only slot.
    let gave_up = api.order().timeout(Duration::from_millis(300)).send().await;
    assert!(gave_up.is_err());

    let stats = api.wait_for_stat("waiting", 0).await?;
    assert_eq!(stats["peakWaiting"], 1);
    assert_eq!(holder.await??.status(), StatusCode::CREATED);
    let stats = api.stats().await?;
    assert_eq!(stats["completed"], 1, "the abandoned order never ran");
    Ok(())
}
