//! Entering the line: `lua/enter.lua`, one atomic step (capacity, the arrival number, the
//! per-address limit, the instant pass, abandonment, the poll clock).
//!
//! A new user's enter is the one request of a rush that always costs Redis a script, so the
//! proxy's enters travel in groups (see `group.rs`): the script takes its members in their
//! order, each exactly as a call of its own would have been. What a group's members share (the
//! capacity, the rules, the poll tiers) is sent once; an enter under other terms (a reload in
//! between) starts a group of its own.

use std::sync::Arc;

use redis::Value;

use super::group::grouped;
use super::{PollClock, RoomStore, RoomRules, StoreError};

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
        instant: bool,
        poll_factor: f64,
        members: u64,
    }
    reply EnterReply {
        "READY" => Ready { token: String, remaining_ms: i64, instant: bool, abandoned: i64 },
        "WAITING" => Waiting { position: i64, already: bool, abandoned: i64, arrival: Option<i64> },
        "FULL" => Full { abandoned: i64 },
        "LIMITED" => Limited { retry_secs: i64, abandoned: i64 },
        "CLOSED" => Closed {},
    }
}

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
    /// A waiting user's arrival number and the room's epoch (for `crate::room::line`).
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
pub(super) struct Terms {
    capacity: u64,
    per_address: u32,
    rules: RoomRules,
    poll_factor: f64,
    /// `(first position, pollAfter in ms)`, as the poll clock reads them.
    tiers: Vec<(u64, u64)>,
}

/// One enter of a group.
#[derive(Debug)]
pub(super) struct Member {
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

impl RoomStore {
    /// One enter under `rules`, in a call of its own: with `instant`, a fresh token goes along in
    /// case the user may pass.
    pub async fn enter(&self, request: EnterRequest<'_>, rules: &RoomRules) -> Result<Entered, StoreError> {
        let (terms, member) = request.split(rules);
        self.alone(&terms, &member).await
    }

    /// The same enter, in a group with the enters that arrive while earlier groups are out (see
    /// `group.rs`). Bounded by `redis.timeout` from now, the wait for a group included.
    pub async fn enter_grouped(
        self: &Arc<Self>,
        request: EnterRequest<'_>,
        rules: &RoomRules,
    ) -> Result<Entered, StoreError> {
        let (terms, member) = request.split(rules);
        self.grouped(terms, member).await
    }
}

grouped!(Member {
    terms: Terms,
    reply: Entered,
    groups: enters,
    call: |room, terms, members| room.enter_members(terms, members),
});

impl RoomStore {
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
            instant: rules.instant,
            poll_factor: terms.poll_factor,
            members: members.len() as u64,
        };
        // Only what the switches use goes with each member, as the script's header says: the
        // poll clock's key when polls are enforced, the address's counter with a per-address
        // limit, a fresh token when an instant pass may be given.
        let clocks = terms.poll_factor > 0.0;
        let mut call = invoke(&self.keys, args);
        for member in members {
            call.arg(member.user.as_str());
            if rules.instant {
                call.arg(uuid::Uuid::new_v4().to_string());
            }
            call.key(self.keys.token(&member.user));
            if clocks {
                call.key(self.keys.poll_clock(&member.user));
            }
            if terms.per_address > 0 {
                call.key(self.keys.abuse_counter(&member.address));
            }
        }
        super::push_tiers(&mut call, terms.tiers.iter().copied());
        decode_group(self.run(&call).await?, members.len())
    }
}

/// The script's flat reply: the room's epoch, then each member's reply in their order.
fn decode_group(reply: Vec<Value>, members: usize) -> Result<Vec<Entered>, StoreError> {
    let mut values = reply.into_iter();
    let epoch: Option<String> = super::script::field(FILE, "epoch", values.next())?;
    let entered = (0..members)
        .map(|_| EnterReply::take(&mut values).map(|reply| entered(reply, epoch.as_deref())))
        .collect::<Result<_, _>>()?;
    super::script::nothing_left(FILE, values)?;
    Ok(entered)
}

fn entered(reply: EnterReply, epoch: Option<&str>) -> Entered {
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
        EnterReply::Waiting { position, already, abandoned, arrival } => {
            let arrival = match (arrival, epoch) {
                (Some(number), Some(epoch)) if number >= 1 => Some((number as u64, epoch.to_owned())),
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

    #[test]
    fn each_member_decodes_its_own_tag_and_fields() {
        use Value::{Int, Nil};
        let group = vec![
            text("e1"),
            text("WAITING"),
            Int(3),
            Int(1),
            Int(1),
            Int(42),
            text("READY"),
            text("t"),
            Int(9),
            Int(1),
            Int(0),
            text("FULL"),
            Int(1),
            text("CLOSED"),
            text("LIMITED"),
            Int(5),
            Int(0),
        ];
        let entered = decode_group(group, 5).unwrap();
        assert_eq!(
            entered[0],
            Entered {
                outcome: EnterOutcome::Waiting { position: 3, already: true },
                abandoned: 1,
                arrival: Some((42, "e1".into())),
            }
        );
        assert_eq!(entered[1].outcome, EnterOutcome::Instant { token: "t".into(), remaining_ms: 9 });
        assert_eq!((&entered[2].outcome, entered[2].abandoned), (&EnterOutcome::Full, 1));
        assert_eq!(entered[3].outcome, EnterOutcome::Closed);
        assert_eq!(entered[4].outcome, EnterOutcome::Limited { retry_secs: 5 });

        let unseeded = decode_group(vec![Nil, text("WAITING"), Int(1), Int(0), Int(0), Int(7)], 1).unwrap();
        assert_eq!(unseeded[0].arrival, None, "no epoch yet");
        assert!(decode_group(vec![Nil, text("READY"), Int(0)], 1).is_err(), "READY without its fields");
        assert!(decode_group(vec![Nil, text("FULL"), Int(0), Int(0)], 1).is_err(), "more than declared");
        assert!(decode_group(vec![Nil, text("FULL"), Int(0)], 2).is_err(), "a member without a reply");
        assert!(decode_group(vec![Nil, text("ELSEWHERE"), Int(0)], 1).is_err());
    }
}
