//! Whether a room is quiet on this proxy (contract section 17: a room nobody is using costs each
//! proxy at most 5 Redis calls a second). Quiet: no request to the room on this proxy for
//! [`QUIET_AFTER`], its line empty as last read, no poll held, no order in flight or settle
//! queued, and no event phase beginning within [`QUIET_EVERY`] twice over. A quiet room's
//! room watcher (its gauges, state and readiness) looks every 350 ms, its event watcher once
//! every [`QUIET_EVERY`], its line watcher and admission ticker not at all; the room's next
//! request on this proxy wakes them at once.
//!
//! Why that keeps the contract's latencies: a user who enters through this proxy wakes it, so
//! the first admission is within one interval of the first enter; one who enters through
//! another proxy is admitted by that proxy's ticker (any proxy's tick admits for the room), and
//! within [`QUIET_EVERY`] this proxy reads a line that is no longer empty and wakes. A poll
//! held here makes the room busy, so READY still follows an admission within the line
//! watcher's period. A state change made elsewhere is followed within [`QUIET_EVERY`], the
//! second the contract allows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long after its last request a room may turn quiet.
pub const QUIET_AFTER: Duration = Duration::from_secs(5);
/// How often a quiet room's watchers look.
pub const QUIET_EVERY: Duration = Duration::from_secs(1);

/// A room's use on this proxy, as its background work needs to know it.
pub struct Activity {
    born: Instant,
    /// When the room last had a request, in ms since `born`.
    last_request_ms: AtomicU64,
    /// The line's length as the room watcher last read it; `u64::MAX` before the first reading.
    waiting: AtomicU64,
    wake: Notify,
}

impl Default for Activity {
    fn default() -> Activity {
        // A new room starts busy: its first readings are taken at once.
        Activity { born: Instant::now(), last_request_ms: AtomicU64::new(0), waiting: AtomicU64::new(u64::MAX), wake: Notify::new() }
    }
}

impl Activity {
    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Notes a request to the room; the first one after a quiet spell wakes its background work.
    pub fn request(&self) {
        let now = self.now_ms();
        let before = self.last_request_ms.swap(now, Ordering::Relaxed);
        if now.saturating_sub(before) >= QUIET_AFTER.as_millis() as u64 {
            self.wake.notify_waiters();
        }
    }

    /// Notes the line's length as read from Redis; a line that is no longer empty wakes the
    /// room's work.
    pub fn line_read(&self, waiting: u64) {
        let before = self.waiting.swap(waiting, Ordering::Relaxed);
        if before == 0 && waiting > 0 {
            self.wake.notify_waiters();
        }
    }

    /// Whether nothing asked for the room lately and its line was empty when last read; the
    /// room adds what only it knows (held polls, orders in flight, its event).
    pub fn unused(&self) -> bool {
        let idle_for = self.now_ms().saturating_sub(self.last_request_ms.load(Ordering::Relaxed));
        self.born.elapsed() >= QUIET_AFTER
            && idle_for >= QUIET_AFTER.as_millis() as u64
            && self.waiting.load(Ordering::Relaxed) == 0
    }

    /// Waits `busy`, or while `quiet()` holds, `quiet_every` or until the room wakes.
    pub async fn pause(&self, busy: Duration, quiet_every: Duration, quiet: impl Fn() -> bool) {
        let woken = self.wake.notified();
        tokio::pin!(woken);
        // Registered before the check: a request that comes after it still wakes this pause.
        woken.as_mut().enable();
        if !quiet() {
            tokio::time::sleep(busy).await;
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(quiet_every) => {}
            _ = woken => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_line_that_fills_ends_a_quiet_pause_and_is_never_quiet() {
        let activity = Arc::new(Activity::default());
        let pausing = {
            let activity = activity.clone();
            tokio::spawn(async move { activity.pause(Duration::from_secs(60), Duration::from_secs(60), || true).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        activity.line_read(0);
        activity.line_read(2);
        tokio::time::timeout(Duration::from_millis(500), pausing).await.expect("woken long before its quiet wait").unwrap();
        assert!(!activity.unused());
    }

    #[tokio::test]
    async fn a_busy_pause_is_the_busy_period() {
        let activity = Activity::default();
        let started = tokio::time::Instant::now();
        activity.pause(Duration::from_millis(30), QUIET_EVERY, || false).await;
        assert!(started.elapsed() < QUIET_EVERY);
    }
}
