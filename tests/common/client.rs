//! HTTP from the tests: a reqwest client that ignores proxy settings from the environment, and a
//! raw socket helper for requests reqwest refuses to send (malformed headers).

use reqwest::header::HeaderMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One per Proxy/DemoApi, never a global: a pooled connection is bound to the runtime of the
/// `#[tokio::test]` that opened it. The idle pool is sized for bursts of 1000 concurrent requests,
/// and the timeout turns a hanging proxy into a failing test instead of a stuck one.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("reqwest client")
}

/// A fully read response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Resp {
    /// The body as JSON; panics with the body when it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}), status {}: {:?}",
                self.status, self.body
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends and reads the whole body; panics on a transport error.
pub async fn send(req: reqwest::RequestBuilder) -> Resp {
    try_send(req)
        .await
        .unwrap_or_else(|e| panic!("request failed: {e:?}"))
}

/// Sends and reads the whole body; for tests that expect a refused or reset connection.
pub async fn try_send(req: reqwest::RequestBuilder) -> Result<Resp, reqwest::Error> {
    let res = req.send().await?;
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.text().await?;
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// Writes `bytes` as they are and returns what came back (lossy UTF-8): everything until the
/// server closes, until a response is complete by Content-Length or a chunked terminator, or
/// until 10 s pass.
pub async fn raw_request(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr)
        .await
        .expect("connect for raw request");
    s.write_all(bytes).await.expect("write raw request");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let read_all = async {
        while !response_complete(&buf) {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break, // closed or reset: the server has said all it will
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read_all).await;
    String::from_utf8_lossy(&buf).into_owned()
}

fn response_complete(buf: &[u8]) -> bool {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let body = &buf[head_end + 4..];
    let header = |name: &str| {
        head.lines()
            .skip(1)
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|v| v.strip_prefix(':'))
                    .map(str::trim)
            })
            .map(str::to_owned)
    };
    if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        return body.len() >= len;
    }
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return body.ends_with(b"0\r\n\r\n");
    }
    false // no framing: the body ends when the server closes
}

/// The status code of a raw HTTP response.
pub fn http_status(raw: &str) -> u16 {
    raw.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status line: {raw:?}"))
}

/// The JSON body of a raw HTTP response.
pub fn json_body(raw: &str) -> serde_json::Value {
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {raw}"))
}

/// One response off `stream`, by its Content-Length (every answer the tests read this way has
/// one), taking nothing of the response after it.
pub async fn read_response(stream: &mut TcpStream) -> String {
    try_read_response(stream, Duration::from_secs(5)).await.expect("a whole response within 5 s")
}

/// [`read_response`], or `None` when no whole response came within `within` (what came of one
/// is dropped).
pub async fn try_read_response(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() == end + 4 + len {
                    return;
                }
            }
            // One byte at a time, so that nothing of a next response is taken with this one.
            match stream.read(&mut byte).await {
                Ok(0) | Err(_) => return,
                Ok(_) => buf.push(byte[0]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}
