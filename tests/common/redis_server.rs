//! A private `redis-server` per test: its own free port and its own tempdir, so tests never share
//! state and AOF files of a restart test land in a directory that dies with the test.

use super::free_port;
use super::process::{has_exited, kill_and_reap, read_logs, signal, spawn_logged};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tempfile::TempDir;

const START_TIMEOUT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(10);

pub struct RedisServer {
    port: u16,
    dir: TempDir,
    extra_args: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// A persistence-free server (no RDB, no AOF).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// `extra_args` come after the defaults and so override them, e.g.
    /// `&["--appendonly", "yes", "--appendfsync", "always"]` for data that survives `restart`.
    pub fn start_with(extra_args: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("waitroom-redis")
            .tempdir()
            .expect("tempdir");
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut last_error = String::new();
        // A failed bind (someone took the free port) shows up as an early exit: try another port.
        for _ in 0..5 {
            let port = free_port();
            match spawn(port, dir.path(), &extra_args) {
                Ok(child) => {
                    return Self {
                        port,
                        dir,
                        extra_args,
                        child: Some(child),
                    }
                }
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server is stopped").id()
    }

    /// A fresh connection, for a test that inspects or seeds keys directly. Its response timeout
    /// is 5 s instead of redis-rs's 500 ms default, so seeding a big room on a slow machine works
    /// (and a frozen server still fails the call rather than hanging the test).
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(5)));
        redis::Client::open(self.url())
            .expect("redis url")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect to test redis")
    }

    /// Clean shutdown (SIGTERM: Redis flushes the AOF and writes an RDB only if `--save` points
    /// were given). Falls back to SIGKILL after 5 s. The port stays reserved for `restart` only
    /// by luck, which is why `restart` fails loudly if it was taken.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), "CONT"); // a frozen server cannot act on TERM
        signal(child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !has_exited(&mut child) {
            if Instant::now() >= deadline {
                kill_and_reap(&mut child);
                return;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Hard crash: SIGKILL, no AOF flush beyond what `--appendfsync` already wrote.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }

    /// Stop (if running) and start again on the same port and dir, so clients configured with
    /// `url()` reconnect to it and AOF data, when enabled, comes back.
    pub fn restart(&mut self) {
        self.stop();
        // The old socket is gone; retry briefly in case the kernel or a racing test holds the port.
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            match spawn(self.port, self.dir.path(), &self.extra_args) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) if Instant::now() >= deadline => {
                    panic!("redis-server did not restart on port {}: {e}", self.port)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// SIGSTOP: the server keeps its listening socket, so connections are accepted by the kernel
    /// but never answered -- a hanging Redis, unlike a stopped one that refuses connections.
    pub fn freeze(&self) {
        signal(self.pid(), "STOP");
    }

    pub fn thaw(&self) {
        signal(self.pid(), "CONT");
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| !has_exited(c))
    }

    /// redis-server's own log (stdout; `--logfile` is left at its default).
    pub fn logs(&self) -> String {
        read_logs(self.dir.path(), "redis")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.crash(); // the TempDir field then removes the directory
    }
}

/// Spawns on `port` and waits until that very process answers PING. Err carries its log.
fn spawn(port: u16, dir: &std::path::Path, extra_args: &[String]) -> Result<Child, String> {
    let mut cmd = Command::new("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ])
    .args(["--appendonly", "no", "--daemonize", "no"])
    .arg("--dir")
    .arg(dir)
    .args(extra_args)
    .current_dir(dir);
    let mut child = spawn_logged(&mut cmd, dir, "redis");
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if has_exited(&mut child) {
            return Err(format!("exited early:\n{}", read_logs(dir, "redis")));
        }
        // PONG (not -LOADING) means the data set is loaded; the pid check rules out a
        // neighbour's server that grabbed the same port before ours failed to bind.
        if raw_cmd(port, "PING").is_some_and(|r| r.starts_with("+PONG"))
            && raw_cmd(port, "INFO server")
                .is_some_and(|r| r.contains(&format!("process_id:{}\r\n", child.id())))
        {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            kill_and_reap(&mut child);
            return Err(format!(
                "no PONG within {START_TIMEOUT:?}:\n{}",
                read_logs(dir, "redis")
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// One inline command over a plain socket; None on any error or timeout (e.g. while frozen).
/// Blocking on purpose: start/restart must work outside any runtime and from Drop.
fn raw_cmd(port: u16, cmd: &str) -> Option<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(format!("{cmd}\r\n").as_bytes()).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    while !reply_complete(&buf) {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Simple replies end at the first CRLF; a bulk string (`$len\r\n...\r\n`) once `len` bytes came.
fn reply_complete(buf: &[u8]) -> bool {
    let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    if buf[0] != b'$' {
        return true;
    }
    match std::str::from_utf8(&buf[1..eol])
        .ok()
        .and_then(|n| n.parse::<i64>().ok())
    {
        Some(len) if len >= 0 => buf.len() >= eol + 2 + len as usize + 2,
        _ => true, // null bulk or garbage: nothing more to wait for
    }
}
