//! The repo's demo order API as the upstream: `GET /admin/stats` reports what it saw, any other
//! path echoes the request as JSON.

use super::client::{http_client, send};
use super::free_port;
use super::process::{has_exited, kill_and_reap, read_logs, spawn_logged, tools_binary};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tempfile::TempDir;

pub struct DemoApi {
    addr: SocketAddr,
    child: Child,
    dir: TempDir,
    client: reqwest::Client,
}

impl DemoApi {
    /// `extra_args`: e.g. `&["--slots", "4", "--service-time-ms", "50"]`, and `--client-delays`
    /// for a test that sends `X-Demo-Delay-Ms` (ignored without it).
    pub fn start(extra_args: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("waitroom-api")
            .tempdir()
            .expect("tempdir");
        let mut last_error = String::new();
        for _ in 0..5 {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let mut cmd = Command::new(tools_binary("demo-order-api"));
            cmd.arg("--listen")
                .arg(addr.to_string())
                .args(extra_args)
                .current_dir(dir.path());
            let mut child = spawn_logged(&mut cmd, dir.path(), "api");
            match wait_listening(&mut child, addr, Duration::from_secs(10)) {
                Ok(()) => {
                    return Self {
                        addr,
                        child,
                        dir,
                        client: http_client(),
                    }
                }
                Err(e) => {
                    kill_and_reap(&mut child);
                    last_error = format!("{e}:\n{}", read_logs(dir.path(), "api"));
                    // Only a lost port race is worth another try.
                    if !last_error.to_ascii_lowercase().contains("in use") {
                        break;
                    }
                }
            }
        }
        panic!("demo-order-api did not start: {last_error}");
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `GET /admin/stats` as JSON (peakInFlight etc.).
    pub async fn stats(&self) -> serde_json::Value {
        send(self.client.get(self.url("/admin/stats"))).await.json()
    }

    pub fn logs(&self) -> String {
        read_logs(self.dir.path(), "api")
    }
}

impl Drop for DemoApi {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

/// Polls every 10 ms until `addr` accepts TCP while `child` is still alive.
fn wait_listening(child: &mut Child, addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if has_exited(child) {
            return Err("exited early".into());
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
            && !has_exited(child)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("not listening on {addr} within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
