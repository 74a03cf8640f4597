//! Calls that travel in groups: the requests of one kind (enters, claims, settles) that arrive
//! while the call before them is out go together in the next one, each answered with its own
//! result.
//!
//! In a rush the room's Redis calls are many and small, and a call costs more than its members:
//! the proxy encodes, sends, wakes and parses per call, and Redis parses the command, finds the
//! script and sets up its Lua frame per call. A script that takes a list of members, each
//! exactly as a call of its own would have been, pays that once for the group. A lone request
//! waits for nobody: it goes out at once, a group of one; groups only form while an earlier call
//! is out, which is when Redis is busy.
//!
//! Members under different terms (what they share and send once: a reload may change them in
//! between) never share a call: a member under other terms than the one before it starts a
//! group of its own.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::{RoomStore, StoreError};

/// The most members one call carries: an enter holds Redis for about 10 µs a member (the
/// heaviest kind), so a full group delays every other command by a third of a millisecond at
/// most.
pub const GROUP_MAX: usize = 32;

/// Calls of one kind out at once, per room: the next group forms while one is answered.
/// Measured (`bench/run.sh --paths enter_new`, BENCHMARKS.md): two calls out made groups half
/// as large and cost 15-20 % of the throughput of one; four, 10 %.
pub const GROUPS_IN_FLIGHT: usize = 1;

/// A kind of request that travels in groups: the member of a group.
pub(super) trait Grouped: Send + Sync + Sized + 'static {
    /// What a group's members share, sent once.
    type Terms: PartialEq + Send + Sync + 'static;
    type Reply: Send + 'static;
    /// The script, for messages.
    const FILE: &'static str;

    /// The room's queue of this kind.
    fn groups(room: &RoomStore) -> &Groups<Self>;

    /// One call for `members`, in their order: a reply for each, in the same.
    fn call<'a>(
        room: &'a RoomStore,
        terms: &'a Self::Terms,
        members: &'a [&'a Self],
    ) -> impl Future<Output = Result<Vec<Self::Reply>, StoreError>> + Send + 'a;
}

/// `impl Grouped` for a kind of member: each kind differs only in its terms, its reply, the
/// room's queue it waits in and the call that serves a group, so a kind is written as those four.
macro_rules! grouped {
    ($member:ty {
        terms: $terms:ty,
        reply: $reply:ty,
        groups: $field:ident,
        call: |$room:ident, $t:pat_param, $members:ident| $call:expr $(,)?
    }) => {
        impl $crate::store::group::Grouped for $member {
            type Terms = $terms;
            type Reply = $reply;
            const FILE: &'static str = FILE;

            fn groups(room: &$crate::store::RoomStore) -> &$crate::store::group::Groups<$member> {
                &room.groups.$field
            }

            fn call<'a>(
                $room: &'a $crate::store::RoomStore,
                $t: &'a $terms,
                $members: &'a [&'a $member],
            ) -> impl std::future::Future<Output = Result<Vec<$reply>, $crate::store::StoreError>> + Send + 'a {
                $call
            }
        }
    };
}
pub(super) use grouped;

/// The requests of one kind waiting for a group, and how many calls are out.
pub(super) struct Groups<M: Grouped> {
    waiting: Mutex<Waiting<M>>,
}

impl<M: Grouped> Default for Groups<M> {
    fn default() -> Self {
        Groups { waiting: Mutex::new(Waiting { queue: VecDeque::new(), running: 0 }) }
    }
}

struct Waiting<M: Grouped> {
    queue: VecDeque<Pending<M>>,
    /// Tasks sending groups (at most [`GROUPS_IN_FLIGHT`]).
    running: usize,
}

type Answer<R> = Result<R, Arc<StoreError>>;

struct Pending<M: Grouped> {
    terms: M::Terms,
    member: M,
    answer: oneshot::Sender<Answer<M::Reply>>,
}

impl<M: Grouped> Groups<M> {
    fn waiting(&self) -> MutexGuard<'_, Waiting<M>> {
        // Nothing panics while holding it; if something did, the queue is still whole.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a request; `true` when the caller is to start a task sending groups.
    fn push(&self, pending: Pending<M>) -> bool {
        let mut waiting = self.waiting();
        waiting.queue.push_back(pending);
        let start = waiting.running < GROUPS_IN_FLIGHT;
        if start {
            waiting.running += 1;
        }
        start
    }

    /// The next group, in arrival order: the first waiting request and those behind it under
    /// the same terms. `None` (and the task ends) when nobody waits. A request whose caller
    /// stopped waiting (it answered the user at `redis.timeout`) is dropped, never sent.
    fn next(&self) -> Option<Vec<Pending<M>>> {
        let mut waiting = self.waiting();
        let mut group: Vec<Pending<M>> = Vec::new();
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

impl RoomStore {
    /// `member`'s call, in a group with the requests of its kind that arrive while earlier
    /// groups are out. Bounded by `redis.timeout` from now, the wait for a group included.
    pub(super) async fn grouped<M: Grouped>(self: &Arc<Self>, terms: M::Terms, member: M) -> Result<M::Reply, StoreError> {
        let (answer, answered) = oneshot::channel();
        if M::groups(self).push(Pending { terms, member, answer }) {
            tokio::spawn(Arc::clone(self).send_groups::<M>());
        }
        match tokio::time::timeout(self.timeout, answered).await {
            Ok(Ok(answer)) => answer.map_err(StoreError::Shared),
            Ok(Err(_)) => Err(StoreError::Reply(format!("{}: the group ended without an answer", M::FILE))),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// `member`'s call on its own, a group of one, waiting for nobody.
    pub(super) async fn alone<M: Grouped>(&self, terms: &M::Terms, member: &M) -> Result<M::Reply, StoreError> {
        let replies = one_each::<M>(M::call(self, terms, &[member]).await?, 1)?;
        Ok(replies.into_iter().next().expect("one reply for one member"))
    }

    /// Sends groups of `M` until nobody waits.
    async fn send_groups<M: Grouped>(self: Arc<Self>) {
        while let Some(group) = M::groups(&self).next() {
            let members: Vec<&M> = group.iter().map(|pending| &pending.member).collect();
            let replies = M::call(&self, &group[0].terms, &members).await;
            let replies = replies.and_then(|replies| one_each::<M>(replies, members.len()));
            drop(members);
            match replies {
                Ok(replies) => {
                    for (pending, reply) in group.into_iter().zip(replies) {
                        let _ = pending.answer.send(Ok(reply));
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
}

/// The replies of a call for `members`, if there is exactly one for each.
fn one_each<M: Grouped>(replies: Vec<M::Reply>, members: usize) -> Result<Vec<M::Reply>, StoreError> {
    if replies.len() != members {
        return Err(StoreError::Reply(format!("{}: {} replies for {members} members", M::FILE, replies.len())));
    }
    Ok(replies)
}
