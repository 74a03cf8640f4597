//! Prometheus metrics: statics in the default registry, recorded where each outcome is decided,
//! served by [`crate::health`] on `metrics_listen`.
//!
//! Counters are per proxy (sum them across a room's proxies); gauges named `waitroom_queue_*`,
//! `waitroom_active_tokens`, `waitroom_admission_batch` and
//! `waitroom_admission_estimate_rate_per_second` are the room's truth read from Redis about four
//! times a second, so every proxy of a room reports the same value. Room-wide events are counted
//! once, by the proxy whose script made them happen: an admission by the proxy whose tick (or
//! instant pass) issued the token, an abandoned place by the proxy whose tick, status or enter
//! removed it.

use std::sync::{LazyLock, OnceLock};

use prometheus::{
    register_histogram_vec, register_int_counter, register_int_counter_vec, register_int_gauge,
    register_int_gauge_vec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
};

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

macro_rules! metric {
    ($name:ident: $ty:ty = $make:expr) => {
        pub static $name: LazyLock<$ty> =
            LazyLock::new(|| $make.expect(concat!("registering ", stringify!($name))));
    };
}

/// A vector's children for the label values a hot path uses, each looked up on its first use
/// and kept: `with_label_values` hashes the values on every call (about 130 instructions, a
/// status poll counted twice; callgrind). Other values are looked up on every call, and a child
/// appears in the exposition only once used, as with `with_label_values`.
pub struct Hot<M: 'static, const N: usize> {
    /// The vector's `with_label_values`.
    child: fn(&str) -> M,
    values: [&'static str; N],
    children: [OnceLock<M>; N],
}

impl<M, const N: usize> Hot<M, N> {
    pub const fn new(child: fn(&str) -> M, values: [&'static str; N]) -> Self {
        Hot { child, values, children: [const { OnceLock::new() }; N] }
    }

    /// Runs `f` on the child for `value`.
    pub fn with<R>(&self, value: &str, f: impl FnOnce(&M) -> R) -> R {
        match self.values.iter().position(|v| *v == value) {
            Some(i) => f(self.children[i].get_or_init(|| (self.child)(value))),
            None => f(&(self.child)(value)),
        }
    }
}

metric!(QUEUE_LENGTH: IntGauge =
    register_int_gauge!("waitroom_queue_length", "Users waiting in the room's line (room-wide, from Redis)"));
metric!(QUEUE_TAIL_WAIT: IntGauge = register_int_gauge!(
    "waitroom_queue_tail_wait_seconds",
    "Estimated wait of the last user in line, as enter and status would estimate it (room-wide)"
));
metric!(ACTIVE_TOKENS: IntGauge =
    register_int_gauge!("waitroom_active_tokens", "Entry tokens issued and not yet used or expired (room-wide)"));
metric!(ADMISSION_BATCH: IntGauge = register_int_gauge!(
    "waitroom_admission_batch",
    "Users the room admits per interval: the batch in force (the adaptive controller's, else batch_size; room-wide)"
));
metric!(ADMISSION_RATE: prometheus::Gauge = prometheus::register_gauge!(
    "waitroom_admission_rate_per_second",
    "The configured admission rate: batch_size / interval"
));
metric!(ESTIMATE_RATE: prometheus::Gauge = prometheus::register_gauge!(
    "waitroom_admission_estimate_rate_per_second",
    "The admission rate estimatedWaitTime is computed with: the configured one, or with an admission switch on the room's measured rate over the last 10 s (room-wide)"
));
metric!(ROOM_STATE: IntGaugeVec = register_int_gauge_vec!(
    "waitroom_room_state",
    "The room's state: 1 for the current one of open, paused, closed (room-wide, from Redis)",
    &["state"]
));
metric!(ROOM_STATE_CHANGED: prometheus::Gauge = prometheus::register_gauge!(
    "waitroom_room_state_changed_timestamp_seconds",
    "When the room's state last changed (Unix time, Redis's clock; room-wide)"
));
metric!(ENTER_TOTAL: IntCounterVec =
    register_int_counter_vec!("waitroom_enter_total", "Enter calls by outcome", &["result"]));
metric!(STATUS_TOTAL: IntCounterVec =
    register_int_counter_vec!("waitroom_status_total", "Status calls by answer", &["status"]));
metric!(ADMITTED_TOTAL: IntCounter = register_int_counter!(
    "waitroom_admitted_total",
    "Users admitted (given an entry token) by this proxy's ticks and instant passes"
));
metric!(ADMISSION_TICKS_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_admission_ticks_total",
    "Admission script calls by this proxy: admitted (due, this proxy admitted), idle (due, line empty), early (another proxy had it)",
    &["result"]
));
metric!(ABANDONED_TOTAL: IntCounter = register_int_counter!(
    "waitroom_abandoned_total",
    "Places lost by users who stopped polling, counted by the proxy whose script removed them"
));
metric!(TOKENS_CONSUMED_TOTAL: IntCounter =
    register_int_counter!("waitroom_tokens_consumed_total", "Entry tokens spent by a successful protected request"));
