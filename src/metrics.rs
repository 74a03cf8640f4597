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
//!
//! Every metric that describes a room carries the room's name as `room` (contract sections 4 and
//! 17): each room holds its own children ([`RoomMetrics`]), made with the room, so the request
//! paths count without looking a label up. Redis, reloads, connections and the log are the
//! process's and carry no room.

use std::sync::{LazyLock, OnceLock};

use prometheus::{
    register_gauge_vec, register_histogram_vec, register_int_counter, register_int_counter_vec,
    register_int_gauge, register_int_gauge_vec, Gauge, GaugeVec, Histogram, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec,
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

/// The labels of a metric that describes a room and nothing else (contract sections 4 and 17).
const ROOM: &[&str] = &["room"];

/// One room's children of a vector labelled `room` and one more label, for the values a hot
/// path uses, each looked up on its first use and kept: `with_label_values` hashes the values on
/// every call (about 130 instructions, a status poll counted twice; callgrind). Other values are
/// looked up on every call, and a child appears in the exposition only once used, as with
/// `with_label_values`.
pub struct Labelled<M: 'static, const N: usize> {
    /// The vector's `with_label_values`.
    child: fn(&[&str]) -> M,
    room: Box<str>,
    values: [&'static str; N],
    children: [OnceLock<M>; N],
}

impl<M, const N: usize> Labelled<M, N> {
    fn new(child: fn(&[&str]) -> M, room: &str, values: [&'static str; N]) -> Self {
        Labelled { child, room: room.into(), values, children: [const { OnceLock::new() }; N] }
    }

    /// Runs `f` on the room's child for `value`.
    pub fn with<R>(&self, value: &str, f: impl FnOnce(&M) -> R) -> R {
        match self.values.iter().position(|v| *v == value) {
            Some(i) => f(self.children[i].get_or_init(|| (self.child)(&[&self.room, value]))),
            None => f(&(self.child)(&[&self.room, value])),
        }
    }
}

/// What a request's answer is counted under: its room's, or for a request that belongs to no
/// room (a pass-through) the series whose `room` is empty, which Prometheus reads as no label.
pub struct RequestMetrics {
    pub protected: Labelled<IntCounter, 1>,
    pub upstream_responses: Labelled<IntCounter, 1>,
    pub request_duration: Labelled<Histogram, 4>,
    pub upstream_duration: Labelled<Histogram, 2>,
}

impl RequestMetrics {
    fn new(room: &str) -> RequestMetrics {
        RequestMetrics {
            protected: Labelled::new(|l| PROTECTED_TOTAL.with_label_values(l), room, ["forwarded"]),
            upstream_responses: Labelled::new(|l| UPSTREAM_RESPONSES_TOTAL.with_label_values(l), room, ["2xx"]),
            request_duration: Labelled::new(
                |l| REQUEST_DURATION.with_label_values(l),
                room,
                ["status", "enter", "protected", "passthrough"],
            ),
            upstream_duration: Labelled::new(|l| UPSTREAM_DURATION.with_label_values(l), room, ["protected", "passthrough"]),
        }
    }
}

/// The requests that belong to no room.
pub static OUTSIDE_ROOMS: LazyLock<RequestMetrics> = LazyLock::new(|| RequestMetrics::new(""));

/// One room's series, made with the room. The room-wide gauges are set from the room's first
/// reading on, so they are exported from the first scrape; labelled counters appear once used.
pub struct RoomMetrics {
    pub queue_length: IntGauge,
    pub queue_tail_wait: IntGauge,
    pub active_tokens: IntGauge,
    pub admission_batch: IntGauge,
    pub admission_rate: Gauge,
    pub estimate_rate: Gauge,
    pub room_state: Labelled<IntGauge, 0>,
    pub room_state_changed: Gauge,
    pub enter: Labelled<IntCounter, 2>,
    pub status: Labelled<IntCounter, 3>,
    pub admitted: IntCounter,
    pub ticks: Labelled<IntCounter, 0>,
    pub abandoned: IntCounter,
    pub tokens_consumed: IntCounter,
    pub shadow_passed: Labelled<IntCounter, 0>,
    pub held_polls: IntGauge,
    pub held_ready_delay: Histogram,
    pub event_phase: Labelled<IntGauge, 0>,
    pub event_prequeued: IntGauge,
    pub event_drawn: IntGauge,
    pub requests: RequestMetrics,
}

impl RoomMetrics {
    pub fn new(room: &str) -> RoomMetrics {
        let one = [room];
        RoomMetrics {
            queue_length: QUEUE_LENGTH.with_label_values(&one),
            queue_tail_wait: QUEUE_TAIL_WAIT.with_label_values(&one),
            active_tokens: ACTIVE_TOKENS.with_label_values(&one),
            admission_batch: ADMISSION_BATCH.with_label_values(&one),
            admission_rate: ADMISSION_RATE.with_label_values(&one),
            estimate_rate: ESTIMATE_RATE.with_label_values(&one),
            room_state: Labelled::new(|l| ROOM_STATE.with_label_values(l), room, []),
            room_state_changed: ROOM_STATE_CHANGED.with_label_values(&one),
            enter: Labelled::new(|l| ENTER_TOTAL.with_label_values(l), room, ["queued", "already_waiting"]),
            status: Labelled::new(|l| STATUS_TOTAL.with_label_values(l), room, ["WAITING", "READY", "NOT_IN_QUEUE"]),
            admitted: ADMITTED_TOTAL.with_label_values(&one),
            ticks: Labelled::new(|l| ADMISSION_TICKS_TOTAL.with_label_values(l), room, []),
            abandoned: ABANDONED_TOTAL.with_label_values(&one),
            tokens_consumed: TOKENS_CONSUMED_TOTAL.with_label_values(&one),
            shadow_passed: Labelled::new(|l| SHADOW_PASSED_TOTAL.with_label_values(l), room, []),
            held_polls: HELD_POLLS.with_label_values(&one),
            held_ready_delay: HELD_READY_DELAY.with_label_values(&one),
            event_phase: Labelled::new(|l| EVENT_PHASE.with_label_values(l), room, []),
            event_prequeued: EVENT_PREQUEUED.with_label_values(&one),
            event_drawn: EVENT_DRAWN.with_label_values(&one),
            requests: RequestMetrics::new(room),
        }
    }
}

metric!(QUEUE_LENGTH: IntGaugeVec =
    register_int_gauge_vec!("waitroom_queue_length", "Users waiting in the room's line (room-wide, from Redis)", ROOM));
metric!(QUEUE_TAIL_WAIT: IntGaugeVec = register_int_gauge_vec!(
    "waitroom_queue_tail_wait_seconds",
    "Estimated wait of the last user in line, as enter and status would estimate it (room-wide)",
    ROOM
));
metric!(ACTIVE_TOKENS: IntGaugeVec =
    register_int_gauge_vec!("waitroom_active_tokens", "Entry tokens issued and not yet used or expired (room-wide)",
    ROOM
));
metric!(ADMISSION_BATCH: IntGaugeVec = register_int_gauge_vec!(
    "waitroom_admission_batch",
    "Users the room admits per interval: the batch in force (the adaptive controller's, else batch_size; room-wide)",
    ROOM
));
metric!(ADMISSION_RATE: GaugeVec = register_gauge_vec!(
    "waitroom_admission_rate_per_second",
    "The configured admission rate: batch_size / interval",
    ROOM
));
metric!(ESTIMATE_RATE: GaugeVec = register_gauge_vec!(
    "waitroom_admission_estimate_rate_per_second",
    "The admission rate estimatedWaitTime is computed with: the configured one, or with an admission switch on the room's measured rate over the last 10 s (room-wide)",
    ROOM
));
metric!(ROOM_STATE: IntGaugeVec = register_int_gauge_vec!(
    "waitroom_room_state",
    "The room's state: 1 for the current one of open, paused, closed (room-wide, from Redis)",
    &["room", "state"]
));
metric!(ROOM_STATE_CHANGED: GaugeVec = register_gauge_vec!(
    "waitroom_room_state_changed_timestamp_seconds",
    "When the room's state last changed (Unix time, Redis's clock; room-wide)",
    ROOM
));
metric!(ENTER_TOTAL: IntCounterVec =
    register_int_counter_vec!("waitroom_enter_total", "Enter calls by outcome", &["room", "result"]));
metric!(STATUS_TOTAL: IntCounterVec =
    register_int_counter_vec!("waitroom_status_total", "Status calls by answer", &["room", "status"]));
metric!(ADMITTED_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_admitted_total",
    "Users admitted (given an entry token) by this proxy's ticks and instant passes",
    ROOM
));
metric!(ADMISSION_TICKS_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_admission_ticks_total",
    "Admission script calls by this proxy: admitted (due, this proxy admitted), idle (due, line empty), early (another proxy had it)",
    &["room", "result"]
));
metric!(ABANDONED_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_abandoned_total",
    "Places lost by users who stopped polling, counted by the proxy whose script removed them",
    ROOM
));
metric!(TOKENS_CONSUMED_TOTAL: IntCounterVec =
    register_int_counter_vec!("waitroom_tokens_consumed_total", "Entry tokens spent by a successful protected request",
    ROOM
));
metric!(PROTECTED_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_protected_requests_total",
    "Protected requests by outcome",
    &["room", "result"]
));
metric!(UPSTREAM_RESPONSES_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_upstream_responses_total",
    "Upstream responses to protected and pass-through requests by status class",
    &["room", "class"]
));
metric!(SHADOW_PASSED_TOTAL: IntCounterVec = register_int_counter_vec!(
    "waitroom_shadow_passed_total",
    "Protected requests a room in mode: shadow forwarded although it would have refused them, by the result they would have had",
    &["room", "would"]
));


