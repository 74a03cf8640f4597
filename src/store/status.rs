//! Where a user stands: `lua/status.lua` when the call may write (abandonment, the poll clock),
//! else the same reads as one MULTI/EXEC ([`read_status`]), the most frequent request of a rush.

use redis::Value;

use super::{Keys, PollClock, RedisConn, RoomStore, RoomRules, StoreError};

script! {
    static SCRIPT = [ROOM_CLOCK, POLL_CLOCK] "lua/status.lua";
    keys [queue, heard, room_clock] and StatusKeys { user_token, user_clock }
    args StatusArgs<'a> {
        user: &'a str,
        abandon_ms: u64,
        poll_factor: f64,
    }
    reply StatusReply {
        "WAITING" => Waiting { position: i64, score: f64 },
        "READY" => Ready { token: String, remaining_ms: i64 },
        "NOT_IN_QUEUE" => NotInQueue { abandoned: i64 },
        "TOO_EARLY" => TooEarly { retry_secs: i64 },
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusOutcome {
    Waiting { position: u64 },
    Ready { token: String, remaining_ms: u64 },
    NotInQueue,
    TooEarly { retry_secs: u64 },
}

/// A status call's outcome, and whether it found the user's place lost and removed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub outcome: StatusOutcome,
    pub abandoned: u64,
    /// A waiting user's arrival number and the room's epoch, when the answer read them (for
    /// `crate::line`).
    pub arrival: Option<(u64, String)>,
    /// A waiting user's score in the line, whatever it is (a drawn user's is below 1): what a
    /// held poll waits for the front to pass (`crate::hold`).
    pub score: Option<f64>,
}

impl RoomStore {
    /// Status under `rules` (only `abandon_after` matters here) and `poll`.
    pub async fn status(&self, user: &str, poll: PollClock<'_>, rules: &RoomRules) -> Result<Status, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            // Without abandonment and enforced polling the status script only reads, so a
            // replica may answer it (when `redis.read_from_replicas` is on).
            if rules.abandon_ms() == 0 && poll.on_time_factor.is_none() {
                if !conn.reads_from_replicas() {
                    return read_status(&mut conn, &self.keys, user).await;
                }
                conn = conn.read_only();
            }
            let (user_token, user_clock) = (self.keys.token(user), self.keys.poll_clock(user));
            let keys = StatusKeys { user_token: &user_token, user_clock: &user_clock };
            let args = StatusArgs { user, abandon_ms: rules.abandon_ms(), poll_factor: poll.factor() };
            let mut call = invoke(&self.keys, keys, args);
            poll.push_tiers(&mut call);
            let reply: Vec<Value> = call.invoke_async(&mut conn).await?;
            Ok(status(StatusReply::decode(reply)?))
        })
        .await
    }
}

fn status(reply: StatusReply) -> Status {
    let mut score = None;
    let (outcome, abandoned) = match reply {
        StatusReply::Waiting { position, score: at } => {
            score = Some(at);
            (StatusOutcome::Waiting { position: position.max(1) as u64 }, 0)
        }
        StatusReply::Ready { token, remaining_ms } => {
            (StatusOutcome::Ready { token, remaining_ms: remaining_ms.max(0) as u64 }, 0)
        }
        StatusReply::NotInQueue { abandoned } => (StatusOutcome::NotInQueue, abandoned.max(0) as u64),
        StatusReply::TooEarly { retry_secs } => {
            (StatusOutcome::TooEarly { retry_secs: retry_secs.max(1) as u64 }, 0)
        }
    };
    Status { outcome, abandoned, arrival: None, score }
}

/// A status that writes nothing (no poll clock, no abandonment): the status script's three
/// reads as one MULTI/EXEC, as atomic as the script, at half of Redis's cost for the Lua call
/// (22k against 43k instructions per status, BENCHMARKS.md). The most frequent request of a rush.
async fn read_status(conn: &mut RedisConn, keys: &Keys, user: &str) -> Result<Status, StoreError> {
    let token_key = keys.token(user);
    type Reply = (Option<i64>, Option<f64>, Option<String>, i64, Option<String>);
    let (rank, score, token, pttl, epoch): Reply = redis::pipe()
        .atomic()
        .cmd("ZRANK")
        .arg(&keys.queue)
        .arg(user)
        .cmd("ZSCORE")
        .arg(&keys.queue)
        .arg(user)
        .cmd("GET")
        .arg(&token_key)
        .cmd("PTTL")
        .arg(&token_key)
        .cmd("GET")
        .arg(&keys.epoch)
        .query_async(conn)
        .await?;
    let outcome = match (rank, token) {
        (Some(rank), _) => StatusOutcome::Waiting { position: rank as u64 + 1 },
        (None, Some(token)) => StatusOutcome::Ready { token, remaining_ms: pttl.max(0) as u64 },
        (None, None) => StatusOutcome::NotInQueue,
    };
    let arrival = match (score, &epoch) {
        (Some(score), Some(epoch)) if score >= 1.0 => Some((score as u64, epoch.clone())),
        _ => None,
    };
    let score = score.filter(|_| rank.is_some());
    Ok(Status { outcome, abandoned: 0, arrival, score })
}
