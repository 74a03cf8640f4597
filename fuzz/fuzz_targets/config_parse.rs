//! `Config::parse` on arbitrary text: never a panic, never a hang; every refusal names at least
//! one problem; every acceptance keeps the invariants the rest of the proxy relies on.

#![no_main]

use libfuzzer_sys::fuzz_target;
use waitroom::config::Config;
use waitroom::policy::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse_in(text, std::path::Path::new("/nonexistent-waitroom-fuzz")) {
        Ok(c) => {
            assert!(c.admission.batch_size.get() >= 1);
            assert!(!c.admission.interval.is_zero());
            assert!(c.queue.capacity.get() >= 1);
            assert!(!c.token.ttl.is_zero());
            assert!(c.endpoints.prefix.starts_with('/') || c.endpoints.prefix.is_empty());
            assert!(c.poll_after.last().is_some_and(|t| t.min_wait.is_zero()));
            assert!((0.0..1.0).contains(&c.polling.grace));
            // Compiling the accepted configuration's policy must not panic either.
            let policy = Policy::compile(&c);
            // One threshold a tier, and one more (pollAfter 0) in front of them with a hold.
            assert_eq!(policy.poll_thresholds.len(), c.poll_after.len() + usize::from(policy.hold_secs > 0));
            assert!(policy.configured_rate() > 0.0);
        }
        Err(e) => {
            assert!(!e.problems.is_empty());
            assert!(e.problems.iter().all(|p| !p.message.is_empty()));
        }
    }
});
