//! A backend of another framework as the upstream: `tests/backends/node_orders.mjs`, an order API
//! on Node's own `http` module that routes like Node's documented `new URL(req.url, base)` and
//! finishes every order whose body it read. `GET /admin/orders` tells what it placed.

use super::client::{http_client, send};
use super::process::{has_exited, kill_and_reap, read_logs, spawn_logged};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

pub struct NodeBackend {
    addr: SocketAddr,
    child: Child,
    dir: TempDir,
    client: reqwest::Client,
}

impl NodeBackend {
    /// Starts the backend on a port of its choosing, each order taking `delay` (0: at once).
    /// Panics when `node` cannot be run, naming what to install.
    pub fn start(delay: Duration) -> Self {
        let found = Command::new("node")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(found, "`node` is needed for the Node.js backend's tests: install Node.js 18 or newer (Debian: apt-get install nodejs)");
        let dir = tempfile::Builder::new().prefix("waitroom-node").tempdir().expect("tempdir");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/backends/node_orders.mjs");
        let mut cmd = Command::new("node");
        cmd.arg(&script).arg("0").env("DELAY_MS", delay.as_millis().to_string()).current_dir(dir.path());
        let mut child = spawn_logged(&mut cmd, dir.path(), "node");
        // Port 0: no race for a free port; the first line of stdout names the one it bound.
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = loop {
            let out = std::fs::read_to_string(dir.path().join("node.out")).unwrap_or_default();
            if let Some((line, _)) = out.split_once('\n') {
                break line.trim().parse::<u16>().unwrap_or_else(|_| {
                    kill_and_reap(&mut child);
                    panic!("node_orders.mjs: no port on its first line:\n{}", read_logs(dir.path(), "node"))
                });
            }
            if has_exited(&mut child) || Instant::now() >= deadline {
                kill_and_reap(&mut child);
                panic!("node_orders.mjs did not start:\n{}", read_logs(dir.path(), "node"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        NodeBackend { addr: SocketAddr::from(([127, 0, 0, 1], port)), child, dir, client: http_client() }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET /admin/orders`: `orders` (each with `user`, `token`, `method`, `url`, `orderId`),
    /// `inProgress`, and `requests` (every other request's `method` and `url`).
    pub async fn seen(&self) -> serde_json::Value {
        let url = format!("http://{}/admin/orders", self.addr);
        let r = send(self.client.get(url)).await;
        assert_eq!(r.status, 200, "GET /admin/orders: {}", r.body);
        r.json()
    }

    /// The orders placed so far, in order.
    pub async fn orders(&self) -> Vec<serde_json::Value> {
        self.seen().await["orders"].as_array().cloned().expect("orders is a list")
    }

    pub fn logs(&self) -> String {
        read_logs(self.dir.path(), "node")
    }
}

impl Drop for NodeBackend {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}