metric!(PROTECTED_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_protected_requests_total",
    "Protected requests by outcome",
    &["result"]
));
metric!(UPSTREAM_RESPONSES_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_upstream_responses_total",
    "Upstream responses to protected and pass-through requests by status class",
    &["class"]
));
/// `STATUS_TOTAL` by the answers a poll gives most.
pub static STATUS_BY_ANSWER: Hot<IntCounter, 3> =
    Hot::new(|v| STATUS_TOTAL.with_label_values(&[v]), ["WAITING", "READY", "NOT_IN_QUEUE"]);
/// `ENTER_TOTAL` by the outcomes a rush gives most.
pub static ENTER_BY_RESULT: Hot<IntCounter, 2> =
    Hot::new(|v| ENTER_TOTAL.with_label_values(&[v]), ["queued", "already_waiting"]);
metric!(SHADOW_PASSED_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_shadow_passed_total",
    "Protected requests a room in mode: shadow forwarded although it would have refused them, by the result they would have had",
    &["room", "would"]
));

/// Counts a protected request a room in shadow forwarded instead of refusing. Rooms other than
/// `default` come with section 17; until then this is the one room's name.
pub fn shadow_passed(would: &str) {
    SHADOW_PASSED_TOTAL.with_label_values(&["default", would]).inc();
}

/// `UPSTREAM_RESPONSES_TOTAL` for the class of nearly every response.
pub static UPSTREAM_RESPONSES_BY_CLASS: Hot<IntCounter, 1> =
    Hot::new(|v| UPSTREAM_RESPONSES_TOTAL.with_label_values(&[v]), ["2xx"]);
/// `PROTECTED_TOTAL` for the outcome of nearly every protected request.
pub static PROTECTED_BY_RESULT: Hot<IntCounter, 1> =
    Hot::new(|v| PROTECTED_TOTAL.with_label_values(&[v]), ["forwarded"]);
metric!(REQUEST_DURATION: HistogramVec = register_histogram_vec!(
    "waitroom_request_duration_seconds",
    "Time from request to complete response, by endpoint kind",
    &["endpoint"],
    LATENCY_BUCKETS.to_vec()
));
/// `REQUEST_DURATION` by the endpoints that answer the most requests.
pub static REQUEST_DURATION_BY_ENDPOINT: Hot<Histogram, 4> =
    Hot::new(|v| REQUEST_DURATION.with_label_values(&[v]), ["status", "enter", "protected", "passthrough"]);
metric!(UPSTREAM_DURATION: HistogramVec = register_histogram_vec!(
    "waitroom_upstream_duration_seconds",
    "Time from forwarding a request to the upstream's response header, by endpoint kind",
    &["endpoint"],
    LATENCY_BUCKETS.to_vec()
));
/// `UPSTREAM_DURATION` by the endpoints that go upstream.
pub static UPSTREAM_DURATION_BY_ENDPOINT: Hot<Histogram, 2> =
    Hot::new(|v| UPSTREAM_DURATION.with_label_values(&[v]), ["protected", "passthrough"]);
metric!(LOG_LINES_DROPPED_TOTAL: IntCounter = register_int_counter!(
    "waitroom_log_lines_dropped_total",
    "Log lines dropped because the log's reader (stderr) did not keep up: lines wait in a bounded buffer, never on a request"
));
metric!(REDIS_ERRORS_TOTAL: IntCounter =
    register_int_counter!("waitroom_redis_errors_total", "Redis calls that failed or timed out"));
metric!(CONFIG_RELOADS_TOTAL: IntCounterVec =
    register_int_counter_vec!("waitroom_config_reloads_total", "Configuration reloads by result", &["result"]));
metric!(HELD_POLLS: IntGauge = register_int_gauge!(
    "waitroom_held_polls",
    "Status polls this proxy holds open until their user is admitted or endpoints.hold passes"
));
metric!(HELD_READY_DELAY: prometheus::Histogram = prometheus::register_histogram!(
    "waitroom_held_ready_delay_seconds",
    "Time from a held user's admission (their token's issue, by Redis's clock) to READY sent on the held poll",
    vec![0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5]
));
metric!(REDIS_UP: IntGauge =
    register_int_gauge!("waitroom_redis_up", "1 while Redis answers this proxy's probes, else 0"));

