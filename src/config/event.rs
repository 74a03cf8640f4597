//! `event` (contract section 14): when the pre-queue opens, when the room opens and closes, and
//! which phase an instant of Redis's clock falls in.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

/// `event` in the configuration, validated: times are instants, `closes_at` is after
/// `opens_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventConfig {
    pub opens_at: DateTime<Utc>,
    /// Enter is accepted from `opens_at - prequeue`.
    pub prequeue: Duration,
    pub closes_at: Option<DateTime<Utc>>,
    /// `false`: the pre-queue keeps arrival order.
    pub shuffle: bool,
}

/// An RFC 3339 time, any offset, as an instant.
pub fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim()).map(|t| t.with_timezone(&Utc)).map_err(|e| e.to_string())
}

/// A time as the public JSON shows it: UTC, fractions of a second only when there are some.
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

impl EventConfig {
    pub fn opens_ms(&self) -> i64 {
        self.opens_at.timestamp_millis()
    }

    /// When the pre-queue opens.
    pub fn prequeue_ms(&self) -> i64 {
        self.opens_ms().saturating_sub(self.prequeue.as_millis().min(i64::MAX as u128) as i64)
    }

    pub fn closes_ms(&self) -> Option<i64> {
        self.closes_at.map(|t| t.timestamp_millis())
    }

    /// The phase at `now_ms` of Redis's clock.
    pub fn phase_at(&self, now_ms: i64) -> Phase {
        if self.closes_ms().is_some_and(|c| now_ms >= c) {
            Phase::Closed
        } else if now_ms >= self.opens_ms() {
            Phase::Open
        } else if now_ms >= self.prequeue_ms() {
            Phase::Prequeue
        } else {
            Phase::Before
        }
    }

    /// What `--check` says about the event.
    pub fn describe(&self) -> String {
        let ms = |d: i64| DateTime::<Utc>::from_timestamp_millis(d).map(format_time).unwrap_or_default();
        format!(
            "event: pre-queue from {}, opens at {}, {}, {}",
            ms(self.prequeue_ms()),
            format_time(self.opens_at),
            match self.closes_at {
                Some(t) => format!("closes at {}", format_time(t)),
                None => "no close".to_string(),
            },
            if self.shuffle { "pre-queue drawn in HMAC order" } else { "pre-queue kept in arrival order" },
        )
    }
}

/// Where an event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Before,
    Prequeue,
    Open,
    Closed,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::Prequeue => "prequeue",
            Phase::Open => "open",
            Phase::Closed => "closed",
        }
    }

    pub const ALL: [Phase; 4] = [Phase::Before, Phase::Prequeue, Phase::Open, Phase::Closed];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn event(yaml: &str) -> Result<EventConfig, Vec<String>> {
        Config::parse(&format!("upstream: 127.0.0.1:1\nevent: {yaml}"))
            .map(|c| c.event.expect("event given"))
            .map_err(|e| e.problems.iter().map(|p| p.to_string()).collect())
    }

    #[test]
    fn the_event_is_validated_with_key_paths() {
        let e = event("{opens_at: \"2026-12-24T19:00:00+09:00\", closes_at: \"2026-12-24T12:00:00Z\"}").unwrap();
        assert_eq!(format_time(e.opens_at), "2026-12-24T10:00:00Z");
        assert_eq!(e.prequeue, Duration::from_secs(30 * 60), "the contract's example as default");
        assert!(e.shuffle);
        let problems = event("{opens_at: tomorrow, prequeue: -5m, closes_at: \"2026-12-24\"}").unwrap_err();
        assert!(problems[0].starts_with("event.opens_at: 'tomorrow' is not an RFC 3339 time"), "{problems:?}");
        assert!(problems[1].starts_with("event.prequeue: "), "{problems:?}");
        assert!(problems[2].starts_with("event.closes_at: "), "{problems:?}");
        let before = event("{opens_at: \"2026-12-24T10:00:00Z\", closes_at: \"2026-12-24T10:00:00Z\"}").unwrap_err();
        assert_eq!(before, vec!["event.closes_at: must be after event.opens_at"]);
        assert!(event("{opens_at: \"2026-12-24T10:00:00Z\", seed: 1}").is_err(), "unknown keys");
        assert!(event("{prequeue: 5m}").is_err(), "opens_at is required");
    }

    #[test]
    fn phases_follow_the_times() {
        let e = event("{opens_at: \"2026-12-24T10:00:00Z\", prequeue: 30m, closes_at: \"2026-12-24T12:00:00Z\"}")
            .unwrap();
        let at = |t: &str| e.phase_at(parse_time(t).unwrap().timestamp_millis());
        assert_eq!(at("2026-12-24T09:29:59.999Z"), Phase::Before);
        assert_eq!(at("2026-12-24T09:30:00Z"), Phase::Prequeue);
        assert_eq!(at("2026-12-24T09:59:59.999Z"), Phase::Prequeue);
        assert_eq!(at("2026-12-24T10:00:00Z"), Phase::Open);
        assert_eq!(at("2026-12-24T12:00:00Z"), Phase::Closed);
        assert!(e.describe().contains("pre-queue from 2026-12-24T09:30:00Z, opens at 2026-12-24T10:00:00Z"));
    }
    #[test]
    fn absurd_times_are_described_not_panicked_on() {
        let e = event("{opens_at: \"9999-12-31T23:59:59Z\", prequeue: 10000000000000h}").unwrap();
        assert_eq!(e.phase_at(0), Phase::Prequeue);
        assert!(!e.describe().is_empty());
    }
}
