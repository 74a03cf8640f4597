//! Entering the line: `lua/enter.lua`, one atomic step (capacity, the arrival number, the
//! per-address limit, the instant pass, abandonment, the poll clock).
//!
//! A new user's enter is the one request of a rush that always costs Redis a script, so the
//! proxy's enters travel in groups: one call carries the enters that arrived while the call
//! before it was on its way (at most [`GROUP_MAX`], with [`GROUPS_IN_FLIGHT`] call out at a
//! time), and the script takes its members in their order, each exactly as a call of its own
//! would have been. A lone enter waits for nobody: it goes out at once, a group of one; groups
//! only form while an earlier call is out, which is when Redis is busy. What a group's members
//! share (the capacity, the rules, the poll tiers) is sent once; an enter under other terms (a
//! reload in between) starts a group of its own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use redis::Value;
use tokio::sync::oneshot;

use super::{PollClock, Room, RoomRules, StoreError};

script! {
    static SCRIPT = [ROOM_CLOCK, POLL_CLOCK, ADMISSION, ROOM_STATE] "lua/enter.lua";
    keys [queue, seq, tokens, next_admission, admission_spent, adaptive, admissions, heard, epoch, room, admitted_minute, room_clock]
    args EnterArgs {
        capacity: u64,
        per_address: u32,
        abandon_ms: u64,
        ttl_ms: u64,
        interval_us: u64,
        batch_size: u32,
        min_batch: u32,
        max_active: u64,
        listens: bool,
        poll_factor: f64,
        members: u64,
    }
    reply EnterReply {
        "READY" => Ready { token: String, remaining_ms: i64, instant: bool, abandoned: i64 },
        "WAITING" => Waiting {
            position: i64,
            already: bool,
            abandoned: i64,
            arrival: Option<i64>,
            epoch: Option<String>,
        },
        "FULL" => Full { abandoned: i64 },
        "LIMITED" => Limited { retry_secs: i64, abandoned: i64 },
        "CLOSED" => Closed {},
    }
}

/// The most enters one call carries: a group's script holds Redis for about 10 µs a member, so
/// a full group delays every other command by a third of a millisecond at most.
pub const GROUP_MAX: usize = 32;

/// Calls of grouped enters out at once, per room: the next group forms while one is answered.
/// Measured (`bench/run.sh --paths enter_new`, BENCHMARKS.md): two calls out made groups half
/// as large and cost 15-20 % of the throughput of one; four, 10 %.
pub const GROUPS_IN_FLIGHT: usize = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnterOutcome {
    Waiting { position: u64, already: bool },
    /// The user already held a live token.
    Ready { token: String, remaining_ms: u64 },
    /// admission.instant: nobody waited and the interval had room: admitted by this enter.
    Instant { token: String, remaining_ms: u64 },
    Full,
    Limited { retry_secs: u64 },
    /// The room is closed (contract section 15): not queued.
    Closed,
}

/// An enter's outcome, and whether it found the user's place lost (abandonment) and removed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entered {
    pub outcome: EnterOutcome,
    pub abandoned: u64,
    /// A waiting user's arrival number and the room's epoch (for `crate::line`).
    pub arrival: Option<(u64, String)>,
}

/// Who is entering, from where, under which limits.
#[derive(Debug, Clone, Copy)]
pub struct EnterRequest<'a> {
    pub user: &'a str,
    pub capacity: u64,
    /// `(client address, identities allowed per address per minute)`; `None` when unlimited.
    pub per_address: Option<(&'a str, u32)>,
    pub poll: PollClock<'a>,
}

/// What the members of one group share: everything but who enters and from where.
#[derive(Debug, PartialEq)]
struct Terms {
    capacity: u64,
    per_address: u32,
    rules: RoomRules,
    poll_factor: f64,
    /// `(first position, pollAfter in ms)`, as the poll clock reads them.
    tiers: Vec<(u64, u64)>,
}

/// One enter of a group.
#[derive(Debug)]
struct Member {
    user: String,
    /// The address the per-address limit counts ("-" when it is off).
    address: String,
}

