//! Assembles the process: the proxy service on `listen`, the operator endpoints on
//! `metrics_listen`, the rooms' background work, the reloader and the drain, then hands control to
//! pingora.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;

use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::services::listening::Service;

use crate::config::Config;
use crate::health::{OpsEndpoints, OpsPart};
use crate::lifecycle::{Drain, Reloader, StopSignals};
use crate::connection::{AtCapacity, Connections, Guarded};
use crate::metrics;
use crate::process::Process;
use crate::proxy::early;
use crate::proxy::Waitroom;
use crate::rules;
use crate::services::RoomWork;
use crate::store::{Redis, StoreError};

/// Why the server could not start (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({key}): {source}")]
    Listen { key: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("cannot resolve upstream {upstream}: {source}")]
    Upstream { upstream: String, source: std::io::Error },
    #[error("redis: {0}")]
    Redis(#[from] StoreError),
    #[error("cannot install the SIGHUP handler: {0}")]
    Signals(std::io::Error),
}

/// Checks what pingora would otherwise only find out inside a service thread (where a bind
/// failure panics instead of ending the process with a clear message).
fn preflight(config: &Config) -> Result<SocketAddr, StartError> {
    let admin = config.admin.listen.map(|addr| ("admin.listen", addr));
    for (key, addr) in [("listen", config.listen), ("metrics_listen", config.metrics_listen)].into_iter().chain(admin) {
        TcpListener::bind(addr).map_err(|source| StartError::Listen { key, addr, source })?;
    }
    config
        .resolve_upstream()
        .map_err(|source| StartError::Upstream { upstream: config.upstream.clone(), source })
}

/// Replaces SIGHUP's default action (terminate) before any service runs, so a reload sent
/// during start-up cannot kill the process. tokio keeps the handler for the process's life.
fn claim_sighup() -> Result<(), StartError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(StartError::Signals)?;
    rt.block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) })
        .map(drop)
        .map_err(StartError::Signals)
}

fn worker_threads() -> usize {
    std::env::var("WAITROOM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// Runs until a signal stops the server; the process exits from inside (see `lifecycle`).
pub fn run(config: Config, config_path: PathBuf) -> Result<(), StartError> {
    let upstream = preflight(&config)?;
    claim_sighup()?;
    for warning in crate::identity::startup_warnings(&config.identity, config.listen) {
        tracing::warn!("{warning}");
    }
    metrics::init();

    let conf = ServerConf {
        threads: worker_threads(),
        // The drain service ends the process once requests are done; pingora's own sleep is
        // only the backstop.
        grace_period_seconds: Some(rules::ceil_secs(config.shutdown_grace) + 1),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let listen = config.listen.to_string();
    let metrics_listen = config.metrics_listen.to_string();
    let redis = config.redis.clone();
    // The one process value every service below shares (no process-wide statics but the metrics).
    let process = Process::new(config)?;

    // pingora's proxy app, run by our connection guard (see crate::connection for why there).
    let connections = Connections::new(process.clone());
    let app = pingora::proxy::http_proxy(&server.configuration, Waitroom::new(process.clone(), upstream));
    // `WAITROOM_EARLY_ANSWERS=off` sends every head to pingora: the fuzz target and the
    // differential tests compare both ways on the same bytes (tests/early_answers.rs).
    let early = (std::env::var_os("WAITROOM_EARLY_ANSWERS").is_none_or(|v| v != "off")).then(|| early::Answers::new(process.clone()));
    let mut proxy = Service::new("waitroom".to_string(), Guarded::new(app, connections.clone(), early));
    proxy.set_connection_filter(Arc::new(AtCapacity(connections)));
    // No L4 buffers under pingora's parser (by default 64 KiB to read and 1,460 B to write, kept
    // for the connection's life): the connection loop reads each head into a per-thread buffer
    // and gathers a response's small writes only until they are flushed (crate::connection), and
    // pingora reads bodies into buffers of its own.
    proxy.add_listener(ListenerConfig::tcp(listen.clone()).l4_buffer(L4BufferSettings::unbuffered()));

    // The operator endpoints run on a runtime of their own, with a connection of their own: a
    // connection's driver task lives on the runtime that made it.
    let admin_listen = process.settings().config.admin.listen;
    let probes = if admin_listen.is_some() { OpsPart::Probes } else { OpsPart::Both };
    let mut ops = Service::new("ops".to_string(), OpsEndpoints::new(process.clone(), Redis::new(&redis)?, probes));
    ops.add_tcp(&metrics_listen);
    ops.threads = Some(1);
    let admin = match admin_listen {
        Some(addr) => {
            let mut admin = Service::new("admin".to_string(), OpsEndpoints::new(process.clone(), Redis::new(&redis)?, OpsPart::Admin));
            admin.add_tcp(&addr.to_string());
            admin.threads = Some(1);
            Some(admin)
        }
        None => None,
    };

    // Every room's background work, on one runtime thread and one connection.
    let mut rooms = background_service("rooms", RoomWork::new(process.clone()));
    rooms.threads = Some(1);
    let mut reloader = background_service("reloader", Reloader::new(process.clone(), config_path));
    reloader.threads = Some(1);
    let mut drain = background_service("drain", Drain::new(process));
    drain.threads = Some(1);

    server.add_service(proxy);
    server.add_service(ops);
    if let Some(admin) = admin {
        server.add_service(admin);
    }
    server.add_service(rooms);
    server.add_service(reloader);
    server.add_service(drain);

    tracing::info!(%listen, %metrics_listen, %upstream, "waitroom starting");
    server.run(RunArgs { shutdown_signal: Box::new(StopSignals) });
    Ok(())
}
