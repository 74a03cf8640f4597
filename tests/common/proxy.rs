//! The waitroom binary as a child process with a generated `proxy.yaml`.
//!
//! The config is a base the harness owns (free ports, the given upstream and Redis, a key_prefix
//! unique to the builder) deep-merged with YAML the test passes. Reusing one builder (or passing
//! the same `key_prefix`) starts proxies that share one room; separate builders never do.

use super::client::{http_client, send, Resp};
use super::free_ports;
use super::process::{has_exited, kill_and_reap, read_logs, signal, spawn_logged};
use serde_yaml::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tempfile::TempDir;

const BUILT: &str = env!("CARGO_BIN_EXE_waitroom");

/// The proxy the tests run: this tree's, or the binary `WAITROOM_TEST_BIN` names (an older
/// build, to see a test fail on the bug it is named after).
fn bin() -> String {
    std::env::var("WAITROOM_TEST_BIN").unwrap_or_else(|_| BUILT.to_owned())
}
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// `t` + 12 hex digits: unique per call, so parallel tests in one Redis could not collide either.
pub fn unique_prefix() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// The part of the config the harness controls.
pub fn base_config(
    listen: SocketAddr,
    metrics_listen: SocketAddr,
    upstream: &str,
    redis_url: &str,
    key_prefix: &str,
) -> Value {
    // Held polls (endpoints.hold, on by default) are off here: the tests of the other sections
    // ask for answers at once, as those sections describe them, and a poll near the front would
    // otherwise wait for its admission. tests/held_polls.rs switches them on, or leaves the
    // default, on purpose.
    serde_yaml::from_str(&format!(
        "listen: \"{listen}\"\nmetrics_listen: \"{metrics_listen}\"\nupstream: \"{upstream}\"\n\
         redis: {{url: \"{redis_url}\", key_prefix: \"{key_prefix}\"}}\nendpoints: {{hold: 0s}}\n"
    ))
    .expect("base config is valid YAML")
}

