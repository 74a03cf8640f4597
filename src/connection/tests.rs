use super::slots::Refused;
use super::stream::Stage;
use super::*;
use crate::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

fn limits(header_ms: u64, idle_ms: u64, max_head: usize) -> LimitsConfig {
    LimitsConfig {
        header_timeout: Duration::from_millis(header_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        max_connections: 10,
        max_connections_per_address: 0,
        upstream_timeout: Duration::from_secs(30),
        max_request_head: max_head,
    }
}

/// A limited stream as pingora would read it, and the client's end of its socket.
fn connection(limits: &LimitsConfig) -> (LimitedStream, DuplexStream) {
    let state = Process::new(Config::parse("upstream: 127.0.0.1:1").unwrap()).unwrap();
    let slot = Connections::new(state).take(None).unwrap();
    let (server, client) = tokio::io::duplex(64 * 1024);
    (LimitedStream::new(Box::new(server), slot, limits), client)
}

#[test]
fn each_address_has_its_own_count_and_leaves_the_map_with_its_last_connection() {
    let yaml = "upstream: 127.0.0.1:1\nlimits: {max_connections: 4, max_connections_per_address: 2}";
    let connections = Connections::new(Process::new(Config::parse(yaml).unwrap()).unwrap());
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    assert_eq!(peer_ip(&"[::ffff:10.0.0.1]:443".parse().unwrap()), a, "one client whichever way listen is bound");
    let a1 = connections.take(Some(a)).unwrap();
    let a2 = connections.take(Some(peer_ip(&"[::ffff:10.0.0.1]:443".parse().unwrap()))).unwrap();
    assert_eq!(connections.refuses(Some(a)), Some(Refused::PerAddress));
    assert_eq!(connections.take(Some(a)).err(), Some(Refused::PerAddress));
    assert_eq!(connections.open(), 2, "a refused connection gives its slot back");
    assert_eq!(connections.refuses(Some(b)), None, "another address is not touched");
    let b1 = connections.take(Some(b)).unwrap();
    let unknown = connections.take(None).unwrap();
    assert_eq!(connections.take(Some(b)).err(), Some(Refused::Total), "max_connections still holds");
    drop(a1);
    let a3 = connections.take(Some(a)).unwrap();
    assert_eq!(connections.by_address().get(&a), Some(&2));
    drop((a2, a3, b1, unknown));
    assert!(connections.by_address().is_empty(), "{:?}", connections.by_address());
    assert_eq!(connections.open(), 0);
}

#[tokio::test]
async fn a_split_head_is_handed_on_whole_and_only_once_complete() {
    let (mut s, mut client) = connection(&limits(5000, 5000, 1024));
    let mut buf = [0u8; 4096];
    client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    // Cancelled while the head is incomplete: nothing is lost, nothing handed on.
    assert!(tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await.is_err());
    client.write_all(b"Host: a\r\n\r\nBODY").await.unwrap();
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(matches!(s.stage, Stage::Serving));
    // What came after the head is read next, not lost.
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"BODY");
}

#[tokio::test]
async fn pingora_reads_of_a_next_request_wait_for_the_loop() {
    let (mut s, mut client) = connection(&limits(5000, 5000, 1024));
    let mut buf = [0u8; 4096];
    client.write_all(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}GET /next HTTP/1.1\r\n\r\n").await.unwrap();
    let n = s.read(&mut buf).await.unwrap();
    assert!(buf[..n].ends_with(b"\r\n\r\n"), "the head alone");
    s.hand_over(Framing { body: Body::Length(2), switch: false });
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"{}", "the declared body");
    assert!(tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await.is_err(), "the next request waits");
    // The loop's next head.
    s.expect_head(&limits(5000, 5000, 1024), false);
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"GET /next HTTP/1.1\r\n\r\n");
}

