//! The answers the proxy writes itself: JSON bodies with exactly the contract's keys, and the
//! headers that go with them. Built here, written to the socket by [`super::write_answer`].

use serde::Serialize;

use crate::config::Config;
use crate::rules::{self, Pace};

/// A complete response the proxy sends without asking the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    /// `Allow`, on 405.
    pub allow: Option<&'static str>,
    /// `Retry-After` in seconds, on FULL and 503.
    pub retry_after: Option<u64>,
}

/// The body of every queue answer; `status` is the tag, so it is always the first key.
#[derive(Serialize)]
#[serde(tag = "status", rename_all = "SCREAMING_SNAKE_CASE", rename_all_fields = "camelCase")]
enum QueueBody<'a> {
    /// Written by [`waiting_body`]; serde's bytes for it are what a test holds that to.
    #[cfg(test)]
    Waiting { position: u64, estimated_wait_time: Option<u64>, poll_after: u64 },
    Ready { token: &'a str, expires_in: u64, poll_after: Option<u64> },
    NotInQueue { poll_after: Option<u64> },
    Full { retry_after: u64 },
    TooEarly { retry_after: u64 },
    Limited { retry_after: u64 },
    NotOpen { opens_in: u64, poll_after: u64 },
    Prequeued { opens_in: u64, poll_after: u64 },
    Closed { poll_after: Option<u64> },
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

fn json(status: u16, body: &impl Serialize) -> Answer {
    Answer {
        status,
        // Serialising these plain structs cannot fail.
        body: serde_json::to_vec(body).unwrap_or_default(),
        allow: None,
        retry_after: None,
    }
}

/// The WAITING body, written by hand: it is nearly every answer of a rush (each poll, each new
/// user's enter), and serde's general path (escaping each key, a tag, an option) took a twelfth
/// of a status call's instructions. Only numbers vary, so nothing needs escaping; a test holds
/// these bytes to serde's for the same [`QueueBody::Waiting`].
fn waiting_body(position: u64, estimated_wait_time: Option<u64>, poll_after: u64) -> Vec<u8> {
    let mut number = itoa::Buffer::new();
    let mut body = Vec::with_capacity(96);
    body.extend_from_slice(br#"{"status":"WAITING","position":"#);
    body.extend_from_slice(number.format(position).as_bytes());
    body.extend_from_slice(br#","estimatedWaitTime":"#);
    match estimated_wait_time {
        Some(secs) => body.extend_from_slice(number.format(secs).as_bytes()),
        None => body.extend_from_slice(b"null"),
    }
    body.extend_from_slice(br#","pollAfter":"#);
    body.extend_from_slice(number.format(poll_after).as_bytes());
    body.push(b'}');
    body
}

impl Answer {
    /// WAITING at `position`, the estimate made at `pace` (the configured rate, or the room's
    /// measured one when an admission switch listens: see [`crate::admission::Pacing`]).
    /// While the room is `paused` nobody can know when admission resumes: the estimate is
    /// null, and pollAfter stays what the pace gives, so the poll clock the scripts enforce and
    /// the answers agree.
    pub fn waiting(position: u64, pace: Pace, config: &Config, paused: bool) -> Answer {
        let eta = rules::wait_secs(position, pace);
        let hold_secs = rules::ceil_secs(config.endpoints.hold);
        Answer::waiting_with(position, eta, paused, rules::poll_after_held(eta, &config.poll_after, hold_secs))
    }

    /// WAITING at the end of a held poll (contract section 13): ask again at once.
    pub fn waiting_after_hold(position: u64, pace: Pace, paused: bool) -> Answer {
        Answer::waiting_with(position, rules::wait_secs(position, pace), paused, 0)
    }

    /// WAITING for a user near the front whose poll could not be held (this proxy holds as many
    /// as `queue.capacity`): the tier's pollAfter, so the client does not ask again at once.
    pub fn waiting_unheld(position: u64, pace: Pace, config: &Config, paused: bool) -> Answer {
        let eta = rules::wait_secs(position, pace);
        Answer::waiting_with(position, eta, paused, rules::poll_after_secs(eta, &config.poll_after))
    }

    fn waiting_with(position: u64, eta: u64, paused: bool, poll_after: u64) -> Answer {
        let estimated_wait_time = (!paused).then_some(eta);
        Answer { status: 200, body: waiting_body(position, estimated_wait_time, poll_after), allow: None, retry_after: None }
    }

    pub fn ready(token: &str, remaining_ms: u64) -> Answer {
        json(
            200,
            &QueueBody::Ready {
                token,
                expires_in: rules::expires_in_secs(remaining_ms),
                poll_after: None,
            },
        )
    }

    pub fn not_in_queue() -> Answer {
        json(200, &QueueBody::NotInQueue { poll_after: None })
    }

    /// The room takes nobody (closed by an operator or the origin, contract section 15, or past
    /// an event's `closes_at`, section 14): the one answer for enter, and for the status of
    /// anyone not holding a token.
    pub fn closed() -> Answer {
        json(200, &QueueBody::Closed { poll_after: None })
    }

    pub fn full(config: &Config) -> Answer {
        let r = rules::ceil_secs(config.queue.retry_after);
        Answer { retry_after: Some(r), ..json(429, &QueueBody::Full { retry_after: r }) }
    }

    /// A status call earlier than the pollAfter last given (polling.enforce).
    pub fn too_early(retry_secs: u64) -> Answer {
        Answer { retry_after: Some(retry_secs), ..json(429, &QueueBody::TooEarly { retry_after: retry_secs }) }
    }

    /// A new identity from an address over its per-minute limit (abuse.identities_per_address).
    pub fn limited(retry_secs: u64) -> Answer {
        Answer { retry_after: Some(retry_secs), ..json(429, &QueueBody::Limited { retry_after: retry_secs }) }
    }

    /// Before a scheduled event's pre-queue opens: not queued; come back (contract section 14).
    pub fn not_open(opens_in: u64, config: &Config) -> Answer {
        let poll_after = crate::room::event::poll_after_before_opening(opens_in, &config.poll_after);
        json(200, &QueueBody::NotOpen { opens_in, poll_after })
    }

    /// In a scheduled event's pre-queue: the place is drawn at the opening.
    pub fn prequeued(opens_in: u64, config: &Config) -> Answer {
        let poll_after = crate::room::event::poll_after_before_opening(opens_in, &config.poll_after);
        json(200, &QueueBody::Prequeued { opens_in, poll_after })
    }

    /// A JSON body built elsewhere (the event's public endpoints), sent as written.
    pub fn json_body(status: u16, body: Vec<u8>) -> Answer {
        Answer { status, body, allow: None, retry_after: None }
    }

    pub fn error(status: u16, message: &str) -> Answer {
        json(status, &ErrorBody { error: message })
    }

    /// Redis could not be asked in time: the client should come back, not hang.
    pub fn unavailable(config: &Config) -> Answer {
        Answer {
            retry_after: Some(rules::ceil_secs(config.queue.retry_after)),
            ..Answer::error(503, "the waiting room is temporarily unavailable, retry later")
        }
    }

    pub fn method_not_allowed(allow: &'static str) -> Answer {
        Answer { allow: Some(allow), ..Answer::error(405, "method not allowed") }
    }

    /// A request whose user could not be established: 401 or 400 with the precise reason.
    pub fn identity(refusal: crate::identity::Refusal) -> Answer {
        Answer::error(refusal.status(), refusal.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::parse("upstream: 127.0.0.1:1").unwrap()
    }

    fn body(a: &Answer) -> String {
        String::from_utf8(a.body.clone()).unwrap()
    }

    #[test]
    fn bodies_carry_exactly_the_contract_keys_in_order() {
        let c = config();
        assert_eq!(
            body(&Answer::waiting(342, crate::policy::Policy::compile(&c).configured_pace, &c, false)),
            r#"{"status":"WAITING","position":342,"estimatedWaitTime":4,"pollAfter":2}"#
        );
        assert_eq!(
            body(&Answer::ready("u-1", 299_500)),
            r#"{"status":"READY","token":"u-1","expiresIn":300,"pollAfter":null}"#
        );
        assert_eq!(body(&Answer::not_in_queue()), r#"{"status":"NOT_IN_QUEUE","pollAfter":null}"#);
        assert_eq!(body(&Answer::closed()), r#"{"status":"CLOSED","pollAfter":null}"#);
        assert_eq!(Answer::closed().status, 200);
        let full = Answer::full(&c);
        assert_eq!((full.status, full.retry_after), (429, Some(30)));
        assert_eq!(body(&full), r#"{"status":"FULL","retryAfter":30}"#);
        let early = Answer::too_early(3);
        assert_eq!((early.status, early.retry_after), (429, Some(3)));
        assert_eq!(body(&early), r#"{"status":"TOO_EARLY","retryAfter":3}"#);
        assert_eq!(body(&Answer::limited(42)), r#"{"status":"LIMITED","retryAfter":42}"#);
        assert_eq!(body(&Answer::closed()), r#"{"status":"CLOSED","pollAfter":null}"#);
        assert_eq!(body(&Answer::not_open(90, &c)), r#"{"status":"NOT_OPEN","opensIn":90,"pollAfter":10}"#);
        assert_eq!(body(&Answer::prequeued(3, &c)), r#"{"status":"PREQUEUED","opensIn":3,"pollAfter":2}"#);
        assert_eq!(body(&Answer::prequeued(1, &c)), r#"{"status":"PREQUEUED","opensIn":1,"pollAfter":1}"#);
        assert_eq!(body(&Answer::error(403, "no \"token\"")), r#"{"error":"no \"token\""}"#);
        let na = Answer::method_not_allowed("POST");
        assert_eq!((na.status, na.allow), (405, Some("POST")));
        assert_eq!(Answer::unavailable(&c).retry_after, Some(30));
    }

    #[test]
    fn the_hand_written_waiting_body_is_what_serde_writes() {
        let numbers = [0, 1, 9, 10, 99, 342, 100_000, u32::MAX as u64, u64::MAX - 1, u64::MAX];
        for &position in &numbers {
            for estimated_wait_time in [None, Some(0), Some(7), Some(u64::MAX)] {
                for &poll_after in &numbers[..4] {
                    let serde = serde_json::to_vec(&QueueBody::Waiting { position, estimated_wait_time, poll_after }).unwrap();
                    assert_eq!(
                        String::from_utf8(waiting_body(position, estimated_wait_time, poll_after)).unwrap(),
                        String::from_utf8(serde).unwrap()
                    );
                }
            }
        }
    }

    #[test]
    fn waiting_answers_follow_the_pace_they_are_given() {
        let c = config();
        // The room's measured pace: batch in force 4, 10 users/s.
        let pace = Pace {
            first_batch: 4,
            rate: rules::Rate { batch: 1, interval: std::time::Duration::from_millis(100) },
        };
        assert_eq!(
            body(&Answer::waiting(60, pace, &c, false)),
            r#"{"status":"WAITING","position":60,"estimatedWaitTime":6,"pollAfter":2}"#
        );
        assert_eq!(
            body(&Answer::waiting(4, pace, &c, false)),
            r#"{"status":"WAITING","position":4,"estimatedWaitTime":0,"pollAfter":0}"#,
            "within the default 2 s hold: the next poll is a held one"
        );
        assert_eq!(
            body(&Answer::waiting(20, pace, &c, false)),
            r#"{"status":"WAITING","position":20,"estimatedWaitTime":2,"pollAfter":0}"#
        );
        assert_eq!(
            body(&Answer::waiting(21, pace, &c, false)),
            r#"{"status":"WAITING","position":21,"estimatedWaitTime":3,"pollAfter":2}"#
        );
        assert_eq!(
            body(&Answer::waiting(150, pace, &c, false)),
            r#"{"status":"WAITING","position":150,"estimatedWaitTime":15,"pollAfter":5}"#
        );
        let no_hold = Config::parse("upstream: 127.0.0.1:1\nendpoints: {hold: 0s}").unwrap();
        assert_eq!(
            body(&Answer::waiting(4, pace, &no_hold, false)),
            r#"{"status":"WAITING","position":4,"estimatedWaitTime":0,"pollAfter":2}"#
        );
        assert_eq!(
            body(&Answer::waiting_after_hold(21, pace, false)),
            r#"{"status":"WAITING","position":21,"estimatedWaitTime":3,"pollAfter":0}"#
        );
    }

    #[test]
    fn a_paused_room_gives_no_estimate_and_the_same_poll_after() {
        let c = config();
        let pace = crate::policy::Policy::compile(&c).configured_pace;
        assert_eq!(
            body(&Answer::waiting(342, pace, &c, true)),
            r#"{"status":"WAITING","position":342,"estimatedWaitTime":null,"pollAfter":2}"#
        );
        assert_eq!(
            body(&Answer::waiting(342, pace, &c, false)),
            r#"{"status":"WAITING","position":342,"estimatedWaitTime":4,"pollAfter":2}"#
        );
    }
}