/// Deep merge: mappings merge key by key, anything else (scalars, sequences) replaces. A null in
/// the overlay removes the key, e.g. `redis: {url: ~, cluster: [...]}` swaps url for cluster.
pub fn merge_yaml(into: &mut Value, overlay: Value) {
    match (into, overlay) {
        (_, Value::Null) => {} // an empty overlay changes nothing
        (Value::Mapping(base), Value::Mapping(over)) => {
            for (k, v) in over {
                if v.is_null() {
                    base.remove(&k);
                } else if let Some(existing) = base.get_mut(&k) {
                    merge_yaml(existing, v);
                } else {
                    base.insert(k, v);
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// `base` with each overlay (YAML text) merged in order, as YAML text. Panics on bad overlay YAML.
pub fn merged_config_yaml(mut base: Value, overlays: &[&str]) -> String {
    for o in overlays {
        merge_yaml(&mut base, parse_overlay(o));
    }
    serde_yaml::to_string(&base).expect("serialize config")
}

fn parse_overlay(yaml: &str) -> Value {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("test overlay is not YAML ({e}):\n{yaml}"))
}

/// `waitroom --config F --check` on `config_yaml` taken verbatim (no base merged in).
pub fn run_check(config_yaml: &str) -> Output {
    run_check_env(config_yaml, &[])
}

/// `run_check` with extra environment variables (e.g. a JWT `secret_env`).
pub fn run_check_env(config_yaml: &str, env: &[(&str, &str)]) -> Output {
    let dir = tempfile::Builder::new()
        .prefix("waitroom-check")
        .tempdir()
        .expect("tempdir");
    let path = dir.path().join("proxy.yaml");
    std::fs::write(&path, config_yaml).expect("write config");
    Command::new(bin())
        .arg("--config")
        .arg(&path)
        .arg("--check")
        .envs(env.iter().copied())
        .current_dir(dir.path())
        .output()
        .expect("run waitroom --check")
}

/// Value of one Prometheus series, `series` written as exposed (labels in any order), e.g.
/// `waitroom_enter_total{result="queued"}`. A series that names no `room` is the sum over every
/// room's series of that name and labels, as `sum without (room)` reads them: with one room, the
/// room `default`'s, plus for the per-request series those of requests that belong to no room
/// (`room=""`). A series that names its room is read exactly.
pub fn parse_metric(text: &str, series: &str) -> Option<f64> {
    let (name, wanted) = split_series(series);
    let any_room = !wanted.iter().any(|(label, _)| label == "room");
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((line_series, value)) = line.rsplit_once(' ') else { continue };
        let (line_name, mut labels) = split_series(line_series);
        if line_name != name {
            continue;
        }
        if any_room {
            labels.retain(|(label, _)| label != "room");
        }
        if labels == wanted {
            let Ok(value) = value.parse::<f64>() else { continue };
            *found.get_or_insert(0.0) += value;
        }
    }
    found
}

/// A series' name and its labels, sorted by name.
fn split_series(series: &str) -> (&str, Vec<(String, String)>) {
    let Some((name, rest)) = series.split_once('{') else { return (series, Vec::new()) };
    let body = rest.strip_suffix('}').unwrap_or(rest);
    let mut labels: Vec<(String, String)> = body
        .split("\",")
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| {
            let (label, value) = pair.split_once('=')?;
            Some((label.trim().to_owned(), value.trim().trim_matches('"').to_owned()))
        })
        .collect();
    labels.sort();
    (name, labels)
}

#[derive(Clone, Debug)]
pub struct ProxyBuilder {
    redis_url: String,
    upstream: String,
    key_prefix: String,
    overlays: Vec<String>,
    env: Vec<(String, String)>,
    files: Vec<(PathBuf, String)>,
    listen_ip: std::net::IpAddr,
}

impl ProxyBuilder {
    /// Listen on `ip` (e.g. 0.0.0.0) instead of 127.0.0.1, on a port the harness picks afresh at
    /// each start attempt (a port written into the YAML would be reused by a retry).
    pub fn listen_ip(mut self, ip: std::net::IpAddr) -> Self {
        self.listen_ip = ip;
        self
    }

    /// Merged over the base, in call order; may override anything, `listen` included.
    pub fn yaml(mut self, yaml: &str) -> Self {
        self.overlays.push(yaml.to_owned());
        self
    }

    /// The room; builders with the same prefix (and Redis) share it.
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.key_prefix = prefix.to_owned();
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// A file written next to proxy.yaml before start (relative paths in the config, e.g. a JWT
    /// `public_key_file`, resolve against that folder).
    pub fn file(mut self, relative_path: &str, contents: &str) -> Self {
        self.files.push((relative_path.into(), contents.to_owned()));
        self
    }

    /// The config a proxy on these ports would get. Pure, for tests of the harness itself.
    pub fn config(&self, listen: SocketAddr, metrics_listen: SocketAddr) -> Value {
        let mut cfg = base_config(
            listen,
            metrics_listen,
            &self.upstream,
            &self.redis_url,
            &self.key_prefix,
        );
        for o in &self.overlays {
            merge_yaml(&mut cfg, parse_overlay(o));
        }
        cfg
    }

    /// Spawns without waiting for readiness: for tests that expect start-up to fail
    /// (then `wait_exit`) or that wait themselves (`wait_ready`).
    pub fn spawn(&self) -> Proxy {
        let dir = tempfile::Builder::new()
            .prefix("waitroom-proxy")
            .tempdir()
            .expect("tempdir");
        for (rel, contents) in &self.files {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).expect("create file dir");
            std::fs::write(&path, contents).expect("write file");
        }
        let [listen_port, metrics_port] = free_ports();
        let listen = SocketAddr::new(self.listen_ip, listen_port);
        let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
        let config = self.config(listen, metrics);
        // Report the addresses the proxy will really use, should the test have overridden them.
        let addr_at = |key: &str, default| {
            config
                .get(key)
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
                .unwrap_or(default)
        };
        let (listen, metrics) = (
            addr_at("listen", listen),
            addr_at("metrics_listen", metrics),
        );
        let config_path = dir.path().join("proxy.yaml");
        std::fs::write(&config_path, serde_yaml::to_string(&config).unwrap())
            .expect("write config");

        let mut cmd = Command::new(bin());
        cmd.arg("--config")
            .arg(&config_path)
            .current_dir(dir.path());
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = spawn_logged(&mut cmd, dir.path(), "proxy");
        Proxy {
            child: Mutex::new(child),
            config: Mutex::new(config),
            listen,
            metrics,
            config_path,
            dir,
            client: http_client(),
        }
    }

    /// Starts a proxy and waits for its room's first admission tick, which happens at start while
    /// the line is still empty: with a long interval nobody is admitted afterwards, so positions
    /// stay exactly as entered. The tick is seen through the schedule key it writes
    /// (`{prefix}:admission:next`), read on `conn` (a single server's or a cluster's).
    pub async fn start_settled<C>(&self, conn: &C) -> Proxy
    where
        C: redis::aio::ConnectionLike + Clone + Send,
    {
        let proxy = self.start().await;
        let key = super::store::keys(&proxy).next_admission;
        let ticked = super::wait_until(Duration::from_secs(10), Duration::from_millis(10), || {
            let mut conn = conn.clone();
            let key = key.clone();
            async move {
                redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async::<i64>(&mut conn)
                    .await
                    .is_ok_and(|n| n == 1)
            }
        })
        .await;
        assert!(
            ticked,
            "no first admission tick within 10 s:\n{}",
            proxy.logs()
        );
        proxy
    }

    /// Spawns and waits until `/healthz` answers 200 and `listen` accepts TCP. Retries on new
    /// ports when the proxy lost a free-port race; panics with the proxy's output otherwise.
    pub async fn start(&self) -> Proxy {
        let mut last_error = String::new();
        for _ in 0..3 {
            let proxy = self.spawn();
            match proxy.wait_ready(START_TIMEOUT).await {
                Ok(()) => return proxy,
                Err(e) => last_error = e,
            }
            let lower = last_error.to_ascii_lowercase();
            if !(lower.contains("in use") || lower.contains("addrinuse")) {
                break;
            }
        }
        panic!("waitroom did not start: {last_error}");
    }
}

pub struct Proxy {
    child: Mutex<Child>,
    config: Mutex<Value>,
    listen: SocketAddr,
    metrics: SocketAddr,
    config_path: PathBuf,
    dir: TempDir,
    client: reqwest::Client,
}

impl Proxy {
    /// `upstream`: anything printing as `host:port`, e.g. `DemoApi::addr()`.
    pub fn builder(redis_url: &str, upstream: impl std::fmt::Display) -> ProxyBuilder {
        ProxyBuilder {
            redis_url: redis_url.to_owned(),
            upstream: upstream.to_string(),
            key_prefix: unique_prefix(),
            overlays: Vec::new(),
            env: Vec::new(),
            files: Vec::new(),
            listen_ip: [127, 0, 0, 1].into(),
        }
    }

    /// Polls every 20 ms; Err (with the proxy's output) on early exit or timeout.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let healthz = self.metrics_url("/healthz");
        loop {
            if let Some(status) = self.try_exit_status() {
                return Err(format!("exited early ({status}):\n{}", self.logs()));
            }
            let healthy = self
                .client
                .get(&healthz)
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if healthy && self.serves_listen().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("not ready within {timeout:?}:\n{}", self.logs()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Whether this proxy's own process listens on `listen`'s port, as the kernel says. A
    /// connect is not enough: pingora retries a bind that finds the port taken, and meanwhile
    /// whoever took it (another test's server, on a port `free_port` handed out twice) accepts.
    /// Asking the proxy itself would be counted in its metrics, which tests compare exactly.
    async fn serves_listen(&self) -> bool {
        super::process::listening_addrs(self.pid()).iter().any(|a| a.port() == self.listen.port())
    }

    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    pub fn metrics_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.metrics)
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The folder holding proxy.yaml and the proxy's logs; its working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The room this proxy serves, as configured (after overlays).
    pub fn key_prefix(&self) -> String {
        self.config_str(&["redis", "key_prefix"])
            .expect("redis.key_prefix")
    }

    /// The config file as last written.
    pub fn config(&self) -> Value {
        self.config.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap().id()
    }

    /// stdout then stderr of the proxy so far.
    pub fn logs(&self) -> String {
        read_logs(self.dir.path(), "proxy")
    }

    /// Merges `extra_yaml` over the current config (base + builder overlays + earlier rewrites)
    /// and writes the file in place; follow with `signal("HUP")` unless `reload.watch` is on.
    pub fn rewrite_config(&self, extra_yaml: &str) {
        let mut cfg = self.config.lock().unwrap();
        merge_yaml(&mut cfg, parse_overlay(extra_yaml));
        std::fs::write(&self.config_path, serde_yaml::to_string(&*cfg).unwrap())
            .expect("write config");
    }

    /// Writes `text` verbatim (e.g. broken YAML for a failed reload); `config()` is not updated.
    pub fn write_config_raw(&self, text: &str) {
        std::fs::write(&self.config_path, text).expect("write config");
    }

    /// `kill -<sig> <pid>`, e.g. "HUP", "TERM", "INT".
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// The exit status once the process exits, None if it still runs after `timeout`.
    /// Async so requests in flight on the test's runtime keep going meanwhile.
    pub async fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn try_exit_status(&self) -> Option<ExitStatus> {
        self.child.lock().unwrap().try_wait().expect("try_wait")
    }

    pub fn is_running(&self) -> bool {
        !has_exited(&mut self.child.lock().unwrap())
    }

    /// SIGKILL: a crash, no graceful shutdown.
    pub fn kill(&self) {
        kill_and_reap(&mut self.child.lock().unwrap());
    }

    // ---- HTTP -------------------------------------------------------------------------------

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// `POST {prefix}/enter` as `user` (the configured identity header).
    pub async fn enter(&self, user: &str) -> Resp {
        let url = self.url(&format!("{}/enter", self.endpoint_prefix()));
        send(self.client.post(url).header(self.identity_header(), user)).await
    }

    /// `GET {prefix}/status` as `user`.
    pub async fn status(&self, user: &str) -> Resp {
        let url = self.url(&format!("{}/status", self.endpoint_prefix()));
        send(self.client.get(url).header(self.identity_header(), user)).await
    }

    /// The first `protected` route (default `POST /api/orders`) as `user`, with `token` in the
    /// configured token header when given, and a small JSON order as the body.
    pub async fn order(&self, user: &str, token: Option<&str>) -> Resp {
        send(self.order_request(user, token)).await
    }

    /// The request `order` sends, for a test to add headers to (e.g. the demo API's
    /// `X-Demo-Fail`, or `X-Demo-Delay-Ms` when it was started with `--client-delays`).
    pub fn order_request(&self, user: &str, token: Option<&str>) -> reqwest::RequestBuilder {
        let route = self
            .config()
            .get("protected")
            .and_then(|p| p.get(0))
            .cloned();
        let field = |k: &str, d: &str| {
            route
                .as_ref()
                .and_then(|r| r.get(k))
                .and_then(Value::as_str)
                .unwrap_or(d)
                .to_owned()
        };
        let method =
            reqwest::Method::from_bytes(field("method", "POST").as_bytes()).expect("method");
        let mut req = self
            .client
            .request(method, self.url(&field("path", "/api/orders")))
            .header(self.identity_header(), user)
            .header("content-type", "application/json")
            .body(r#"{"item":"widget","quantity":1}"#);
        if let Some(token) = token {
            let header = self
                .config_str(&["token", "header"])
                .unwrap_or("X-Entry-Token".into());
            req = req.header(header, token);
        }
        req
    }

    /// Enters `user` and polls status every 20 ms until READY; returns the token.
    /// Not for tests with `polling.enforce` (it polls faster than told).
    pub async fn until_ready(&self, user: &str, timeout: Duration) -> String {
        let first = self.enter(user).await;
        assert_eq!(first.status, 200, "enter {user}: {}", first.body);
        let deadline = Instant::now() + timeout;
        loop {
            let body = self.status(user).await.json();
            if body["status"] == "READY" {
                return body["token"]
                    .as_str()
                    .expect("READY carries a token")
                    .to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "{user} not READY within {timeout:?}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `GET path` on `listen` without identity (pass-through, the waiting page, ...).
    pub async fn get(&self, path: &str) -> Resp {
        send(self.client.get(self.url(path))).await
    }

    /// `GET /metrics` body.
    pub async fn metrics(&self) -> String {
        send(self.client.get(self.metrics_url("/metrics")))
            .await
            .body
    }

    /// One series of `/metrics`, see `parse_metric`.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        parse_metric(&self.metrics().await, series)
    }

    /// A counter's value, 0 while its series has not appeared yet (a labelled series may appear
    /// only once it first occurs, contract section 4).
    pub async fn counter(&self, series: &str) -> f64 {
        self.metric(series).await.unwrap_or(0.0)
    }

    /// Status code of `GET /readyz`.
    pub async fn readyz(&self) -> u16 {
        send(self.client.get(self.metrics_url("/readyz")))
            .await
            .status
    }

    /// Whether `GET /readyz` answers `status` within `timeout`, asked every 20 ms.
    pub async fn until_readyz(&self, status: u16, timeout: Duration) -> bool {
        super::wait_until(timeout, Duration::from_millis(20), || async { self.readyz().await == status }).await
    }

    fn config_str(&self, path: &[&str]) -> Option<String> {
        let cfg = self.config.lock().unwrap();
        let mut v: &Value = &cfg;
        for k in path {
            v = v.get(*k)?;
        }
        v.as_str().map(str::to_owned)
    }

    pub fn endpoint_prefix(&self) -> String {
        self.config_str(&["endpoints", "prefix"])
            .unwrap_or("/queue".into())
    }

    pub fn identity_header(&self) -> String {
        self.config_str(&["identity", "header"])
            .unwrap_or("X-User-Id".into())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        kill_and_reap(self.child.get_mut().unwrap_or_else(|e| e.into_inner()));
    }
}