/// Registers every metric, so unlabelled ones are exported from the first scrape on.
pub fn init() {
    LazyLock::force(&QUEUE_LENGTH);
    LazyLock::force(&QUEUE_TAIL_WAIT);
    LazyLock::force(&ACTIVE_TOKENS);
    LazyLock::force(&ADMISSION_BATCH);
    LazyLock::force(&ADMISSION_RATE);
    LazyLock::force(&ESTIMATE_RATE);
    LazyLock::force(&ENTER_TOTAL);
    LazyLock::force(&ROOM_STATE);
    LazyLock::force(&ROOM_STATE_CHANGED);
    LazyLock::force(&STATUS_TOTAL);
    LazyLock::force(&ADMITTED_TOTAL);
    LazyLock::force(&ADMISSION_TICKS_TOTAL);
    LazyLock::force(&ABANDONED_TOTAL);
    LazyLock::force(&TOKENS_CONSUMED_TOTAL);
    LazyLock::force(&PROTECTED_TOTAL);
    LazyLock::force(&SHADOW_PASSED_TOTAL);
    LazyLock::force(&UPSTREAM_RESPONSES_TOTAL);
    LazyLock::force(&REQUEST_DURATION);
    LazyLock::force(&UPSTREAM_DURATION);
    LazyLock::force(&REDIS_ERRORS_TOTAL);
    LazyLock::force(&LOG_LINES_DROPPED_TOTAL);
    LazyLock::force(&CONFIG_RELOADS_TOTAL);
    LazyLock::force(&REDIS_UP);
    LazyLock::force(&OPEN_CONNECTIONS);
    LazyLock::force(&HELD_POLLS);
    LazyLock::force(&HELD_READY_DELAY);
}

/// The text exposition of every registered metric.
pub fn render() -> Vec<u8> {
    use prometheus::Encoder;
    let mut out = Vec::with_capacity(8 * 1024);
    let encoder = prometheus::TextEncoder::new();
    if let Err(e) = encoder.encode(&prometheus::gather(), &mut out) {
        tracing::error!(error = %e, "encoding metrics failed");
    }
    out
}
metric!(OPEN_CONNECTIONS: IntGauge = register_int_gauge!(
    "waitroom_open_connections",
    "Client connections open on listen (limits.max_connections caps them)"
));
metric!(CONNECTIONS_CLOSED_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_connections_closed_total",
    "Client connections a limit refused or closed: max_connections, max_connections_per_address, idle_timeout, header_timeout, head_too_large",
    &["limit"]
));

// Scheduled events (contract section 14), read from Redis by every proxy's event watcher four
// times a second: room-wide, like the queue gauges. All 0 while no event is configured.
metric!(EVENT_PHASE: prometheus::IntGaugeVec = prometheus::register_int_gauge_vec!(
    "waitroom_event_phase",
    "1 for the event's current phase (before, prequeue, open, closed), by Redis's clock (room-wide)",
    &["phase"]
));
metric!(EVENT_PREQUEUED: IntGauge = register_int_gauge!(
    "waitroom_event_prequeued",
    "Users who entered the event's pre-queue (room-wide; fixed from the draw on)"
));
metric!(EVENT_DRAWN: IntGauge = register_int_gauge!(
    "waitroom_event_drawn",
    "Users the draw put at the front of the line; 0 until the draw (room-wide)"
));

#[cfg(test)]
mod tests {
    use super::*;

    metric!(TRIED: IntCounterVec =
        IntCounterVec::new(prometheus::Opts::new("hot_tried_total", "test"), &["result"]));
    static TRIED_BY_RESULT: Hot<IntCounter, 2> = Hot::new(|v| TRIED.with_label_values(&[v]), ["a", "b"]);

    #[test]
    fn a_hot_child_is_the_series_with_label_values_finds() {
        for _ in 0..3 {
            TRIED_BY_RESULT.with("b", |count| count.inc());
        }
        TRIED_BY_RESULT.with("other", |count| count.inc_by(5));
        assert_eq!(TRIED.with_label_values(&["b"]).get(), 3);
        assert_eq!(TRIED.with_label_values(&["other"]).get(), 5);
        // "a" was never used: no series, as with `with_label_values`.
        let families = prometheus::core::Collector::collect(&*TRIED);
        let labels: Vec<_> = families[0].get_metric().iter().map(|m| m.get_label()[0].value().to_owned()).collect();
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert!(!labels.iter().any(|l| l == "a"));
    }
}
