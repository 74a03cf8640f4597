//! The loops the background services run until shutdown: a step every period (the watchers), or
//! a step that says how long to pause before the next (the admission ticker and its reports).
//!
//! One place for them so every service stops the same way: at shutdown, without finishing a
//! pause, and never in the middle of a step. A watcher that does nothing else implements
//! [`Watch`]; a room's watcher pauses as its room says (see `crate::room::quiet`).

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;

/// A watcher of the room: one step every [`Watch::EVERY`], or every [`Watch::QUIET_EVERY`] while
/// its room is quiet.
#[async_trait]
pub trait Watch: Send + Sync + 'static {
    const EVERY: Duration;
    /// A second: what the contract allows a proxy to take to follow a change made elsewhere.
    const QUIET_EVERY: Duration = Duration::from_secs(1);
    async fn step(&self);
}

/// Runs `step`, then waits for `pause()`, over and over until shutdown.
pub async fn every_after<F, Fut, P, PFut>(mut shutdown: ShutdownWatch, mut pause: P, mut step: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
    P: FnMut() -> PFut,
    PFut: Future<Output = ()>,
{
    loop {
        step().await;
        tokio::select! {
            _ = pause() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Runs `step` over and over, sleeping the pause each run returns, until shutdown.
pub async fn every_pause<F, Fut>(mut shutdown: ShutdownWatch, mut step: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Duration>,
{
    loop {
        let pause = step().await;
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return,
        }
    }
}
