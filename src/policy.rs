//! The room's policy, compiled once from a validated configuration: at start-up and at every
//! reload, never per request.
//!
//! [`crate::config::Config`] says what the operator wrote, typed and validated; a [`Policy`]
//! holds every decision derived from it that the request handlers, the admission ticker and the
//! watchers share: the rules the Redis scripts apply, the configured pace, whether the room
//! listens (measured rate) and whether polls may be answered without Redis. Each such decision is
//! made here and nowhere else, so two services can never disagree about it, and a reload swaps
//! one compiled value (see [`crate::room::Room`]).

use std::time::Duration;

use crate::config::Config;
use crate::rules::{self, Controller, Pace, Rate};
use crate::store::RoomRules;

/// A validated configuration and the policy compiled from it: what every service reads per
/// request or tick, taken as one snapshot so a reload never changes the rules half way through.
#[derive(Debug)]
pub struct Settings {
    pub config: Config,
    pub policy: Policy,
}

impl Settings {
    pub fn new(config: Config) -> Settings {
        let policy = Policy::compile(&config);
        Settings { config, policy }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The admission rules as the scripts take them (contract sections 3 and 11).
    pub rules: RoomRules,
    /// The fixed rate of section 3: what estimates use unless the room listens.
    pub configured_pace: Pace,
    /// `poll_after` as position thresholds at the configured pace, for enforced polling.
    pub poll_thresholds: Vec<(u64, Duration)>,
    /// Whether any admission switch is on: then the room logs its admissions and estimates use
    /// the measured rate and the batch in force.
    pub listens: bool,
    /// Whether a waiting user's poll may be answered from this proxy's view of the line: not
    /// when Redis must see every poll (enforced polling, abandonment).
    pub local_answers: bool,
    /// `1 - polling.grace` when polling is enforced.
    pub on_time_factor: Option<f64>,
    /// The adaptive controller's settings, when `admission.adaptive` is on.
    pub controller: Option<Controller>,
    /// The floor of the measured rate: `min_batch` per interval (1 without adaptive).
    pub min_batch: u32,
    /// `endpoints.hold` in whole seconds, rounded up: a waiting user whose estimate is within it
    /// is told `pollAfter: 0` and has their status poll held (0: never).
    pub hold_secs: u64,
}

impl Policy {
    pub fn compile(config: &Config) -> Policy {
        let admission = &config.admission;
        let batch_size = admission.batch_size.get();
        let min_batch = admission.adaptive.as_ref().map(|a| a.min_batch.get());
        let rules = RoomRules {
            interval: admission.interval,
            batch_size,
            token_ttl: config.token.ttl,
            instant: admission.instant,
            max_active: admission.max_active,
            min_batch,
            // The configuration refuses a value shorter than the longest pollAfter a user can be
            // told, so it is used as written.
            abandon_after: config.queue.abandon_after,
            polls_enforced: config.polling.enforce,
        };
        let configured_pace =
            Pace::configured(Rate { batch: batch_size as u64, interval: admission.interval });
        let hold_secs = rules::ceil_secs(config.endpoints.hold);
        Policy {
            poll_thresholds: rules::pace_thresholds(configured_pace, &config.poll_after, hold_secs),
            hold_secs,
            configured_pace,
            listens: rules.listens(),
            local_answers: !config.polling.enforce && config.queue.abandon_after.is_zero(),
            on_time_factor: config.polling.enforce.then_some(1.0 - config.polling.grace),
            controller: admission.adaptive.as_ref().map(|a| Controller {
                target_p95: a.target_p95,
                min_batch: a.min_batch.get(),
                max_batch: batch_size,
                interval: admission.interval,
            }),
            min_batch: min_batch.unwrap_or(1),
            rules,
        }
    }

    /// The batch in force for a batch the adaptive controller stored: within the bounds
    /// configured now (a reload may have moved them since it was stored), or `batch_size` when
    /// nothing adapts or the controller has not stepped yet.
    pub fn batch_in_force(&self, stored: Option<u32>) -> u32 {
        match (self.rules.min_batch, stored) {
            (Some(min), Some(stored)) => stored.clamp(min, self.rules.batch_size),
            _ => self.rules.batch_size,
        }
    }

    /// Users per second at the configured rate, for the gauge.
    pub fn configured_rate(&self) -> f64 {
        self.configured_pace.rate.per_second()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(yaml: &str) -> Policy {
        Policy::compile(&Config::parse(&format!("upstream: 127.0.0.1:1\n{yaml}")).unwrap())
    }

    #[test]
    fn the_fixed_rate_listens_to_nothing_and_answers_locally() {
        let p = policy("admission: {interval: 100ms, batch_size: 10}");
        assert!(!p.listens);
        assert!(p.local_answers);
        assert_eq!(p.on_time_factor, None);
        assert_eq!(p.controller, None);
        assert_eq!(p.configured_rate(), 100.0);
        assert_eq!(p.batch_in_force(Some(3)), 10, "a stored batch means nothing without adaptive");
    }

    #[test]
    fn each_switch_makes_the_room_listen() {
        for switch in ["instant: true", "max_active: 5", "adaptive: {min_batch: 2}"] {
            assert!(policy(&format!("admission: {{{switch}}}")).listens, "{switch}");
        }
    }

    #[test]
    fn polls_redis_must_see_are_never_answered_locally() {
        assert!(!policy("polling: {enforce: true}").local_answers);
        assert!(!policy("queue: {abandon_after: 30s}").local_answers);
        assert_eq!(policy("polling: {enforce: true, grace: 25%}").on_time_factor, Some(0.75));
    }

    #[test]
    fn the_stored_batch_is_kept_within_the_bounds_configured_now() {
        let p = policy("admission: {batch_size: 8, adaptive: {min_batch: 2}}");
        assert_eq!(p.batch_in_force(None), 8);
        assert_eq!(p.batch_in_force(Some(5)), 5);
        assert_eq!(p.batch_in_force(Some(1)), 2);
        assert_eq!(p.batch_in_force(Some(20)), 8);
        assert_eq!(p.min_batch, 2);
    }
}