metric!(REQUEST_DURATION: HistogramVec = register_histogram_vec!(
    "waitroom_request_duration_seconds",
    "Time from request to complete response, by endpoint kind",
    &["room", "endpoint"],
    LATENCY_BUCKETS.to_vec()
));
metric!(UPSTREAM_DURATION: HistogramVec = register_histogram_vec!(
    "waitroom_upstream_duration_seconds",
    "Time from forwarding a request to the upstream's response header, by endpoint kind",
    &["room", "endpoint"],
    LATENCY_BUCKETS.to_vec()
));
metric!(LOG_LINES_DROPPED_TOTAL: IntCounter = register_int_counter!(
    "waitroom_log_lines_dropped_total",
    "Log lines dropped because the log's reader (stderr) did not keep up: lines wait in a bounded buffer, never on a request"
));
metric!(REDIS_ERRORS_TOTAL: IntCounter =
    register_int_counter!("waitroom_redis_errors_total", "Redis calls that failed or timed out"));
metric!(CONFIG_RELOADS_TOTAL: IntCounterVec =
    register_int_counter_vec!("waitroom_config_reloads_total", "Configuration reloads by result", &["result"]));
metric!(HELD_POLLS: IntGaugeVec = register_int_gauge_vec!(
    "waitroom_held_polls",
    "Status polls this proxy holds open until their user is admitted or endpoints.hold passes",
    ROOM
));
metric!(HELD_READY_DELAY: HistogramVec = register_histogram_vec!(
    "waitroom_held_ready_delay_seconds",
    "Time from a held user's admission (their token's issue, by Redis's clock) to READY sent on the held poll",
    ROOM,
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
    &["room", "phase"]
));
metric!(EVENT_PREQUEUED: IntGaugeVec = register_int_gauge_vec!(
    "waitroom_event_prequeued",
    "Users who entered the event's pre-queue (room-wide; fixed from the draw on)",
    ROOM
));
metric!(EVENT_DRAWN: IntGaugeVec = register_int_gauge_vec!(
    "waitroom_event_drawn",
    "Users the draw put at the front of the line; 0 until the draw (room-wide)",
    ROOM
));

