//! The loops the background services run until shutdown: a step every period (the watchers), or
//! a step that says how long to pause before the next (the admission ticker and its reports).
//!
//! One place for them so every service stops the same way: at shutdown, without finishing a
//! pause, and never in the middle of a step. A watcher that does nothing else implements
//! [`Watch`] and runs as [`Watching`].

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

/// A watcher of the room: one step every [`Watch::EVERY`].
#[async_trait]
pub trait Watch: Send + Sync + 'static {
    const EVERY: Duration;
    async fn step(&self);
}

/// A [`Watch`] as a pingora background service.
pub struct Watching<W>(pub W);

#[async_trait]
impl<W: Watch> BackgroundService for Watching<W> {
    async fn start(&self, shutdown: ShutdownWatch) {
        every(W::EVERY, shutdown, || self.0.step()).await
    }
}

/// Runs `step` every `period` until shutdown. A step slower than the period delays the next one
/// rather than leaving a burst of missed ones to catch up with.
pub async fn every<F, Fut>(period: Duration, shutdown: ShutdownWatch, step: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    every_beside(period, shutdown, std::future::pending(), step).await
}

/// [`every`], polling `beside` (a future that never ends, such as a subscription) while it waits
/// for the next step; not during a step, so the two never run at once.
pub async fn every_beside<B, F, Fut>(period: Duration, mut shutdown: ShutdownWatch, beside: B, mut step: F)
where
    B: Future<Output = ()>,
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(beside);
    loop {
        tokio::select! {
            _ = ticks.tick() => step().await,
            _ = &mut beside => {}
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
