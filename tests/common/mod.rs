//! Shared harness for waitroom's integration tests (style rule 6): real processes on free ports,
//! one fresh `redis-server` per test, conditions awaited instead of slept for.
//!
//! ```ignore
//! mod common;
//! use common::*;
//!
//! let redis = RedisServer::start();
//! let api = DemoApi::start(&["--slots", "4"]);
//! let room = Proxy::builder(&redis.url(), api.addr()).yaml("admission: {interval: 100ms, batch_size: 5}");
//! let a = room.start().await;
//! let b = room.start().await;          // same builder => same key_prefix => same room
//! assert_eq!(a.enter("alice").await.status, 200);
//! ```
//!
//! Every test binary compiles this module and uses only part of it, hence the allows.
#![allow(dead_code, unused_imports)]

mod answers;
mod api_tools;
mod client;
mod demo_api;
mod identity_front;
mod process;
mod proxy;
mod recorder;
mod redis_server;
mod store;

pub use answers::*;
pub use api_tools::api_tool;
pub use client::{http_client, raw_request, send, try_send, Resp};
pub use demo_api::DemoApi;
pub use identity_front::IdentityFront;
pub use process::tools_binary;
pub use proxy::{
    base_config, merge_yaml, merged_config_yaml, parse_metric, run_check, run_check_env,
    unique_prefix, Proxy, ProxyBuilder,
};
pub use recorder::{Recorder, Seen};
pub use redis_server::RedisServer;
pub use store::*;

use std::future::Future;
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A port that was free a moment ago. Another process may take it before the caller binds it;
/// the start-up helpers notice the failed bind and retry on a new port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// Polls `cond` every `every` until it yields true (-> true) or `timeout` has passed (-> false).
/// Returns a bool rather than panicking so the caller's `assert!` names what was awaited.
pub async fn wait_until<F, Fut>(timeout: Duration, every: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// An address where a connection is refused right now: a port that was just free, checked by
/// connecting to it (a refused connect), not merely assumed. For "the upstream is unreachable".
/// Another process could still bind it later; the check makes that a rare race, not the norm.
pub fn refused_addr() -> std::net::SocketAddr {
    for _ in 0..20 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return addr,
            _ => continue, // someone listens there now, or it did not answer: try another
        }
    }
    panic!("no refused port found on 127.0.0.1 in 20 tries");
}

/// Awaits `f` and says how long it took.
pub async fn timed<F: Future>(f: F) -> (F::Output, Duration) {
    let started = Instant::now();
    let out = f.await;
    (out, started.elapsed())
}
