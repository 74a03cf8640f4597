//! The configuration: what operators write (`raw`, serde structs that refuse unknown keys) kept
//! apart from what the code uses (`Config`, typed and validated), joined by one function,
//! [`Config::from_raw`].
//!
//! Every problem is collected, structural (an unknown key, a string where a number belongs, see
//! [`structure`]) and semantic alike, so an operator fixing a file on sale day sees all of them at
//! once, each with its key path.

use std::fmt;
use std::time::Duration;

mod event;
mod identity;
mod load;
mod model;
pub mod raw;
mod rooms;
pub mod schema;
mod structure;
mod units;
mod validate;

pub use crate::identity::IdentityConfig;
pub use identity::{JwtConfig, TokenSource};
pub use event::{format_time, parse_time, EventConfig, Phase};
pub use validate::Env;
pub use model::*;
pub use raw::{RoomMode, UnknownOutcome};
pub use units::{parse_size, LIMIT_HEAD_RANGE, LIMIT_TIMEOUT_RANGE};

pub use crate::store::DEFAULT_ROOM;

/// The shortest admission interval served: the ticker and the Redis schedule count in
/// microseconds, but below a millisecond a tick's own round trip is the interval.
const MIN_INTERVAL: Duration = Duration::from_millis(1);
/// Longer intervals (and token lifetimes) than a day are typos, and a duration of years would
/// overflow the microsecond and millisecond counts handed to Redis.
const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);
const MAX_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest a status poll may be held: load balancers commonly give up on a request that has
/// not answered within 60 s, and a client would see that as an error rather than its place.
const MAX_HOLD: Duration = Duration::from_secs(60);
/// Every tick hands the admit script one fresh token per place in the batch (Lua has no secure
/// randomness): 10,000 is about 370 KB per call. A higher rate takes a shorter interval.
const MAX_BATCH: u32 = 10_000;

/// One problem in a configuration file, named by its key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a configuration could not be used: every problem found, the file's structure (in file
/// order) before its values (in the order of the contract's sections).
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.problems.iter().map(Problem::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl ConfigError {
    fn one(path: &str, message: impl Into<String>) -> Self {
        ConfigError { problems: vec![Problem { path: path.into(), message: message.into() }] }
    }
}

#[cfg(test)]
mod tests;
