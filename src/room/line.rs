//! Positions answered without a Redis round trip: the cheapest answer to the rush's most frequent
//! request, a waiting user's poll.
//!
//! Arrival numbers come from one counter and are handed out only to users who are inserted
//! (`lua/enter.lua`), and admission pops only from the front. So while nothing removes a place
//! from the middle, the line holds exactly the numbers `left + 1 ..= last`, where `last` is the
//! counter and `left` the number of users who ever left from the front, and a waiting user's
//! position is their number minus `left`. The line watcher (`crate::services::line`) reads `last`, the line's length and
//! its first score every [`REFRESH_EVERY`]; a user's number is learned from their first status
//! answered by Redis. Every other poll of a waiting user is answered here.
//!
//! With a single-URL Redis the watcher also holds a pub/sub subscription to a channel nobody
//! publishes on: a Redis that dies closes it at once, and local answers stop then, not at the
//! next reading. The same subscription (on any target) hears the tokens other proxies spend.
//!
//! The guards, each falling back to the exact answer from Redis:
//! - a reading older than [`FRESH_FOR`], or one that has been waiting for Redis's answer longer
//!   than [`SUSPECT_AFTER`] (Redis slow, frozen or gone: the poll then meets Redis's own answer,
//!   or its 503, within `redis.timeout`), or no successful reading yet;
//! - a line that is not contiguous (first score + length - 1 is not the counter: a place was
//!   removed from the middle, by abandonment or by hand), until admission has passed the gap;
//! - a room that was reset (Redis restarted empty, or flushed): the room's epoch, a random value
//!   the watcher stores when it is missing, changes, and every learned number is forgotten;
//! - a room that lost writes (Redis restarted from an older snapshot, or failed over to a
//!   replica that lagged): the epoch survives, but the counter may have rolled back and be
//!   handing the lost numbers to newcomers. Numbers are learned from one server (its `run_id`)
//!   and forgotten when another answers, or when the counter goes down; an answer read before
//!   that (see [`LocalLine::ticket`]) is not learned, nor one read in the [`RELEARN_AFTER`] that
//!   follow another server's answer (the proxy's other connections may still reach the old
//!   one). The users whose places were lost then get
//!   Redis's own answer, NOT_IN_QUEUE, at their next poll;
//! - a user whose number is at or below `left` (admitted, or gone): READY or NOT_IN_QUEUE
//!   always comes from Redis;
//! - polls that Redis must see (enforced polling, abandonment): never answered here.
//!
//! No local answer is older than an exact one this proxy gave: each answer from Redis, and each
//! admission tick of this proxy, raises a floor under the mark (how many have left the front, by
//! that answer or tick) that a reading sent earlier and answered later cannot lower (see
//! `LocalLine::passed`). A reading read just before this proxy's tick is still fresh after it:
//! without the tick's floor, the users it admitted would be told WAITING by the very proxy that
//! admitted them.
//!
//! What a local answer can get wrong is bounded by the reading's age: a user admitted by
//! another proxy's tick in the last [`FRESH_FOR`] may be told WAITING at position 1..batch once
//! more, and learns READY at the next poll.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::LineReading;

/// How often each proxy reads the line's mark: one MULTI of five reads, 100 a second.
pub const REFRESH_EVERY: Duration = Duration::from_millis(10);
/// A mark older than this is not used.
pub const FRESH_FOR: Duration = Duration::from_millis(50);
/// A reading still unanswered after this long makes Redis suspect (a healthy one answers in well
/// under a millisecond): local answers stop at once rather than when the mark has aged, so a
/// frozen Redis is met by the polls themselves within about 30 ms of its last answer.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(20);
/// After another server answered the line's readings, answers to learn from are not learned for
/// this long. Each service of a proxy has its own connection, and after a failover they reach the
/// new primary one by one (each asks the sentinels twice a second): the status that follows the
/// readings' switch may still be answered by the old primary, which holds places the new one
/// lost and whose numbers it hands to newcomers. Learned then, such a number would be answered
/// locally for as long as it stays in the new line's range: another user's place.
pub const RELEARN_AFTER: Duration = Duration::from_secs(2);
/// How long the canary's subscription may take to set up before it is tried again.
pub const CANARY_CONNECT: Duration = Duration::from_secs(1);
/// At most this many learned numbers are kept; past it, new users are answered by Redis until
/// admission frees room. (A thousand in the unit tests, so that one can reach it.)
const MAX_USERS: usize = if cfg!(test) { 1_000 } else { 1_000_000 };

