//! The same bytes sent to two proxies, one answering status and enter in its connection loop
//! (the early path), the other sending every head to pingora (`WAITROOM_EARLY_ANSWERS=off`),
//! each in front of its own recording upstream and in its own room: what the client gets back
//! and what each upstream receives (every request's bytes and where each ends) must be the same.

pub mod reference;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

/// Short limits, so an idle connection ends by itself soon; a head has longer, as a trickled one
/// on a loaded machine must not meet its deadline on one side only (half a head left at the end
/// of a stream waits for it, up to the client's wait).
const LIMITS: &str = "limits: {header_timeout: 2500ms, idle_timeout: 400ms, upstream_timeout: 2s}";
/// A client's wait for the proxy to close its connection: past it, what came is compared.
const CLIENT_WAIT: Duration = Duration::from_secs(3);

/// What an upstream received, in order: each request's bytes as they arrived, head and body; a
/// stretch it could not read as HTTP/1 is recorded whole, marked, and ends its connection.
#[derive(Clone, Default)]
pub struct Upstream {
    pub addr: Option<SocketAddr>,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// How long an upstream connection with an unreadable request may stay silent before it is
/// recorded and closed.
const QUIET: Duration = Duration::from_millis(200);

const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\n\r\nupstream";

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = Upstream { addr: Some(listener.local_addr().unwrap()), seen: Default::default() };
        let seen = upstream.seen.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(record(conn, seen.clone()));
            }
        });
        upstream
    }

    /// What was received since the last call.
    pub fn take(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

async fn record(mut conn: TcpStream, seen: Arc<Mutex<Vec<Vec<u8>>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        // Every whole request in `buf` is recorded and answered.
        loop {
            match split_request(&buf) {
                Split::Whole(n) => {
                    seen.lock().unwrap().push(buf.drain(..n).collect());
                    if conn.write_all(ANSWER).await.is_err() {
                        return;
                    }
                }
                Split::More => break,
                Split::Unreadable => {
                    // What follows such a head (its body, sent after pingora flushed the head)
                    // belongs to the record too: read until the proxy sends nothing more, so the
                    // record does not depend on how the bytes were cut on their way here.
                    while let Ok(Ok(n)) = tokio::time::timeout(QUIET, conn.read(&mut chunk)).await {
                        if n == 0 {
                            break;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let mut marked = b"UNREADABLE:".to_vec();
                    marked.append(&mut buf);
                    seen.lock().unwrap().push(marked);
                    return;
                }
            }
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                if !buf.is_empty() {
                    let mut marked = b"UNFINISHED:".to_vec();
                    marked.append(&mut buf);
                    seen.lock().unwrap().push(marked);
                }
                return;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

enum Split {
    Whole(usize),
    More,
    Unreadable,
}

fn split_request(buf: &[u8]) -> Split {
    if buf.is_empty() {
        return Split::More;
    }
    let mut headers = [httparse::EMPTY_HEADER; 256];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Split::More,
        Err(_) => return Split::Unreadable,
    };
    match reference::declared(req.headers) {
        Some(reference::Declared::Length(n)) if buf.len() >= head + n => Split::Whole(head + n),
        Some(reference::Declared::Length(_)) => Split::More,
        Some(reference::Declared::Chunked) => match reference::chunked_end(&buf[head..]) {
            Ok(Some(end)) => Split::Whole(head + end),
            Ok(None) => Split::More,
            Err(()) => Split::Unreadable,
        },
        None => Split::Unreadable,
    }
}

/// One side: a proxy, its room and its upstream.
pub struct Side {
    pub proxy: Proxy,
    pub upstream: Upstream,
}

/// Both sides, on one Redis (each its own room).
pub struct Pair {
    pub early: Side,
    pub full: Side,
    _redis: RedisServer,
}

/// What one side made of a byte stream.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Everything the client read until the proxy closed (or [`CLIENT_WAIT`]), each `Date`
    /// value blanked.
    pub client: String,
    /// What the upstream received, request by request.
    pub upstream: Vec<String>,
}

impl Pair {
    /// Rooms nobody is admitted from, polls never held (a held poll's length is timing).
    pub async fn start(extra_yaml: &str) -> Pair {
        let redis = RedisServer::start();
        let side = |early: bool| {
            let redis = &redis;
            async move {
                let upstream = Upstream::start().await;
                let mut builder = Proxy::builder(&redis.url(), upstream.addr.unwrap())
                    .key_prefix(&unique_prefix())
                    .yaml(NO_ADMISSION)
                    .yaml("endpoints: {hold: 0s}")
                    .yaml(LIMITS)
                    .env("RUST_LOG", "warn,waitroom::proxy::early=debug");
                if !extra_yaml.is_empty() {
                    builder = builder.yaml(extra_yaml);
                }
                if !early {
                    builder = builder.env("WAITROOM_EARLY_ANSWERS", "off");
                }
                let proxy = start_settled(redis, &builder).await;
                Side { proxy, upstream }
            }
        };
        let early = side(true).await;
        let full = side(false).await;
        Pair { early, full, _redis: redis }
    }

    /// Sends `segments` (one write each, a moment apart, so each reaches the proxy as a read of
    /// its own) on a new connection to each side at once, and what each made of them.
    pub async fn run(&self, segments: &[Vec<u8>]) -> (Outcome, Outcome) {
        tokio::join!(self.early.run(segments), self.full.run(segments))
    }

    /// How many calls the early path answered (its debug line), on each side.
    pub fn early_answers(&self) -> (usize, usize) {
        let count = |side: &Side| side.proxy.logs().matches("answered before pingora's session").count();
        (count(&self.early), count(&self.full))
    }
}

impl Side {
    async fn run(&self, segments: &[Vec<u8>]) -> Outcome {
        let stream = TcpStream::connect(self.proxy.addr()).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (mut reader, mut writer) = stream.into_split();
        let read = async {
            let reader = &mut reader;
            let mut got = Vec::new();
            let _ = tokio::time::timeout(CLIENT_WAIT, reader.read_to_end(&mut got)).await;
            got
        };
        let write = async {
            for segment in segments {
                if writer.write_all(segment).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            // The write half stays open: a client that has sent everything still reads.
            writer
        };
        let (got, writer) = tokio::join!(read, write);
        // A request still open at the wait's end (a body that never came whole) ends with the
        // client, and the upstream's record of it with the proxy's close.
        drop(writer);
        drop(reader);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let upstream = self.upstream.take().iter().map(|r| String::from_utf8_lossy(r).into_owned()).collect();
        Outcome { client: dateless(&String::from_utf8_lossy(&got)), upstream }
    }
}

/// `text` with every `Date` header's value blanked (the one thing two answers a moment apart may
/// differ in), wherever a response in it starts a header line.
pub fn dateless(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.to_ascii_lowercase().find("\r\ndate: ") {
        let value_start = at + "\r\ndate: ".len();
        out.push_str(&rest[..value_start]);
        out.push('-');
        let end = rest[value_start..].find("\r\n").map_or(rest.len(), |e| value_start + e);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A readable account of where the two sides differ.
pub fn describe(segments: &[Vec<u8>], early: &Outcome, full: &Outcome) -> String {
    let sent: Vec<String> = segments.iter().map(|s| s.escape_ascii().to_string()).collect();
    format!(
        "sent (segments): {sent:?}\n--- early path on: client got\n{}\n--- early path off: client got\n{}\n\
         --- early path on: upstream received\n{:?}\n--- early path off: upstream received\n{:?}",
        early.client.escape_debug(),
        full.client.escape_debug(),
        early.upstream,
        full.upstream
    )
}
