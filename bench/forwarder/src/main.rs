//! pingora's smallest forwarder: one `ProxyHttp` that sends every request to one fixed peer.
//!
//! bench/run.sh measures waitroom's pass-through against it. Whatever waitroom does beyond
//! forwarding costs it a share of this binary's rate, and nothing waitroom does in its own code
//! can take it above that rate, so the ratio to it says how much of pingora's forwarding
//! waitroom keeps. A ratio to nginx `proxy_pass` says something else: how pingora compares with
//! nginx, which moves with the backend behind them.
//!
//! It is built the way waitroom is (the same pingora version and features, mimalloc, the
//! workspace's release profile, a worker thread per core unless `WAITROOM_THREADS` says
//! otherwise) and deliberately nothing more: no tuning waitroom does for itself (its own
//! connection loop, no L4 buffers, no compression module), since those are what the ratio is
//! there to show.
//!
//!     waitroom-forwarder LISTEN UPSTREAM     e.g. waitroom-forwarder 127.0.0.1:8080 127.0.0.1:3000

use std::net::SocketAddr;

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Forward {
    peer: HttpPeer,
}

#[async_trait]
impl ProxyHttp for Forward {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }
}

/// waitroom's own rule (src/server.rs): the same number of worker threads on the same machine.
fn worker_threads() -> usize {
    std::env::var("WAITROOM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, upstream] = args.as_slice() else {
        eprintln!("usage: waitroom-forwarder LISTEN UPSTREAM (both host:port)");
        std::process::exit(2);
    };
    let upstream: SocketAddr = upstream.parse().unwrap_or_else(|e| {
        eprintln!("waitroom-forwarder: upstream {upstream}: {e}");
        std::process::exit(2);
    });

    let conf = ServerConf { threads: worker_threads(), ..ServerConf::default() };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let peer = HttpPeer::new(upstream, false, String::new());
    let mut proxy = http_proxy_service(&server.configuration, Forward { peer });
    proxy.add_tcp(listen);
    server.add_service(proxy);
    server.run_forever();
}
