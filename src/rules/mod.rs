//! The queue's rules as pure functions: no Redis, no sockets, no clock. Everything the proxy tells
//! a waiting user (position, estimated wait, when to poll again, how long a token lives), every
//! decision about a request's token or its client address, and the adaptive controller's step
//! (p95 from the room's latency histogram, next batch) is made here, so it is tested here.
//!
//! One module per topic; the items are re-exported so callers say `rules::wait_secs`.
//! Identity checks live with the rest of identity, in [`crate::identity`].

use std::time::Duration;

pub mod adaptive;
pub mod address;
pub mod token;
pub mod wait;

pub use adaptive::*;
pub use address::*;
pub use token::*;
pub use wait::*;

/// Whole seconds, rounded up: what a `Retry-After` header or a JSON seconds field carries.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000_000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }
}