/// Where the line's guards read the time: the real clock in the proxy, a fake one in tests, so
/// the freshness rules are tested without sleeping.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The line as a contiguous range of arrival numbers, from one consistent reading; `None` when
/// places are missing from the middle (or the reading makes no sense).
pub fn mark_of(reading: &LineReading) -> Option<(u64, u64)> {
    let last = reading.last;
    match reading.first {
        None if reading.len == 0 => Some((last, last)),
        None => None,
        Some(first) => {
            let contiguous = first >= 1 && reading.len >= 1 && first + reading.len - 1 == last;
            // Lazily: `first - 1` of a first score below 1 (a scheduled event's drawn users, see
            // crate::event) would overflow.
            contiguous.then(|| (first - 1, last))
        }
    }
}

/// When an answer to learn from was asked for: see [`LocalLine::ticket`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

#[derive(Default)]
struct State {
    /// The epoch the numbers below were learned in.
    epoch: Option<String>,
    /// The server they were learned from, and its counter as last read.
    server: String,
    last: u64,
    /// Counts the times the numbers were forgotten (see [`LocalLine::ticket`]).
    generation: u64,
    users: HashMap<String, u64>,
    /// `(left, last)` and when it was read; `None` when the last reading failed or showed a gap.
    mark: Option<(u64, u64, Instant)>,
    /// How many users have left the front at least, by an answer from Redis given since the
    /// reading in hand was sent, and when: no local answer may be older than an exact one this
    /// proxy already gave (see `passed`).
    floor: Option<(u64, Instant)>,
    /// When the reading in flight was sent.
    reading_since: Option<Instant>,
    pruned_at: Option<Instant>,
    /// When the numbers were last forgotten because another server answered (see `RELEARN_AFTER`).
    switched_at: Option<Instant>,
}

/// This proxy's view of the line: the mark and the arrival numbers it has learned. Whether a
/// poll may be answered here at all is the policy's decision
/// ([`crate::policy::Policy::local_answers`]), made by the caller.
#[derive(Default)]
pub struct LocalLine<C: Clock = SystemClock> {
    state: Mutex<State>,
    clock: C,
}

impl<C: Clock> LocalLine<C> {
    pub fn with_clock(clock: C) -> LocalLine<C> {
        LocalLine { state: Mutex::default(), clock }
    }

    /// The user's position, when it can be told without Redis.
    pub fn position(&self, user: &str) -> Option<u64> {
        self.place(user).map(|(position, _)| position)
    }

