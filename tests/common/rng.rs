//! A small random source for the tests that draw their own schedule or input (the chaos test's
//! faults, the HTTP/1 fuzz target's streams): xorshift64*, enough randomness for that, and a
//! run replays from its seed.

use std::time::Duration;

/// xorshift64*: a seed replays a run. Seed it odd (never 0: xorshift stays at 0 from there).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % (n as u64).max(1)) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A duration from `lo` to `hi` milliseconds, both included.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below((hi - lo + 1) as usize) as u64)
    }
}

/// A seed from the clock, for a run not told which seed to replay (odd, so never 0).
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1
}
