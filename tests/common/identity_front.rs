//! `identity-front` of `tools/` in front of a proxy: the documented way to open the waiting page in
//! a browser on a developer's machine (README, "Running it").

use super::process::{has_exited, kill_and_reap, read_logs, spawn_logged, tools_binary};
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tempfile::TempDir;

pub struct IdentityFront {
    addr: SocketAddr,
    child: Child,
    dir: TempDir,
}

impl IdentityFront {
    /// Listens on a port of its own choosing (port 0: no race for a free port) and forwards to
    /// `proxy` (the proxy's `listen`).
    pub fn start(proxy: SocketAddr, extra_args: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("waitroom-front")
            .tempdir()
            .expect("tempdir");
        let mut cmd = Command::new(tools_binary("identity-front"));
        cmd.args(["--listen", "127.0.0.1:0", "--proxy", &proxy.to_string()])
            .args(extra_args)
            .current_dir(dir.path());
        let mut child = spawn_logged(&mut cmd, dir.path(), "front");
        let deadline = Instant::now() + Duration::from_secs(10);
        let addr = loop {
            let out = std::fs::read_to_string(dir.path().join("front.out")).unwrap_or_default();
            // "identity-front listening on 127.0.0.1:PORT: open http://..."
            let addr = out
                .lines()
                .find_map(|l| l.strip_prefix("identity-front listening on "))
                .and_then(|rest| rest.split_once(": "))
                .and_then(|(addr, _)| addr.parse().ok());
            if let Some(addr) = addr {
                break addr;
            }
            if has_exited(&mut child) || Instant::now() >= deadline {
                kill_and_reap(&mut child);
                panic!(
                    "identity-front did not start:\n{}",
                    read_logs(dir.path(), "front")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Self { addr, child, dir }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn logs(&self) -> String {
        read_logs(self.dir.path(), "front")
    }
}

impl Drop for IdentityFront {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}
