//! Entry tokens this proxy has seen spent, remembered for as long as they could still be live.
//!
//! A token is spent by deleting it in Redis once the order succeeded. A Redis that loses that
//! write (a restart from a snapshot taken before it, a failover to a replica that lagged) would
//! bring the token back, and a second order with it would be forwarded. Contract section 5 says a
//! spent token stays refused for the rest of its lifetime even then, so each proxy keeps the
//! tokens it spent, checked before Redis is asked, and forgets them once their lifetime is over.
//!
//! Every proxy of the room refuses them too: the spend announces the token on the room's
//! spent-token channel (`lua/consume.lua`), in the same step as the delete, and each proxy's
//! line watcher is subscribed to it ([`SpentTokens::announced`]). A proxy whose subscription is
//! down at that moment (Redis away, or refusing it) misses the announcement, and has Redis's
//! word only. So that Redis's word stays right, each proxy spends every token it remembers
//! again once its line watcher sees another Redis server answer ([`SpentTokens::live`]): a
//! proxy started after the loss then refuses the token too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Past this many remembered tokens in a shard, its expired ones are dropped before the next is
/// added; then not again until the shard has doubled, so a busy proxy prunes in amortised
/// constant time.
const PRUNE_AT: usize = 1024;
/// Shards, each with its own lock and map. A proxy hears every spend of its room, from every
/// proxy: at thousands of orders a second that is millions of tokens within their lifetime, and
/// one map stops every protected request for the whole of each of its rehashes and prunes. (The
/// rooms benchmark saw protected p99s of 90-104 ms once a proxy held about a million tokens in
/// one map; that the rehash was the cause was not measured apart.) A shard holds a 64th.
const SHARDS: usize = 64;
/// Bounds on what an announcement may make this proxy hold (tokens are UUIDs, living minutes).
const MAX_TOKEN_LEN: usize = 128;
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

#[derive(Default)]
struct Held {
    /// Token -> when it would have expired at the latest, and whose it was (empty if unknown).
    until: HashMap<Box<str>, (Instant, Box<str>)>,
    prune_at: usize,
}

pub struct SpentTokens {
    shards: [Mutex<Held>; SHARDS],
}

impl Default for SpentTokens {
    fn default() -> SpentTokens {
        SpentTokens { shards: std::array::from_fn(|_| Mutex::default()) }
    }
}

/// The shard of a token: FNV-1a of its bytes (tokens are random; this only spreads them).
fn shard_of(token: &[u8]) -> usize {
    let hash = token.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    (hash % SHARDS as u64) as usize
}

impl SpentTokens {
    fn shard(&self, token: &[u8]) -> std::sync::MutexGuard<'_, Held> {
        self.shards[shard_of(token)].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers `user`'s `token` as spent for `lifetime` (the token ttl: no token outlives it).
    pub fn remember(&self, token: &str, user: &str, lifetime: Duration) {
        self.remember_at(token, user, lifetime, Instant::now());
    }

    /// The `(user, token)` of every spend still remembered: what to make again in a Redis that
    /// lost writes.
    pub fn live(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        let mut live = Vec::new();
        for shard in &self.shards {
            let held = shard.lock().unwrap_or_else(|e| e.into_inner());
            live.extend(
                held.until
                    .iter()
                    .filter(|(_, (until, user))| *until > now && !user.is_empty())
                    .map(|(token, (_, user))| (user.to_string(), token.to_string())),
            );
        }
        live
    }

