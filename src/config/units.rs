//! The units a configuration is written in (sizes, the served ranges of `limits`) and the small
//! readers of them that the validator and the JSON Schema share.

use std::time::Duration;

use http::Method;

/// The timeouts of `limits` that are served as written.
pub const LIMIT_TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(100)..=Duration::from_secs(24 * 3600);
/// The `limits.max_request_head` values that are served as written (bytes).
pub const LIMIT_HEAD_RANGE: std::ops::RangeInclusive<u64> = 1024..=512 * 1024;

/// A size with a unit: `B`, `KiB` (1024 B) or `MiB` (1024 KiB), e.g. `32KiB`, `512 B`.
/// `KB`, `MB`, `k` and friends are refused rather than guessed: nginx reads `32k` as 32768 bytes,
/// SI as 32000, and an operator should not have to know which one this file means.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let hint = "write a number with a unit: 512B, 32KiB, 1MiB";
    let Ok(number) = number.parse::<u64>() else {
        return Err(format!("'{text}' is not a size ({hint})"));
    };
    let factor = match unit.trim() {
        "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        "" => return Err(format!("'{text}' needs a unit ({hint})")),
        u if ["k", "K", "KB", "kB", "kb", "m", "M", "MB", "mb"].contains(&u) => {
            return Err(format!(
                "'{text}' is ambiguous (1000 or 1024?): write {number}KiB or {number}MiB for powers of 1024, or the bytes with B"
            ))
        }
        _ => return Err(format!("'{text}' is not a size ({hint})")),
    };
    number.checked_mul(factor).ok_or_else(|| format!("'{text}' is too large"))
}

pub(super) fn is_standard_method(m: &Method) -> bool {
    [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ]
    .contains(m)
}