    /// The user's position and arrival number, when they can be told without Redis.
    pub fn place(&self, user: &str) -> Option<(u64, u64)> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (left, last, read_at) = state.mark?;
        let now = self.clock.now();
        let stale = now.saturating_duration_since(read_at) > FRESH_FOR;
        let suspect = state.reading_since.is_some_and(|t| now.saturating_duration_since(t) > SUSPECT_AFTER);
        if stale || suspect {
            return None;
        }
        let left = state.floor.map_or(left, |(floor, _)| floor.max(left));
        let number = *state.users.get(user)?;
        (number > left && number <= last).then(|| (number - left, number))
    }

    /// Taken before asking Redis for an answer to learn from: an answer read by a server the
    /// line has stopped trusting since (see `refresh`) is then not learned.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.state.lock().unwrap_or_else(|e| e.into_inner()).generation)
    }

    /// Remembers the arrival number an answer from Redis read of a waiting user, if it read one,
    /// and, with the `position` it answered, how many users have left the front.
    pub fn learn_arrival(&self, user: &str, arrival: Option<&(u64, String)>, position: Option<u64>, ticket: Ticket) {
        let Some((number, epoch)) = arrival else { return };
        self.learn(user, *number, epoch, ticket);
        // Places ahead that are not numbers of the line (a draw's, below 1) only lower this.
        if let Some(left) = position.and_then(|p| number.checked_sub(p)) {
            self.passed(left, Some(epoch), ticket);
        }
    }

    /// Redis answered that `user` was admitted: everyone who arrived before them has left the
    /// front too (admission pops in order), if the line knows their number.
    pub fn learn_admitted(&self, user: &str, ticket: Ticket) {
        let number = self.state.lock().unwrap_or_else(|e| e.into_inner()).users.get(user).copied();
        if let Some(number) = number {
            self.passed(number, None, ticket);
        }
    }

    /// This proxy's admission tick took every place up to the score `passed` from the front.
    /// The reading in hand may have been read just before the tick and still be fresh: the
    /// users the tick admitted would be told WAITING at the front, by the proxy that admitted
    /// them, after it has counted them admitted.
    pub fn learn_popped(&self, passed: f64, ticket: Ticket) {
        // A draw's users, below 1, are no numbers of the line.
        if passed >= 1.0 {
            self.passed(passed as u64, None, ticket);
        }
    }

    /// At least `left` users have left the front, by an answer from Redis. A reading sent
    /// before that answer was read may come back after it, older: without this, a poll answered
    /// here just after another answered by Redis could show the line as it was before a batch
    /// left (a later arrival ahead of an earlier one, or still waiting behind someone READY).
    fn passed(&self, left: u64, epoch: Option<&str>, ticket: Ticket) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.clock.now();
        let comparable = state.generation == ticket.0
            && epoch.is_none_or(|epoch| state.epoch.as_deref() == Some(epoch))
            && state.switched_at.is_none_or(|at| now.saturating_duration_since(at) >= RELEARN_AFTER);
        if comparable && state.floor.is_none_or(|(floor, _)| left > floor) {
            state.floor = Some((left, now));
        }
    }

    /// Remembers a waiting user's arrival number, read from Redis in `epoch`.
    pub fn learn(&self, user: &str, number: u64, epoch: &str, ticket: Ticket) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Learned in another epoch than the numbers held (a reset the watcher has not read yet,
        // or has read since), or asked before the numbers were last forgotten (perhaps of a
        // server that lost writes since): not comparable with them.
        if state.epoch.as_deref() != Some(epoch) || state.generation != ticket.0 {
            return;
        }
        // Perhaps read on the server the readings just left (see `RELEARN_AFTER`).
        let now = self.clock.now();
        if state.switched_at.is_some_and(|at| now.saturating_duration_since(at) < RELEARN_AFTER) {
            return;
        }
        if state.users.len() >= MAX_USERS && !state.users.contains_key(user) {
            return;
        }
        state.users.insert(user.to_owned(), number);
    }

    /// A reading was sent to Redis.
    pub fn reading(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).reading_since = Some(self.clock.now());
    }

    /// Takes a reading of the line (see [`crate::store::RoomStore::read_line`]); returns whether the numbers
    /// learned so far were forgotten (another epoch, another server, or a counter gone down).
    pub fn refresh(&self, reading: &LineReading) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let sent = state.reading_since.take();
        // A reading sent after the floor was raised has seen what raised it.
        if state.floor.is_some_and(|(_, at)| sent.is_none_or(|sent| sent >= at)) {
            state.floor = None;
        }
        let rolled_back = reading.last < state.last;
        let forgotten = state.epoch != reading.epoch || state.server != reading.server || rolled_back;
        if forgotten {
            if !state.server.is_empty() && state.server != reading.server {
                state.switched_at = Some(self.clock.now());
            }
            state.users.clear();
            state.floor = None;
            state.generation += 1;
            state.epoch = reading.epoch.clone();
            state.server = reading.server.clone();
        }
        state.last = reading.last;
        let now = self.clock.now();
        state.mark = match (&reading.epoch, mark_of(reading)) {
            (Some(_), Some((left, last))) => Some((left, last, now)),
            _ => None,
        };
        // Users admitted since are answered by Redis from now on: drop them now and then.
        if let Some((left, _, _)) = state.mark {
            if state
                .pruned_at
                .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
            {
                state.users.retain(|_, number| *number > left);
                state.pruned_at = Some(now);
            }
        }
        forgotten
    }

    /// A reading failed: answer nothing locally until the next one succeeds.
    pub fn invalidate(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.reading_since = None;
        state.mark = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A clock that moves only when told to.
    #[derive(Clone)]
    struct FakeClock(Arc<Mutex<Instant>>);

    impl FakeClock {
        fn new() -> FakeClock {
            FakeClock(Arc::new(Mutex::new(Instant::now())))
        }

        fn advance(&self, by: Duration) {
            *self.0.lock().unwrap() += by;
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            *self.0.lock().unwrap()
        }
    }

    fn reading(last: u64, len: u64, first: Option<u64>, epoch: &str) -> LineReading {
        LineReading {
            last,
            len,
            first,
            front: first.map(|f| f as f64),
            epoch: Some(epoch.to_owned()),
            server: "s1".to_owned(),
        }
    }

    #[test]
    fn a_contiguous_line_is_its_range_of_numbers() {
        assert_eq!(mark_of(&reading(10, 4, Some(7), "e")), Some((6, 10)));
        assert_eq!(mark_of(&reading(10, 0, None, "e")), Some((10, 10)));
        assert_eq!(mark_of(&reading(0, 0, None, "e")), Some((0, 0)));
    }

    #[test]
    fn a_gap_or_a_nonsense_reading_gives_no_mark() {
        // 7, 8, 10 (9 removed from the middle) reads like 7, 8, 9 (the last place removed):
        // both are refused.
        assert_eq!(mark_of(&reading(10, 3, Some(7), "e")), None);
        assert_eq!(mark_of(&reading(10, 2, None, "e")), None);
        assert_eq!(mark_of(&reading(10, 0, Some(3), "e")), None);
        assert_eq!(mark_of(&reading(10, 3, Some(0), "e")), None, "drawn users' scores are below 1");
    }

    #[test]
    fn positions_follow_the_mark() {
        let line: LocalLine = LocalLine::default();
        line.refresh(&reading(10, 10, Some(1), "e"));
        line.learn("u7", 7, "e", line.ticket());
        assert_eq!(line.position("u7"), Some(7));
        assert_eq!(line.position("unknown"), None);
        line.refresh(&reading(12, 7, Some(6), "e"));
        assert_eq!(line.position("u7"), Some(2));
        // Admitted: Redis tells READY.
        line.refresh(&reading(12, 5, Some(8), "e"));
        assert_eq!(line.position("u7"), None);
    }

    #[test]
    fn an_answer_from_redis_teaches_the_number_it_read() {
        let line: LocalLine = LocalLine::default();
        line.refresh(&reading(10, 10, Some(1), "e"));
        // An answer that read no number (READY, not in the line) teaches nothing.
        line.learn_arrival("u3", None, None, line.ticket());
        assert_eq!(line.position("u3"), None);
        line.learn_arrival("u3", Some(&(3, "e".to_owned())), Some(3), line.ticket());
        assert_eq!(line.position("u3"), Some(3));
    }

    /// A line of `n` users, `u1` to `un`, every number learned, on a clock that moves when told.
    fn learned_line(n: u64) -> (FakeClock, LocalLine<FakeClock>) {
        let clock = FakeClock::new();
        let line = LocalLine::with_clock(clock.clone());
        line.refresh(&reading(n, n, Some(1), "e"));
        for k in 1..=n {
            line.learn(&format!("u{k}"), k, "e", line.ticket());
        }
        (clock, line)
    }

    /// The sweep of tests/admission_tokens.rs once saw this: a reading sent before a batch left
    /// came back after a poll answered by Redis (the reading was slow enough to be suspect), and
    /// the next poll, answered here from it, put an earlier arrival behind a later one.
    #[test]
    fn no_local_answer_is_older_than_an_answer_redis_gave() {
        let (clock, line) = learned_line(60);
        let e = |n: u64| Some((n, "e".to_owned()));
        line.reading();
        clock.advance(Duration::from_millis(1));
        // Five have left since that reading was sent; Redis tells u57 so.
        line.learn_arrival("u57", e(57).as_ref(), Some(52), line.ticket());
        assert_eq!(line.position("u56"), Some(51));
        assert_eq!(line.position("u5"), None, "gone: Redis answers");
        // The reading sent before comes back with the line as it was: the floor stands.
        clock.advance(Duration::from_millis(1));
        line.refresh(&reading(60, 60, Some(1), "e"));
        assert_eq!(line.position("u56"), Some(51));
        // A reading sent after it is the line itself again, whatever it says.
        line.reading();
        clock.advance(Duration::from_millis(1));
        line.refresh(&reading(60, 57, Some(4), "e"));
        assert_eq!(line.position("u56"), Some(53));
    }

    /// tests/observability.rs once saw this: the reading in hand was read just before this
    /// proxy's own tick admitted the front, and a poll answered from it after the tick was
    /// counted told an admitted user WAITING at position 1.
    #[test]
    fn this_proxys_admissions_leave_the_line_before_the_next_reading() {
        let (clock, line) = learned_line(6);
        // Read before the tick, answered before it too.
        line.reading();
        clock.advance(Duration::from_millis(1));
        line.refresh(&reading(6, 6, Some(1), "e"));
        line.learn_popped(2.0, line.ticket());
        assert_eq!(line.position("u2"), None, "admitted: Redis answers READY");
        assert_eq!(line.position("u3"), Some(1));
        // Sent before the next tick and answered after it: the line as it was.
        line.reading();
        clock.advance(Duration::from_millis(1));
        line.learn_popped(4.0, line.ticket());
        line.refresh(&reading(6, 4, Some(3), "e"));
        assert_eq!(line.position("u4"), None);
        assert_eq!(line.position("u5"), Some(1));
        // A draw's users (below 1) are no numbers of the line: nothing to learn.
        line.learn_popped(0.5, line.ticket());
        assert_eq!(line.position("u5"), Some(1));
        // Sent after the tick: the line itself again.
        line.reading();
        clock.advance(Duration::from_millis(1));
        line.refresh(&reading(6, 2, Some(5), "e"));
        assert_eq!(line.position("u5"), Some(1));
        assert_eq!(line.position("u6"), Some(2));
    }

    #[test]
    fn a_user_redis_answers_ready_takes_everyone_ahead_of_them_along() {
        let (clock, line) = learned_line(20);
        line.reading();
        clock.advance(Duration::from_millis(1));
        line.learn_admitted("u10", line.ticket());
        assert_eq!(line.position("u9"), None, "READY or gone, as Redis says");
        assert_eq!(line.position("u11"), Some(1));
        // Not known here: nothing to learn from.
        line.learn_admitted("stranger", line.ticket());
        assert_eq!(line.position("u11"), Some(1));
    }

    #[test]
    fn an_answer_asked_before_the_numbers_were_forgotten_raises_no_floor() {
        let clock = FakeClock::new();
        let line = LocalLine::with_clock(clock.clone());
        line.refresh(&reading(20, 20, Some(1), "e"));
        let before = line.ticket();
        // Another epoch: everything learned is forgotten.
        line.refresh(&reading(20, 20, Some(1), "f"));
        line.learn("u15", 15, "f", line.ticket());
        line.reading();
        clock.advance(Duration::from_millis(1));
        line.learn_arrival("u12", Some(&(12, "f".to_owned())), Some(2), before);
        line.learn_arrival("u13", Some(&(13, "e".to_owned())), Some(2), line.ticket());
        assert_eq!(line.position("u15"), Some(15));
    }

    #[test]
    fn at_its_cap_the_line_learns_no_new_user_but_still_a_known_one() {
        let line: LocalLine = LocalLine::default();
        let full = MAX_USERS as u64;
        line.refresh(&reading(full + 10, full + 10, Some(1), "e"));
        for n in 1..=full {
            line.learn(&format!("u{n}"), n, "e", line.ticket());
        }
        line.learn("late", full + 1, "e", line.ticket());
        assert_eq!(line.position("late"), None, "a new user beyond the cap");
        line.learn("u1", 5, "e", line.ticket());
        assert_eq!(line.position("u1"), Some(5), "a known user's new number");
    }

    #[test]
    fn numbers_from_another_epoch_are_never_used() {
        let line: LocalLine = LocalLine::default();
        line.refresh(&reading(10, 10, Some(1), "old"));
        line.learn("u5", 5, "old", line.ticket());
        line.learn("u6", 6, "new", line.ticket());
        assert_eq!(
            line.position("u6"),
            None,
            "learned in an epoch the line is not in"
        );
        // Reset and refilled past the user's old number: still not answered.
        line.refresh(&reading(20, 20, Some(1), "new"));
        assert_eq!(line.position("u5"), None);
        line.refresh(&LineReading {
            last: 20,
            len: 20,
            first: Some(1),
            front: Some(1.0),
            epoch: None,
            server: "s1".to_owned(),
        });
        assert_eq!(line.position("u5"), None);
    }

    #[test]
    fn numbers_from_another_server_or_a_rolled_back_counter_are_forgotten() {
        let clock = FakeClock::new();
        let line = LocalLine::with_clock(clock.clone());
        line.refresh(&reading(5, 5, Some(1), "e"));
        line.learn("u4", 4, "e", line.ticket());
        assert_eq!(line.position("u4"), Some(4));
        // Restarted from a snapshot taken at 3, and two newcomers took 4 and 5 again: the epoch
        // and the counter look the same, the server does not.
        line.refresh(&LineReading { server: "s2".to_owned(), ..reading(5, 5, Some(1), "e") });
        assert_eq!(line.position("u4"), None, "4 is someone else's number now");
        clock.advance(RELEARN_AFTER);
        line.refresh(&LineReading { server: "s2".to_owned(), ..reading(5, 5, Some(1), "e") });
        line.learn("u4", 4, "e", line.ticket());
        assert_eq!(line.position("u4"), Some(4), "learned again from the new server");
        // The same server's counter went down (a replica promoted behind our back).
        line.refresh(&LineReading { server: "s2".to_owned(), ..reading(3, 3, Some(1), "e") });
        line.refresh(&LineReading { server: "s2".to_owned(), ..reading(5, 5, Some(1), "e") });
        assert_eq!(line.position("u4"), None);
    }

    #[test]
    fn answers_are_not_learned_for_a_while_after_another_server_answered() {
        let clock = FakeClock::new();
        let line = LocalLine::with_clock(clock.clone());
        line.refresh(&reading(5, 5, Some(1), "e"));
        line.learn("u1", 1, "e", line.ticket());
        assert_eq!(line.position("u1"), Some(1), "the first server's numbers are learned at once");
        line.refresh(&LineReading { server: "s2".to_owned(), ..reading(5, 5, Some(1), "e") });
        // Asked after the switch, but perhaps of the old server through another connection:
        // its 4 may be a newcomer's on the new one.
        clock.advance(RELEARN_AFTER - Duration::from_millis(1));
        line.refresh(&LineReading { server: "s2".to_owned(), ..reading(5, 5, Some(1), "e") });
        line.learn("u4", 4, "e", line.ticket());
        assert_eq!(line.position("u4"), None, "not learned so soon after the switch");
        clock.advance(Duration::from_millis(1));
        line.refresh(&LineReading { server: "s2".to_owned(), ..reading(5, 5, Some(1), "e") });
        line.learn("u4", 4, "e", line.ticket());
        assert_eq!(line.position("u4"), Some(4));
    }

    #[test]
    fn an_answer_asked_for_before_the_numbers_were_forgotten_is_not_learned() {
        let line: LocalLine = LocalLine::default();
        line.refresh(&reading(5, 5, Some(1), "e"));
        let asked = line.ticket();
        line.refresh(&LineReading { server: "s2".to_owned(), ..reading(5, 5, Some(1), "e") });
        line.learn("u4", 4, "e", asked);
        assert_eq!(line.position("u4"), None, "read from the old server, perhaps");
    }

    #[test]
    fn a_failed_or_gapped_reading_stops_local_answers() {
        let line: LocalLine = LocalLine::default();
        line.refresh(&reading(10, 10, Some(1), "e"));
        line.learn("u3", 3, "e", line.ticket());
        line.invalidate();
        assert_eq!(line.position("u3"), None);
        line.refresh(&reading(10, 9, Some(1), "e"));
        assert_eq!(
            line.position("u3"),
            None,
            "a place is missing: positions could be off"
        );
        line.refresh(&reading(10, 10, Some(1), "e"));
        assert_eq!(
            line.position("u3"),
            Some(3),
            "learned numbers survive a gap"
        );
    }

    #[test]
    fn a_reading_left_unanswered_stops_local_answers() {
        let clock = FakeClock::new();
        let line = LocalLine::with_clock(clock.clone());
        line.refresh(&reading(10, 10, Some(1), "e"));
        line.learn("u3", 3, "e", line.ticket());
        line.reading();
        clock.advance(SUSPECT_AFTER);
        assert_eq!(line.position("u3"), Some(3), "a reading sent just within the bound");
        clock.advance(Duration::from_millis(1));
        assert_eq!(line.position("u3"), None, "Redis has not answered for longer than the bound");
        line.refresh(&reading(10, 10, Some(1), "e"));
        assert_eq!(line.position("u3"), Some(3));
    }

    #[test]
    fn an_old_reading_is_not_used() {
        let clock = FakeClock::new();
        let line = LocalLine::with_clock(clock.clone());
        line.refresh(&reading(10, 10, Some(1), "e"));
        line.learn("u3", 3, "e", line.ticket());
        clock.advance(FRESH_FOR);
        assert_eq!(line.position("u3"), Some(3), "a reading exactly as old as the bound");
        clock.advance(Duration::from_millis(1));
        assert_eq!(line.position("u3"), None);
    }

    #[test]
    fn admitted_users_are_forgotten_at_most_once_a_second() {
        let clock = FakeClock::new();
        let line = LocalLine::with_clock(clock.clone());
        line.refresh(&reading(10, 10, Some(1), "e"));
        line.learn("u2", 2, "e", line.ticket());
        line.refresh(&reading(10, 8, Some(3), "e"));
        assert_eq!(line.state.lock().unwrap().users.len(), 1, "pruned within the second: kept");
        clock.advance(Duration::from_secs(1));
        line.refresh(&reading(10, 8, Some(3), "e"));
        assert!(line.state.lock().unwrap().users.is_empty(), "a second later the admitted user is dropped");
    }
}
