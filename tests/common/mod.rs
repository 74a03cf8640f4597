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
mod jwt;
mod node_backend;
mod process;
mod proxy;
mod recorder;
mod redis_server;
mod rng;
mod store;

pub use answers::*;
pub use api_tools::api_tool;
pub use client::{http_client, http_status, json_body, raw_request, read_response, send, try_read_response, try_send, Resp};
pub use demo_api::DemoApi;
pub use identity_front::IdentityFront;
pub use jwt::{hs256_jwt, jwt_exp_in};
pub use node_backend::NodeBackend;
pub use process::{listening_addrs, rss_kib, tools_binary};
pub use proxy::{
    base_config, merge_yaml, merged_config_yaml, parse_metric, run_check, run_check_env,
    unique_prefix, Proxy, ProxyBuilder,
};
pub use recorder::{Recorder, Seen};
pub use redis_server::RedisServer;
pub use rng::{clock_seed, Rng};
pub use store::*;

use std::future::Future;
use std::net::TcpListener;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A port that was free a moment ago. Another process may take it before the caller binds it;
/// the start-up helpers notice the failed bind and retry on a new port.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` ports that were free a moment ago, and distinct: each is held while the next is asked
/// for (two `free_port()` calls in a row may hand out the same port, and a proxy given it for
/// both `listen` and `metrics_listen` served its users the operator endpoints).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: [TcpListener; N] = std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"));
    held.map(|l| l.local_addr().expect("local_addr").port())
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

/// A port held closed for the whole run of this test binary: a socket bound to it that never
/// listens, so a connection is refused at once and no other process can take the port meanwhile.
/// (A `free_port()` is only free until a neighbour's server binds it, and then "nobody listens
/// here" quietly becomes false.) One port per test binary, shared by its tests: it refuses them all.
pub fn closed_port() -> u16 {
    static HELD: OnceLock<(tokio::net::TcpSocket, u16)> = OnceLock::new();
    HELD.get_or_init(|| {
        // No SO_REUSEADDR: nobody else may bind the port while we hold it.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind 127.0.0.1:0");
        let port = socket.local_addr().expect("local_addr").port();
        (socket, port)
    })
    .1
}

/// `127.0.0.1:closed_port()`: where a connection is refused, for "the upstream is unreachable".
pub fn refused_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], closed_port()))
}

/// The contract's bounds "on all but one in twenty": sorts `samples` and returns the second
/// slowest, the one a bound must hold (one sample the loaded machine delayed cannot fail a test,
/// a proxy slow by design fails nearly every one), with all of them in milliseconds, for the
/// message.
pub fn all_but_the_slowest(samples: &mut [Duration]) -> (Duration, Vec<u128>) {
    samples.sort();
    let ms = samples.iter().map(Duration::as_millis).collect();
    (samples[samples.len() - 2], ms)
}

/// Awaits `f` and says how long it took.
pub async fn timed<F: Future>(f: F) -> (F::Output, Duration) {
    let started = Instant::now();
    let out = f.await;
    (out, started.elapsed())
}