    /// Remembers a token another proxy (or this one) announced as spent: `<ms left> <token>
    /// <user>` (see `lua/consume.lua`; a user may hold spaces, so it comes last); `ttl` when the
    /// ms are missing or not positive. Anything else on the channel is ignored: it is not ours to
    /// crash on.
    pub fn announced(&self, payload: &[u8], ttl: Duration) {
        let Some((ms, rest)) = std::str::from_utf8(payload).ok().and_then(|p| p.split_once(' ')) else {
            return;
        };
        let (token, user) = rest.split_once(' ').unwrap_or((rest, ""));
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return;
        }
        let lifetime = match ms.parse::<i64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms as u64).min(MAX_LIFETIME),
            _ => ttl,
        };
        self.remember(token, user, lifetime);
    }

    pub fn is_spent(&self, token: &[u8]) -> bool {
        self.is_spent_at(token, Instant::now())
    }

    fn remember_at(&self, token: &str, user: &str, lifetime: Duration, now: Instant) {
        let until = now + lifetime;
        let mut held = self.shard(token.as_bytes());
        // A proxy hears its own spends back: no second copy of what it holds already.
        if let Some((known, whose)) = held.until.get_mut(token) {
            *known = (*known).max(until);
            if whose.is_empty() && !user.is_empty() {
                *whose = user.into();
            }
            return;
        }
        if held.until.len() >= held.prune_at.max(PRUNE_AT) {
            held.until.retain(|_, (until, _)| *until > now);
            held.prune_at = held.until.len() * 2;
        }
        held.until.insert(token.into(), (until, user.into()));
    }

    fn is_spent_at(&self, token: &[u8], now: Instant) -> bool {
        let Ok(token) = std::str::from_utf8(token) else { return false };
        self.shard(token.as_bytes()).until.get(token).is_some_and(|(until, _)| *until > now)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().unwrap().until.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_token_is_refused_until_its_lifetime_is_over() {
        let spent = SpentTokens::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(300);
        spent.remember_at("tok", "u", ttl, t0);
        assert!(spent.is_spent_at(b"tok", t0));
        assert!(spent.is_spent_at(b"tok", t0 + ttl - Duration::from_millis(1)));
        assert!(!spent.is_spent_at(b"tok", t0 + ttl), "expired in Redis too by then");
        assert!(!spent.is_spent_at(b"other", t0));
        assert!(!spent.is_spent_at(&[0xff], t0));
    }

    #[test]
    fn announcements_are_remembered_for_what_the_token_had_left() {
        let spent = SpentTokens::default();
        let ttl = Duration::from_secs(300);
        spent.announced(b"1500 tok user with spaces", ttl);
        assert!(spent.is_spent(b"tok"));
        assert_eq!(spent.live(), vec![("user with spaces".to_owned(), "tok".to_owned())]);
        let (held, _) = spent.shard(b"tok").until["tok"].clone();
        assert!(held <= Instant::now() + Duration::from_millis(1500));
        spent.announced(b"-1 untimed", ttl);
        assert_eq!(spent.live().len(), 1, "no user: nothing to make again");
        assert!(spent.is_spent(b"untimed"), "no expiry read: the ttl");
        for junk in [&b""[..], b"tok2", b"12 ", &[0xff, b' ', b'x'], b"99999999999999999999 big"] {
            spent.announced(junk, ttl);
        }
        assert!(!spent.is_spent(b"tok2"));
        assert!(spent.is_spent(b"big"), "an unreadable count of ms: the ttl");
        assert_eq!(spent.len(), 3);
    }

    #[test]
    fn expired_tokens_are_forgotten_once_a_shard_holds_many() {
        let spent = SpentTokens::default();
        let t0 = Instant::now();
        let in_shard_0 = (0..).map(|i| format!("old-{i}")).filter(|t| shard_of(t.as_bytes()) == 0);
        for token in in_shard_0.take(PRUNE_AT) {
            spent.remember_at(&token, "u", Duration::from_secs(1), t0);
        }
        let new = (0..).map(|i| format!("new-{i}")).find(|t| shard_of(t.as_bytes()) == 0).unwrap();
        spent.remember_at(&new, "u", Duration::from_secs(1), t0 + Duration::from_secs(2));
        assert_eq!(spent.len(), 1);
    }

    #[test]
    fn a_spend_heard_again_keeps_the_later_expiry_and_the_user() {
        let spent = SpentTokens::default();
        let t0 = Instant::now();
        spent.remember_at("tok", "", Duration::from_secs(300), t0);
        spent.remember_at("tok", "u", Duration::from_secs(10), t0);
        assert_eq!(spent.len(), 1);
        assert!(spent.is_spent_at(b"tok", t0 + Duration::from_secs(299)));
        assert_eq!(spent.live(), vec![("u".to_owned(), "tok".to_owned())]);
    }

    #[test]
    fn tokens_spread_over_the_shards() {
        let mut counts = [0usize; SHARDS];
        for _ in 0..SHARDS * 200 {
            counts[shard_of(uuid::Uuid::new_v4().to_string().as_bytes())] += 1;
        }
        assert!(counts.iter().all(|&n| (100..300).contains(&n)), "{counts:?}");
    }
}
