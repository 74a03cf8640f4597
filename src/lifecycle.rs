//! Signals and the process's end: SIGTERM and SIGINT drain in-flight requests then exit 0,
//! SIGHUP reloads the configuration.
//!
//! pingora's own graceful terminate sleeps for the whole grace period even when nothing is in
//! flight, and treats SIGINT as "exit now". We map both signals to a graceful stop and end the
//! process as soon as the last in-flight request is done (or the grace period is over).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};

use crate::live::{self, LiveConfig};
use crate::proxy::IN_FLIGHT;

/// Which signals stop the server, and how.
pub struct StopSignals;

#[async_trait]
impl ShutdownSignalWatch for StopSignals {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut term), Ok(mut int), Ok(mut quit)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::quit()),
        ) else {
            tracing::error!("cannot install signal handlers; stopping");
            return ShutdownSignal::FastShutdown;
        };
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); ShutdownSignal::GracefulTerminate }
            _ = int.recv() => { tracing::info!("SIGINT: draining"); ShutdownSignal::GracefulTerminate }
            // pingora's zero-downtime upgrade: hand the listening sockets to a new process.
            _ = quit.recv() => { tracing::info!("SIGQUIT: handing over listeners"); ShutdownSignal::GracefulUpgrade }
        }
    }
}

/// Ends the process once a graceful stop has drained the in-flight requests.
pub struct Drain {
    config: LiveConfig,
}

impl Drain {
    pub fn new(config: LiveConfig) -> Drain {
        Drain { config }
    }
}

#[async_trait]
impl BackgroundService for Drain {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if shutdown.changed().await.is_err() {
            return;
        }
        let grace = self.config.load().shutdown_grace;
        let deadline = Instant::now() + grace;
        while IN_FLIGHT.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = IN_FLIGHT.load(Ordering::Acquire);
        if left > 0 {
            tracing::warn!(left, ?grace, "grace period over; dropping unfinished requests");
        } else {
            tracing::info!("in-flight requests done");
        }
        // Let the other services see the stop (the admission ticker ends its loop) and the last
        // responses leave the socket buffers.
        tokio::time::sleep(Duration::from_millis(50)).await;
        tracing::info!("exiting");
        std::process::exit(0);
    }
}

/// Reloads the configuration file on SIGHUP.
pub struct Reloader {
    config: LiveConfig,
    path: PathBuf,
}

impl Reloader {
    pub fn new(config: LiveConfig, path: PathBuf) -> Reloader {
        Reloader { config, path }
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGHUP; reloading is off");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    tracing::info!(path = %self.path.display(), "SIGHUP: reloading the configuration");
                    // The outcome is logged and counted inside.
                    let _ = live::reload(&self.config, &self.path);
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}
