//! `fire`: a fixed number of requests, one after another, on one keep-alive connection: the
//! client for instruction counts under callgrind (`bench/callgrind.sh`), where a fixed count
//! makes "instructions per request" a plain division. With `--connections C` the requests are
//! dealt round-robin to C connections that run at once: what the proxy does only under
//! concurrency (calls to Redis shared by the requests that arrive together) shows in the count.
//!
//! Plain HTTP/1.1 over a TCP socket, so the client adds nothing the proxy must parse beyond the
//! request itself. Header values may name `{user}` and `{token}` (from `--pairs`, one pair per
//! request, each used once) or `{n}` (the request's number, 1-based, modulo `--users`).

use std::collections::BTreeMap;
use std::time::Instant;

use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{ctx, Result};

#[derive(Args)]
pub struct FireArgs {
    /// host:port
    #[arg(long)]
    addr: String,
    #[arg(long)]
    n: u64,
    #[arg(long, default_value = "GET")]
    method: String,
    #[arg(long)]
    path: String,
    /// `Name: value`, repeatable.
    #[arg(long = "header")]
    headers: Vec<String>,
    /// A file of `user token` pairs for `{user}` / `{token}`.
    #[arg(long)]
    pairs: Option<std::path::PathBuf>,
    /// `{n}` cycles through 1..=users.
    #[arg(long, default_value_t = 1)]
    users: u64,
    /// Skip this many pairs first (to use a fresh part of the file), and start `{n}` past them
    /// (a warm-up's users are not the measured run's).
    #[arg(long, default_value_t = 0)]
    skip: usize,
    /// Connections sending at once; request i goes on connection i mod this.
    #[arg(long, default_value_t = 1)]
    connections: u64,
}

pub async fn run(a: FireArgs) -> Result<()> {
    let pairs: Vec<(String, String)> = match &a.pairs {
        Some(path) => std::fs::read_to_string(path)
            .map_err(ctx("pairs"))?
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(u, t)| (u.to_string(), t.to_string())))
            .skip(a.skip)
            .collect(),
        None => Vec::new(),
    };
    if a.pairs.is_some() && (pairs.len() as u64) < a.n {
        return Err(format!("--pairs has {} pairs left, {} requests asked", pairs.len(), a.n));
    }
    let connections = a.connections.clamp(1, a.n.max(1));
    let mut conns = Vec::new();
    for _ in 0..connections {
        conns.push(Conn::connect(&a.addr).await?);
    }
    let a = std::sync::Arc::new(a);
    let pairs = std::sync::Arc::new(pairs);
    let started = Instant::now();
    let mut sending = tokio::task::JoinSet::new();
    for (c, mut conn) in conns.into_iter().enumerate() {
        let (a, pairs) = (a.clone(), pairs.clone());
        sending.spawn(async move {
            let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
            for i in (c as u64..a.n).step_by(connections as usize) {
                let status = conn.roundtrip(request(&a, &pairs, i).as_bytes()).await?;
                *statuses.entry(status).or_default() += 1;
            }
            Ok::<_, String>(statuses)
        });
    }
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    while let Some(done) = sending.join_next().await {
        for (status, count) in done.map_err(|e| e.to_string())?? {
            *statuses.entry(status).or_default() += count;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let statuses: BTreeMap<String, u64> = statuses.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    println!(
        "{}",
        serde_json::json!({"requests": a.n, "seconds": elapsed, "statuses": statuses})
    );
    Ok(())
}

/// Request `i` (0-based) of the run.
fn request(a: &FireArgs, pairs: &[(String, String)], i: u64) -> String {
    let n = ((i + a.skip as u64) % a.users.max(1)) + 1;
    let (user, token) = pairs.get(i as usize).map(|(u, t)| (u.as_str(), t.as_str())).unwrap_or(("", ""));
    let mut req = format!("{} {} HTTP/1.1\r\nHost: bench\r\n", a.method, a.path);
    for h in &a.headers {
        let h = h.replace("{user}", user).replace("{token}", token).replace("{n}", &n.to_string());
        req.push_str(&h);
        req.push_str("\r\n");
    }
    if a.method == "POST" || a.method == "PUT" {
        req.push_str("Content-Length: 0\r\n");
    }
    req.push_str("\r\n");
    req
}

/// One client connection speaking plain HTTP/1.1 with keep-alive.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub async fn connect(addr: &str) -> Result<Conn> {
        let stream = TcpStream::connect(addr).await.map_err(ctx(addr))?;
        stream.set_nodelay(true).map_err(ctx("nodelay"))?;
        Ok(Conn { stream, buf: Vec::with_capacity(8192) })
    }

    /// Sends one request and reads its whole response; returns the status.
    pub async fn roundtrip(&mut self, request: &[u8]) -> Result<u16> {
        self.stream.write_all(request).await.map_err(ctx("write"))?;
        self.read_response().await
    }

    async fn fill(&mut self) -> Result<()> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).await.map_err(ctx("read"))?;
        if n == 0 {
            return Err("connection closed by the server".into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn read_response(&mut self) -> Result<u16> {
        let head_end = loop {
            if let Some(pos) = find(&self.buf, b"\r\n\r\n") {
                break pos + 4;
            }
            self.fill().await?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_string();
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line: {}", head.lines().next().unwrap_or("")))?;
        let mut length: Option<usize> = None;
        let mut chunked = false;
        for line in head.lines().skip(1) {
            if let Some((name, value)) = line.split_once(':') {
                let name = name.trim().to_ascii_lowercase();
                if name == "content-length" {
                    length = value.trim().parse().ok();
                } else if name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked") {
                    chunked = true;
                }
            }
        }
        self.buf.drain(..head_end);
        if chunked {
            loop {
                let line_end = loop {
                    if let Some(pos) = find(&self.buf, b"\r\n") {
                        break pos;
                    }
                    self.fill().await?;
                };
                let size_text = String::from_utf8_lossy(&self.buf[..line_end]).to_string();
                let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| format!("bad chunk size {size_text:?}"))?;
                let need = line_end + 2 + size + 2;
                while self.buf.len() < need {
                    self.fill().await?;
                }
                self.buf.drain(..need);
                if size == 0 {
                    break;
                }
            }
        } else {
            let length = length.unwrap_or(0);
            while self.buf.len() < length {
                self.fill().await?;
            }
            self.buf.drain(..length);
        }
        Ok(status)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