impl EnterRequest<'_> {
    fn split(&self, rules: &RoomRules) -> (Terms, Member) {
        let (address, per_address) = self.per_address.unwrap_or(("-", 0));
        let terms = Terms {
            capacity: self.capacity,
            per_address,
            rules: *rules,
            poll_factor: self.poll.factor(),
            tiers: self.poll.tiers().collect(),
        };
        (terms, Member { user: self.user.to_string(), address: address.to_string() })
    }
}

/// The enters waiting for a group, and how many calls are out.
#[derive(Default)]
pub(super) struct Groups {
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    queue: VecDeque<Pending>,
    /// Tasks sending groups (at most [`GROUPS_IN_FLIGHT`]).
    running: usize,
}

type Answer = Result<Entered, Arc<StoreError>>;

struct Pending {
    terms: Terms,
    member: Member,
    answer: oneshot::Sender<Answer>,
}

impl Groups {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // Nothing panics while holding it; if something did, the queue is still whole.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues an enter; `true` when the caller is to start a task sending groups.
    fn push(&self, pending: Pending) -> bool {
        let mut waiting = self.waiting();
        waiting.queue.push_back(pending);
        let start = waiting.running < GROUPS_IN_FLIGHT;
        if start {
            waiting.running += 1;
        }
        start
    }

    /// The next group, in arrival order: the first waiting enter and those behind it under the
    /// same terms. `None` (and the task ends) when nobody waits. An enter whose caller stopped
    /// waiting (it answered the user 503 at `redis.timeout`) is dropped, never entered.
    fn next(&self) -> Option<Vec<Pending>> {
        let mut waiting = self.waiting();
        let mut group: Vec<Pending> = Vec::new();
        while group.len() < GROUP_MAX {
            let Some(next) = waiting.queue.front() else { break };
            if next.answer.is_closed() {
                waiting.queue.pop_front();
            } else if group.first().is_none_or(|first| first.terms == next.terms) {
                group.extend(waiting.queue.pop_front());
            } else {
                break;
            }
        }
        if group.is_empty() {
            waiting.running -= 1;
            return None;
        }
        Some(group)
    }
}

impl Room {
    /// One enter under `rules`, in a call of its own: with `instant`, a fresh token goes along in
    /// case the user may pass.
    pub async fn enter(&self, request: EnterRequest<'_>, rules: &RoomRules) -> Result<Entered, StoreError> {
        let (terms, member) = request.split(rules);
        let mut entered = self.enter_members(&terms, &[&member]).await?;
        entered.pop().ok_or_else(|| StoreError::Reply(format!("{FILE}: no reply for the member")))
    }