#[tokio::test]
async fn a_responses_small_writes_leave_together_at_the_flush_and_keep_no_buffer() {
    let (mut s, mut client) = connection(&limits(5000, 5000, 1024));
    let mut buf = vec![0u8; 8192];
    s.write_all(&[b'h'; 200]).await.unwrap();
    s.write_all(&[b'b'; 300]).await.unwrap();
    // A duplex write is readable at once, so one poll shows nothing was sent.
    assert_eq!(s.pending.len(), 500);
    assert!(tokio::time::timeout(Duration::ZERO, client.read(&mut buf)).await.is_err(), "sent before the flush");
    s.flush().await.unwrap();
    let n = client.read(&mut buf).await.unwrap();
    assert_eq!((n, &buf[..200], &buf[200..500]), (500, &[b'h'; 200][..], &[b'b'; 300][..]), "one send, in order");
    assert_eq!(s.pending.capacity(), 0, "a flushed connection holds no write buffer");

    // A large write sends what was gathered first, then goes out itself, in order.
    s.write_all(&[b'h'; 100]).await.unwrap();
    s.write_all(&[b'B'; 3000]).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 3100 {
        let n = client.read(&mut buf).await.unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!((&got[..100], &got[100..]), (&[b'h'; 100][..], &[b'B'; 3000][..]));
    assert!(s.pending.is_empty());

    // A close sends what was gathered (dropped unsent, it would be lost with the stream).
    s.write_all(b"tail").await.unwrap();
    Shutdown::shutdown(&mut s).await;
    drop(s);
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"tail");
}

/// `app` behind the connection loop, with no early answers.
fn guarded<A: HttpServerApp + Send + Sync + 'static>(app: A) -> Arc<Guarded<A>> {
    let state = Process::new(Config::parse("upstream: 127.0.0.1:1").unwrap()).unwrap();
    Arc::new(Guarded::new(app, Connections::new(state), None::<NoEarly>))
}

/// An app that serves nothing: only the loop around it is measured.
struct Nothing;

#[async_trait]
impl HttpServerApp for Nothing {
    async fn process_new_http(self: &Arc<Self>, _: ServerSession, _: &ShutdownWatch) -> Option<ReusedHttpStream> {
        None
    }
}

/// Every idle connection's task holds the connection loop's future (BENCHMARKS.md, "Memory per
/// connection"). pingora's session is built in `serve`, so the loop keeps only the wait for the
/// next head; a session held across that wait would add over 400 bytes. tokio allocates a task
/// in steps of 128 bytes (its cells are aligned to two cache lines) with about a hundred bytes
/// of its own beside the future: this bound keeps the task at 512 bytes (the heap profile's
/// `spawn (handle.rs)` site), and the next step is 128 more on every connection.
#[tokio::test]
async fn an_idle_connections_loop_state_stays_small() {
    let guarded = guarded(Nothing);
    let (server, _client) = tokio::io::duplex(1024);
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let limits = limits(5000, 5000, 1024);
    let slot = guarded.connections.take(None).unwrap();
    let limited = Box::new(LimitedStream::new(Box::new(server), slot, &limits));
    let connection = guarded.clone().keep_alive(limited, backstop_secs(&limits), shutdown);
    let size = std::mem::size_of_val(&connection);
    assert!(size <= 408, "the connection loop's state is {size} bytes");
}

/// pingora's call returns as soon as the connection has its own task, which serves it on: the
/// task pingora spawned for the accept (its state sized for the handshake) ends at once.
#[tokio::test]
async fn pingoras_call_returns_at_once_and_the_connection_is_served_on() {
    let guarded = guarded(Counting::default());
    let (server, mut client) = tokio::io::duplex(4096);
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let returned = tokio::time::timeout(Duration::from_secs(5), guarded.process_new(Box::new(server), &shutdown)).await;
    assert!(returned.expect("pingora's call returned while the connection is open").is_none());
    assert_eq!(guarded.connections.open(), 1, "the connection keeps its slot");
    for path in ["/a", "/b"] {
        client.write_all(format!("GET {path} HTTP/1.1\r\nHost: shop\r\n\r\n").as_bytes()).await.unwrap();
        let mut answer = [0u8; 256];
        let n = client.read(&mut answer).await.unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 204"), "{:?}", String::from_utf8_lossy(&answer[..n]));
    }
    // The client leaves; the loop sees it, ends, and drops the stream with its slot (one thread:
    // all of that happens before the client reads the close).
    AsyncWriteExt::shutdown(&mut client).await.unwrap();
    assert_eq!(until_closed(&mut client).await, "");
    assert_eq!(guarded.connections.open(), 0, "the slot is given back when the client leaves");
    assert_eq!(guarded.app.0.load(Ordering::SeqCst), 2);
}

/// An app that answers every request with an empty 204 and counts them.
#[derive(Default)]
struct Counting(AtomicUsize);

