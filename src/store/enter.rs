//! Entering the line: `lua/enter.lua`, one atomic step (capacity, the arrival number, the
//! per-address limit, the instant pass, abandonment, the poll clock).

use super::{PollClock, Room, RoomRules, StoreError};

script! {
    static SCRIPT = [ROOM_CLOCK, POLL_CLOCK, ADMISSION, ROOM_STATE] "lua/enter.lua";
    keys [queue, seq, tokens, next_admission, admission_spent, adaptive, admissions, heard, epoch, room, admitted_minute, room_clock]
        and EnterKeys { user_token, user_clock, address_counter }
    args EnterArgs<'a> {
        user: &'a str,
        capacity: u64,
        per_address: u32,
        abandon_ms: u64,
        instant_token: &'a str,
        ttl_ms: u64,
        interval_us: u64,
        batch_size: u32,
        min_batch: u32,
        max_active: u64,
        listens: bool,
        poll_factor: f64,
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

impl Room {
    /// Enter under `rules`: with `instant`, a fresh token goes along in case the user may pass.
    pub async fn enter(&self, request: EnterRequest<'_>, rules: &RoomRules) -> Result<Entered, StoreError> {
        let user = request.user;
        let (address, per_address) = request.per_address.unwrap_or(("-", 0));
        let instant_token = if rules.instant { uuid::Uuid::new_v4().to_string() } else { String::new() };
        let (user_token, user_clock) = (self.keys.token(user), self.keys.poll_clock(user));
        let address_counter = self.keys.abuse_counter(address);
        let keys =
            EnterKeys { user_token: &user_token, user_clock: &user_clock, address_counter: &address_counter };
        let args = EnterArgs {
            user,
            capacity: request.capacity,
            per_address,
            abandon_ms: rules.abandon_ms(),
            instant_token: &instant_token,
            ttl_ms: rules.ttl_ms(),
            interval_us: rules.interval_us(),
            batch_size: rules.batch_size,
            min_batch: rules.min_batch.unwrap_or(0),
            max_active: rules.max_active,
            listens: rules.listens(),
            poll_factor: request.poll.factor(),
        };
        let mut call = invoke(&self.keys, keys, args);
        request.poll.push_tiers(&mut call);
        Ok(entered(EnterReply::decode(self.run(&call).await?)?))
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