    /// The same enter, in a group with the enters that arrive while earlier groups are out (see
    /// the module's doc). Bounded by `redis.timeout` from now, the wait for a group included.
    pub async fn enter_grouped(
        self: &Arc<Self>,
        request: EnterRequest<'_>,
        rules: &RoomRules,
    ) -> Result<Entered, StoreError> {
        let (terms, member) = request.split(rules);
        let (answer, answered) = oneshot::channel();
        if self.groups.push(Pending { terms, member, answer }) {
            tokio::spawn(Arc::clone(self).send_groups());
        }
        match tokio::time::timeout(self.timeout, answered).await {
            Ok(Ok(answer)) => answer.map_err(StoreError::Shared),
            Ok(Err(_)) => Err(StoreError::Reply(format!("{FILE}: the group ended without an answer"))),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Sends groups until nobody waits.
    async fn send_groups(self: Arc<Self>) {
        while let Some(group) = self.groups.next() {
            let members: Vec<&Member> = group.iter().map(|pending| &pending.member).collect();
            match self.enter_members(&group[0].terms, &members).await {
                Ok(entered) => {
                    for (pending, entered) in group.into_iter().zip(entered) {
                        let _ = pending.answer.send(Ok(entered));
                    }
                }
                Err(error) => {
                    let error = Arc::new(error);
                    for pending in group {
                        let _ = pending.answer.send(Err(Arc::clone(&error)));
                    }
                }
            }
        }
    }

    /// One call of the script for `members`, in their order: an outcome for each, in the same.
    async fn enter_members(&self, terms: &Terms, members: &[&Member]) -> Result<Vec<Entered>, StoreError> {
        let rules = &terms.rules;
        let args = EnterArgs {
            capacity: terms.capacity,
            per_address: terms.per_address,
            abandon_ms: rules.abandon_ms(),
            ttl_ms: rules.ttl_ms(),
            interval_us: rules.interval_us(),
            batch_size: rules.batch_size,
            min_batch: rules.min_batch.unwrap_or(0),
            max_active: rules.max_active,
            listens: rules.listens(),
            poll_factor: terms.poll_factor,
            members: members.len() as u64,
        };
        let mut call = invoke(&self.keys, args);
        for member in members {
            let instant_token = if rules.instant { uuid::Uuid::new_v4().to_string() } else { String::new() };
            call.arg(member.user.as_str()).arg(instant_token);
            call.key(self.keys.token(&member.user))
                .key(self.keys.poll_clock(&member.user))
                .key(self.keys.abuse_counter(&member.address));
        }
        super::push_tiers(&mut call, terms.tiers.iter().copied());
        let replies: Vec<Vec<Value>> = self.run(&call).await?;
        if replies.len() != members.len() {
            return Err(StoreError::Reply(format!(
                "{FILE}: {} replies for {} members",
                replies.len(),
                members.len()
            )));
        }
        replies.into_iter().map(|reply| Ok(entered(EnterReply::decode(reply)?))).collect()
    }
}

fn entered(reply: EnterReply) -> Entered {
    let (outcome, abandoned, arrival) = match reply {
        EnterReply::Ready { token, remaining_ms, instant, abandoned } => {
            let remaining_ms = remaining_ms.max(0) as u64;
            let outcome = if instant {
                EnterOutcome::Instant { token, remaining_ms }
            } else {
                EnterOutcome::Ready { token, remaining_ms }
            };
            (outcome, abandoned, None)
        }
        EnterReply::Waiting { position, already, abandoned, arrival, epoch } => {
            let arrival = match (arrival, epoch) {
                (Some(number), Some(epoch)) if number >= 1 => Some((number as u64, epoch)),
                _ => None,
            };
            (EnterOutcome::Waiting { position: position.max(1) as u64, already }, abandoned, arrival)
        }
        EnterReply::Full { abandoned } => (EnterOutcome::Full, abandoned, None),
        EnterReply::Limited { retry_secs, abandoned } => {
            (EnterOutcome::Limited { retry_secs: retry_secs.max(1) as u64 }, abandoned, None)
        }
        EnterReply::Closed {} => (EnterOutcome::Closed, 0, None),
    };
    Entered { outcome, abandoned: abandoned.max(0) as u64, arrival }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// The reply as Lua sends it: the tag, then that tag's fields.
    fn decode(fields: Vec<Value>) -> Result<Entered, StoreError> {
        Ok(entered(EnterReply::decode(fields)?))
    }

    #[test]
    fn each_tag_decodes_its_own_fields() {
        use Value::{Int, Nil};
        let waiting = decode(vec![text("WAITING"), Int(3), Int(1), Int(1), Int(42), text("e1")]).unwrap();
        assert_eq!(
            waiting,
            Entered {
                outcome: EnterOutcome::Waiting { position: 3, already: true },
                abandoned: 1,
                arrival: Some((42, "e1".into())),
            }
        );
        let instant = decode(vec![text("READY"), text("t"), Int(9), Int(1), Int(0)]).unwrap();
        assert_eq!(instant.outcome, EnterOutcome::Instant { token: "t".into(), remaining_ms: 9 });
        let unseeded = decode(vec![text("WAITING"), Int(1), Int(0), Int(0), Int(7), Nil]).unwrap();
        assert_eq!(unseeded.arrival, None, "no epoch yet");
        assert_eq!(decode(vec![text("FULL"), Int(1)]).unwrap().abandoned, 1);
        assert!(decode(vec![text("READY"), Int(0)]).is_err(), "READY without its token");
        assert!(decode(vec![text("FULL"), Int(0), Int(0)]).is_err(), "more than declared");
        assert!(decode(vec![text("ELSEWHERE"), Int(0)]).is_err());
    }
}
