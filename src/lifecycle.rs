//! Signals and the process's end: SIGTERM and SIGINT drain in-flight requests then exit 0,
//! SIGHUP reloads the configuration.
//!
//! pingora's own graceful terminate sleeps for the whole grace period even when nothing is in
//! flight, and treats SIGINT as "exit now". We map both signals to a graceful stop and end the
//! process as soon as the last in-flight request is done (or the grace period is over).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::live;
use crate::process::Process;

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
    process: Arc<Process>,
}

impl Drain {
    pub fn new(process: Arc<Process>) -> Drain {
        Drain { process }
    }
}

#[async_trait]
impl BackgroundService for Drain {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if shutdown.changed().await.is_err() {
            return;
        }
        // Held polls are answered now (WAITING, ask again at once) rather than cut at the end.
        let rooms = self.process.rooms().all();
        for room in rooms.iter() {
            room.held().stop();
        }
        let grace = self.process.settings().config.shutdown_grace;
        let deadline = Instant::now() + grace;
        while self.process.in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = self.process.in_flight();
        if left > 0 {
            tracing::warn!(left, ?grace, "grace period over; dropping unfinished requests");
        } else {
            tracing::info!("in-flight requests done");
        }
        // A spend that met an outage is the only trace of a placed order: it gets what is left
        // of the grace period to reach Redis.
        let settled = || rooms.iter().all(|room| room.settles().settled());
        while !settled() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !settled() {
            let left: usize = rooms.iter().map(|room| room.settles().len()).sum();
            tracing::error!(left, "grace period over; spends that never reached Redis are dropped");
        }
        // Let the other services see the stop (the admission ticker ends its loop) and the last
        // responses leave the socket buffers.
        tokio::time::sleep(Duration::from_millis(50)).await;
        tracing::info!("exiting");
        crate::logging::flush();
        std::process::exit(0);
    }
}

/// Reloads the configuration file on SIGHUP, and on a change of the file when `reload.watch`.
pub struct Reloader {
    process: Arc<Process>,
    path: PathBuf,
}

/// Editors and ConfigMaps write a file in several steps (truncate + write, or write a temporary
/// file and rename it over); the file is read once no event came for this long.
const SETTLE: Duration = Duration::from_millis(200);

impl Reloader {
    pub fn new(process: Arc<Process>, path: PathBuf) -> Reloader {
        Reloader { process, path }
    }

    /// Watches the file's folder rather than the file: a file replaced by rename is a new inode,
    /// which a watch on the old one would never report. An event only wakes the reloader; it
    /// reloads when the file's content actually changed.
    fn watch(&self) -> Option<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>)> {
        use notify::Watcher;
        let (tx, rx) = mpsc::unbounded_channel();
        let folder = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self.path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        let made = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Only events about the file itself, or about a `..data`-style symlink swap (how
            // Kubernetes updates a mounted ConfigMap), wake the reloader: other files in the
            // folder (logs, say) may change all the time.
            let relevant = event.is_ok_and(|e| {
                e.paths.iter().any(|p| {
                    p.file_name().is_some_and(|f| f == name || f.to_string_lossy().starts_with(".."))
                })
            });
            if relevant {
                let _ = tx.send(());
            }
        });
        let mut watcher = match made {
            Ok(w) => w,
            Err(error) => {
                tracing::error!(%error, "cannot watch the configuration file; SIGHUP still reloads");
                return None;
            }
        };
        if let Err(error) = watcher.watch(&folder, notify::RecursiveMode::NonRecursive) {
            tracing::error!(%error, folder = %folder.display(), "cannot watch the configuration folder; SIGHUP still reloads");
            return None;
        }
        tracing::info!(path = %self.path.display(), "watching the configuration file for changes");
        Some((watcher, rx))
    }

    fn reload(&self, why: &str) {
        tracing::info!(path = %self.path.display(), why, "reloading the configuration");
        // The outcome is logged and counted inside.
        let _ = live::reload(&self.process, &self.path);
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
        // Kept alive for as long as the loop runs; dropping it stops the watch.
        let (_watcher, mut changes) = match self.process.settings().config.reload_watch.then(|| self.watch()).flatten() {
            Some((w, rx)) => (Some(w), Some(rx)),
            None => (None, None),
        };
        let mut last_seen = std::fs::read(&self.path).ok();
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    self.reload("SIGHUP");
                    last_seen = std::fs::read(&self.path).ok();
                }
                Some(()) = async { match changes.as_mut() { Some(rx) => rx.recv().await, None => None } } => {
                    // Wait for a quiet spell: a burst of writes ends before the file is read.
                    if let Some(rx) = changes.as_mut() {
                        loop {
                            tokio::time::sleep(SETTLE).await;
                            let mut more = false;
                            while rx.try_recv().is_ok() {
                                more = true;
                            }
                            if !more {
                                break;
                            }
                        }
                    }
                    let now = std::fs::read(&self.path).ok();
                    // A missing file mid-rename is not a change; the rename's own event follows.
                    if now.is_some() && now != last_seen {
                        self.reload("file changed");
                        last_seen = now;
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}
