//! An upstream that records the request line and headers of everything that reaches it, and
//! answers each request with a fixed status: the proof that a request did or did not get past
//! the proxy, and of exactly what target it carried.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as the upstream read it: the request line and the header lines, as sent.
#[derive(Debug, Clone)]
pub struct Seen {
    pub line: String,
    pub headers: Vec<String>,
}

pub struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// Answers every request with `status` and an empty JSON object.
    pub async fn start(status: u16) -> Recorder {
        Recorder::start_with_headers(status, &[]).await
    }

    /// As [`Recorder::start`], each answer also carrying `headers` (e.g. an origin's
    /// `Waitroom-Command`).
    pub async fn start_with_headers(status: u16, headers: &[(&str, &str)]) -> Recorder {
        Recorder::start_with(status, headers, Duration::ZERO).await
    }

    /// As [`Recorder::start`], each answer sent `delay` after the request was read, whether or
    /// not the proxy is still there to read it: a backend (Express, Django, Rails) that goes on
    /// with an order its client's connection dropped, unlike the demo API, whose hyper server
    /// drops the order's future.
    pub async fn start_slow(status: u16, delay: Duration) -> Recorder {
        Recorder::start_with(status, &[], delay).await
    }

    /// As [`Recorder::start_slow`], for the first `slow` requests only: the others are answered
    /// at once (an order API that was slow for a moment).
    pub async fn start_slow_first(status: u16, delay: Duration, slow: usize) -> Recorder {
        Recorder::start_counted(status, &[], delay, slow).await
    }

    async fn start_with(status: u16, headers: &[(&str, &str)], delay: Duration) -> Recorder {
        Recorder::start_counted(status, headers, delay, usize::MAX).await
    }

    async fn start_counted(status: u16, headers: &[(&str, &str)], delay: Duration, slow: usize) -> Recorder {
        let slow = Arc::new(AtomicUsize::new(slow));
        let extra: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
        let extra: Arc<str> = extra.into();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind recorder");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, status, extra.clone(), log.clone(), delay, slow.clone()));
            }
        });
        Recorder { addr, seen, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request line seen so far, in order.
    pub fn lines(&self) -> Vec<String> {
        self.seen.lock().unwrap().iter().map(|s| s.line.clone()).collect()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut stream: TcpStream,
    status: u16,
    extra: Arc<str>,
    log: Arc<Mutex<Vec<Seen>>>,
    delay: Duration,
    slow: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n").map(str::to_owned);
        let line = lines.next().unwrap_or_default();
        let headers: Vec<String> = lines.collect();
        let length = headers
            .iter()
            .find_map(|h| {
                let (name, value) = h.split_once(':')?;
                name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let chunked = headers.iter().any(|h| h.to_ascii_lowercase().starts_with("transfer-encoding:"));
        buf.drain(..head_end + 4);
        if chunked {
            // Read up to the last chunk; the tests send small bodies.
            while !buf.windows(5).any(|w| w == b"0\r\n\r\n") {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let end = buf.windows(5).position(|w| w == b"0\r\n\r\n").unwrap() + 5;
            buf.drain(..end);
        } else {
            while buf.len() < length {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            buf.drain(..length);
        }
        log.lock().unwrap().push(Seen { line, headers });
        if slow.fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| left.checked_sub(1)).is_ok() {
            tokio::time::sleep(delay).await;
        }
        let answer = format!("HTTP/1.1 {status} Recorded\r\nContent-Type: application/json\r\n{extra}Content-Length: 2\r\n\r\n{{}}");
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}
