//! The names of a room's keys: the one place they are spelled. Scripts get them as KEYS (see
//! `script.rs`), tests and tools import them from here rather than rebuild them.
//!
//! All of a room's keys share one hash tag, so each script touches one slot and the same layout
//! works on a Redis Cluster: `{<key_prefix>}` for the room `default`, `{<key_prefix>:<name>}` for
//! every other room (contract section 17), so a Cluster spreads the rooms over its primaries.

/// The names of a room's keys.
#[derive(Debug, Clone)]
pub struct Keys {
    pub queue: String,
    pub seq: String,
    pub next_admission: String,
    pub tokens: String,
    pub token_prefix: String,
    /// A protected request's claim on the user's token (contract section 12), per user.
    pub claim_prefix: String,
    pub poll_prefix: String,
    pub abuse_prefix: String,
    /// What the interval in progress has admitted so far (instant passes share its batch).
    pub admission_spent: String,
    /// The adaptive controller's state: the batch in force, its schedule.
    pub adaptive: String,
    /// Protected upstream latencies reported since the controller's last step.
    pub latencies: String,
    /// Admissions per 100 ms and the room's first admission: the measured rate.
    pub admissions: String,
    /// When each waiting user was last heard from (abandonment), in the room's time.
    pub heard: String,
    /// The room's clock: Redis's, with outages taken out (see `lua/room_clock.lua`).
    pub room_clock: String,
    /// A random value that changes when the room is reset (see `crate::room::line`).
    pub epoch: String,
    /// A pub/sub channel nobody publishes on: the line watcher's subscription to it ends the
    /// moment Redis goes away.
    pub line_watch: String,
    /// The room's state (`crate::services::control`): a hash of `state` (open, paused, closed; missing =
    /// open), `since` (Redis ms of the last change) and `by` (who made it).
    pub room: String,
    /// Admissions per second of the last minute, as a ring of 60 slots (`lua/room_state.lua`).
    pub admitted_minute: String,
    /// A scheduled event's seed, draw and close (see `lua/event.lua`).
    pub event: String,
    /// The draw list: pre-queued users' HMACs in drawn order.
    pub event_draw: String,
    /// A pub/sub channel on which every spent token is announced, so that every proxy of the
    /// room refuses it even if Redis loses the spend (see `crate::room::spent`).
    pub spent: String,
}

/// The name of the one room of a configuration without `rooms` (contract section 17). It lives
/// here, beside the key names it decides, because bench/ compiles this file on its own.
pub const DEFAULT_ROOM: &str = "default";

impl Keys {
    /// The keys of the room `default`.
    pub fn new(key_prefix: &str) -> Keys {
        Keys::tagged(format!("{{{key_prefix}}}"))
    }

    /// The keys of the room `name`; the room `default` keeps the keys it has without `rooms`.
    pub fn of_room(key_prefix: &str, name: &str) -> Keys {
        if name == DEFAULT_ROOM {
            return Keys::new(key_prefix);
        }
        Keys::tagged(format!("{{{key_prefix}:{name}}}"))
    }

    fn tagged(tag: String) -> Keys {
        Keys {
            queue: format!("{tag}:queue"),
            seq: format!("{tag}:seq"),
            next_admission: format!("{tag}:admission:next"),
            tokens: format!("{tag}:tokens"),
            token_prefix: format!("{tag}:token:"),
            claim_prefix: format!("{tag}:claim:"),
            poll_prefix: format!("{tag}:poll:"),
            abuse_prefix: format!("{tag}:abuse:"),
            admission_spent: format!("{tag}:admission:spent"),
            adaptive: format!("{tag}:admission:adaptive"),
            latencies: format!("{tag}:admission:latencies"),
            admissions: format!("{tag}:admission:log"),
            heard: format!("{tag}:heard"),
            room_clock: format!("{tag}:clock"),
            epoch: format!("{tag}:epoch"),
            line_watch: format!("{tag}:line:watch"),
            room: format!("{tag}:room"),
            admitted_minute: format!("{tag}:admission:minute"),
            event: format!("{tag}:event"),
            event_draw: format!("{tag}:event:draw"),
            spent: format!("{tag}:spent"),
        }
    }

    pub fn token(&self, user: &str) -> String {
        [self.token_prefix.as_str(), user].concat()
    }

    pub fn claim(&self, user: &str) -> String {
        [self.claim_prefix.as_str(), user].concat()
    }

    /// The user's token and the claim on it: a protected request's two keys.
    pub fn token_and_claim(&self, user: &str) -> (String, String) {
        (self.token(user), self.claim(user))
    }

    pub fn poll_clock(&self, user: &str) -> String {
        [self.poll_prefix.as_str(), user].concat()
    }

    /// The identities counted for one client address (a sorted set, scored by the minute that
    /// counted each: see `lua/enter.lua`).
    pub fn abuse_counter(&self, address: &str) -> String {
        [self.abuse_prefix.as_str(), address].concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_default_keeps_its_keys_and_every_other_room_has_a_tag_of_its_own() {
        let default = Keys::of_room("shop", "default");
        assert_eq!((default.queue.as_str(), default.spent.as_str()), ("{shop}:queue", "{shop}:spent"));
        let sneakers = Keys::of_room("shop", "sneakers");
        assert_eq!(sneakers.queue, "{shop:sneakers}:queue");
        assert_eq!(sneakers.token_prefix, "{shop:sneakers}:token:");
        assert_eq!(sneakers.event_draw, "{shop:sneakers}:event:draw");
    }
}