#[async_trait]
impl HttpServerApp for Counting {
    async fn process_new_http(self: &Arc<Self>, mut session: ServerSession, _: &ShutdownWatch) -> Option<ReusedHttpStream> {
        if !session.read_request().await.ok()? {
            return None;
        }
        self.0.fetch_add(1, Ordering::SeqCst);
        let answer = pingora::http::ResponseHeader::build(204, None).ok()?;
        session.write_response_header(Box::new(answer)).await.ok()?;
        let settings = HttpPersistentSettings::for_session(&session);
        let reusable = session.finish().await.ok()??;
        Some(ReusedHttpStream::from_reusable_stream(reusable, settings))
    }
}

/// The client's bytes until the server closes, or what came within 5 s.
async fn until_closed(client: &mut DuplexStream) -> String {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

/// The stop and the next head of an idle keep-alive connection arrive together (on a busy
/// machine the stop's wake-up can wait for a thread while the head reaches the socket): the
/// connection is closed unanswered, as nginx closes its idle keep-alive connections. The
/// test's runtime has one thread, so the loop first runs again with both already there.
#[tokio::test]
async fn a_stopping_server_closes_an_idle_keep_alive_connection_whose_head_came_with_the_stop() {
    let guarded = guarded(Counting::default());
    let (server, mut client) = tokio::io::duplex(4096);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let loop_ = guarded.clone();
    let connection = tokio::spawn(async move { loop_.process_new(Box::new(server), &shutdown).await });

    client.write_all(b"GET /a HTTP/1.1\r\nHost: shop\r\n\r\n").await.unwrap();
    let mut first = [0u8; 256];
    let n = client.read(&mut first).await.unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 204"), "{:?}", String::from_utf8_lossy(&first[..n]));

    stop.send(true).unwrap();
    client.write_all(b"GET /b HTTP/1.1\r\nHost: shop\r\n\r\n").await.unwrap();
    assert_eq!(until_closed(&mut client).await, "", "the head that came with the stop was answered");
    assert!(connection.await.unwrap().is_none());
    assert_eq!(guarded.app.0.load(Ordering::SeqCst), 1, "only the request before the stop was served");
}

/// A connection accepted before the stop is served its first head even when the stop came
/// first: that request is in flight. It is then closed.
#[tokio::test]
async fn a_stopping_server_serves_a_fresh_connections_first_head() {
    let guarded = guarded(Counting::default());
    let (server, mut client) = tokio::io::duplex(4096);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    client.write_all(b"GET /a HTTP/1.1\r\nHost: shop\r\n\r\n").await.unwrap();
    stop.send(true).unwrap();
    let answer = tokio::join!(guarded.process_new(Box::new(server), &shutdown), until_closed(&mut client)).1;
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer:?}");
    assert_eq!(guarded.app.0.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_silent_connection_fails_its_read_at_the_idle_deadline() {
    let (mut s, _client) = connection(&limits(5000, 200, 1024));
    let started = Instant::now();
    let error = s.read(&mut [0u8; 64]).await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_keep_alive_head_has_header_timeout_from_its_first_byte() {
    let l = limits(300, 5000, 1024);
    let (mut s, mut client) = connection(&l);
    let mut buf = [0u8; 256];
    client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(s.read(&mut buf).await.unwrap(), 18);
    s.expect_head(&l, false);
    // Idle for longer than header_timeout is fine (idle_timeout rules until a byte comes).
    assert!(tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await.is_err());
    client.write_all(b"G").await.unwrap();
    let first_byte = Instant::now();
    let error = s.read(&mut buf).await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    assert!(first_byte.elapsed() >= Duration::from_millis(290), "{:?}", first_byte.elapsed());
}

#[tokio::test]
async fn a_head_over_the_limit_gets_431_and_nothing_of_it_reaches_the_reader() {
    let (mut s, mut client) = connection(&limits(5000, 5000, 1024));
    // Exactly the limit passes.
    let fits = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(1024 - 23));
    assert_eq!(fits.len(), 1024);
    client.write_all(fits.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(s.read(&mut buf).await.unwrap(), 1024);

    s.expect_head(&limits(5000, 5000, 1024), false);
    client.write_all(&[b'a'; 1500]).await.unwrap();
    let server = s.read(&mut buf);
    let client_side = async {
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        AsyncWriteExt::shutdown(&mut client).await.unwrap(); // ends the linger at once
        answer
    };
    let (read, answer) = tokio::join!(server, client_side);
    assert_eq!(read.unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert_eq!(answer, too_large_response());
}