/// Removes every series of the room `room`: a room a reload removed must not leave its last
/// gauges behind, frozen (a line near capacity would keep its alert firing for a room that no
/// longer exists). Adding the room back starts its series again, counters from zero, which
/// Prometheus reads as a restart.
pub fn forget_room(room: &str) {
    forget_in(&QUEUE_LENGTH, room);
    forget_in(&QUEUE_TAIL_WAIT, room);
    forget_in(&ACTIVE_TOKENS, room);
    forget_in(&ADMISSION_BATCH, room);
    forget_in(&ADMISSION_RATE, room);
    forget_in(&ESTIMATE_RATE, room);
    forget_in(&ROOM_STATE, room);
    forget_in(&ROOM_STATE_CHANGED, room);
    forget_in(&ENTER_TOTAL, room);
    forget_in(&STATUS_TOTAL, room);
    forget_in(&ADMITTED_TOTAL, room);
    forget_in(&ADMISSION_TICKS_TOTAL, room);
    forget_in(&ABANDONED_TOTAL, room);
    forget_in(&TOKENS_CONSUMED_TOTAL, room);
    forget_in(&PROTECTED_TOTAL, room);
    forget_in(&UPSTREAM_RESPONSES_TOTAL, room);
    forget_in(&SHADOW_PASSED_TOTAL, room);
    forget_in(&REQUEST_DURATION, room);
    forget_in(&UPSTREAM_DURATION, room);
    forget_in(&HELD_POLLS, room);
    forget_in(&HELD_READY_DELAY, room);
    forget_in(&EVENT_PHASE, room);
    forget_in(&EVENT_PREQUEUED, room);
    forget_in(&EVENT_DRAWN, room);
}

/// Removes the series of `vec` whose `room` is `room`, whatever its other labels.
fn forget_in<T: prometheus::core::MetricVecBuilder>(vec: &prometheus::core::MetricVec<T>, room: &str) {
    use prometheus::core::Collector;
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: std::collections::HashMap<&str, &str> =
                metric.get_label().iter().map(|pair| (pair.name(), pair.value())).collect();
            if labels.get("room") == Some(&room) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    metric!(TRIED: IntCounterVec =
        IntCounterVec::new(prometheus::Opts::new("hot_tried_total", "test"), &["room", "result"]));

    #[test]
    fn a_forgotten_room_leaves_no_series_and_the_others_stay() {
        ENTER_TOTAL.with_label_values(&["gone", "queued"]).inc();
        ENTER_TOTAL.with_label_values(&["gone", "full"]).inc();
        QUEUE_LENGTH.with_label_values(&["gone"]).set(7);
        ENTER_TOTAL.with_label_values(&["kept", "queued"]).inc();
        forget_room("gone");
        let text = String::from_utf8(render()).unwrap();
        assert!(!text.contains("room=\"gone\""), "{text}");
        assert!(text.contains("waitroom_enter_total{result=\"queued\",room=\"kept\"} 1"), "{text}");
    }

    #[test]
    fn a_kept_child_is_the_series_with_label_values_finds() {
        let tried = Labelled::new(|l| TRIED.with_label_values(l), "shoes", ["a", "b"]);
        for _ in 0..3 {
            tried.with("b", |count| count.inc());
        }
        tried.with("other", |count| count.inc_by(5));
        assert_eq!(TRIED.with_label_values(&["shoes", "b"]).get(), 3);
        assert_eq!(TRIED.with_label_values(&["shoes", "other"]).get(), 5);
        // "a" was never used: no series, as with `with_label_values`.
        let families = prometheus::core::Collector::collect(&*TRIED);
        let labels: Vec<_> = families[0].get_metric().iter().map(|m| m.get_label()[1].value().to_owned()).collect();
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert!(!labels.iter().any(|l| l == "a"));
    }
}
