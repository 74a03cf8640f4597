//! A protected request (`protected` method + path): forwarded only with the user's current entry
//! token, claimed for this one request as it is forwarded and for as long as it is in flight
//! (contract section 12: one admission, one order), and settled by the upstream's status line:
//! a 2xx spends it; an order sent with no status line back has an unknown outcome, which spends it
//! too unless `token.unknown_outcome: release`; anything else releases the claim.
//! Parse (identity, token header) -> apply (claim the token in Redis) -> render (a refusal, or
//! nothing and the request goes upstream).


use pingora::proxy::Session;

use super::{identity, Answer, Ctx};
use crate::room::claims::{Live, Retry};
use crate::room::Room;
use crate::config::{Config, TokenConfig};
use crate::logging::Warning;
use crate::metrics;
use crate::rules::{self, Outcome, TokenFate};
use crate::store::{Claim, Settle};

/// A token this request holds: what settling it needs, and its registration with the proxy's
/// claim keeper, which renews the claim until this is settled.
pub struct Claimed {
    pub token: String,
    pub id: String,
    _live: Live,
}

/// Returns the refusal with its result label (`forbidden`, `unauthenticated`, `in_use`,
/// `unavailable`), or `None` when the request claimed its token and may go upstream (counted as
/// `forwarded` here). A refusal is counted by the caller: in shadow mode it is forwarded instead
/// and counted as what it would have been.
pub async fn check(
    room: &Room,
    config: &Config,
    session: &Session,
    ctx: &mut Ctx,
) -> Option<(&'static str, Answer)> {
    let (result, refusal) = decide(room, config, session, ctx).await;
    match refusal {
        None => {
            room.metrics().requests.protected.with(result, |count| count.inc());
            None
        }
        Some(answer) => Some((result, answer)),
    }
}

async fn decide(
    room: &Room,
    config: &Config,
    session: &Session,
    ctx: &mut Ctx,
) -> (&'static str, Option<Answer>) {
    let spent = room.spent();
    let user = match identity(config, session) {
        Ok(user) => ctx.user.insert(user),
        Err(problem) => return ("unauthenticated", Some(Answer::identity(problem))),
    };
    let mut tokens = session.req_header().headers.get_all(&config.token.header).iter();
    let presented = match (tokens.next(), tokens.next()) {
        // The proxy would check one copy and the upstream might read the other.
        (Some(_), Some(_)) => {
            return ("forbidden", Some(Answer::error(400, "the entry token header must be sent once")))
        }
        (Some(v), None) if !v.is_empty() => v.as_bytes(),
        _ => return ("forbidden", Some(Answer::error(403, "an entry token is required"))),
    };
    if spent.is_spent(presented) {
        return ("forbidden", Some(Answer::error(403, "the entry token has already been used")));
    }
    let Ok(token) = std::str::from_utf8(presented) else {
        return ("forbidden", Some(Answer::error(403, "the entry token is not valid for this user")));
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    match room.store().claim_grouped(user, token, &id, config.token.claim_timeout).await {
        Ok(Claim::Claimed) => {
            let live = room.claims().register(user, &id);
            ctx.claimed = Some(Claimed { token: token.to_owned(), id, _live: live });
            ("forwarded", None)
        }
        Ok(Claim::InUse) => ("in_use", Some(Answer::error(409, "this entry token is already in use"))),
        Ok(Claim::Invalid) => ("forbidden", Some(Answer::error(403, "the entry token is not valid for this user"))),
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            if let Some(held_back) = Warning::ClaimFailed.pass() {
                tracing::warn!(%error, also_refused = held_back, "protected: redis unavailable, refusing (fail closed)");
            }
            // The claim may have been written before the reply was lost (a frozen Redis runs it
            // when it returns): left alone it would hold the user's retries at 409 for
            // claim_timeout. One try from the proxy's bounded queue, the first thing it drops
            // when full; the id is this request's own, so ending it never ends another's claim.
            let release = Settle::new(user, token, &id, false);
            room.settles().retry(release, Retry::MaybeClaimed, config.token.claim_timeout);
            ("unavailable", Some(Answer::unavailable(config)))
        }
    }
}

/// Applies what became of the order to the token that was used (see [`rules::token_fate`]);
/// returns the fate it applied. What Redis could not take now goes to the proxy's queue of
/// settles ([`crate::claims::Settles`]).
pub async fn settle(
    room: &Room,
    user: &str,
    claimed: Claimed,
    outcome: Outcome,
    lifetimes: &TokenConfig,
) -> TokenFate {
    // The registration lives to the end of this call: the claim is renewed until it is settled.
    let Claimed { token, id, _live } = claimed;
    let (token_ttl, claim_timeout) = (lifetimes.ttl, lifetimes.claim_timeout);
    let fate = rules::token_fate(outcome, lifetimes.spend_terms());
    if fate == TokenFate::Keep {
        // Retrying is the user's right: left to claim_timeout, the claim would refuse the
        // user's retries with 409 long after Redis is back.
        if let Err(error) = room.store().consume_grouped(user, &token, &id, false).await {
            metrics::REDIS_ERRORS_TOTAL.inc();
            if let Some(held_back) = Warning::ReleaseFailed.pass() {
                tracing::warn!(%error, user, also_failed = held_back, "could not release an entry token's claim; queued");
            }
            room.settles().retry(Settle::new(user, &token, &id, false), Retry::Release, claim_timeout);
        }
        return fate;
    }
    // Before Redis hears of it: a repeat through this proxy is refused from now on, whatever
    // becomes of the delete.
    room.spent().remember(&token, user, token_ttl);
    match room.store().consume_grouped(user, &token, &id, true).await {
        Ok(true) => room.metrics().tokens_consumed.inc(),
        // Expired, or already replaced by a newer token, between the check and now.
        Ok(false) => {}
        Err(error) => {
            // The order went through (or may have); refusing its response now would only hide
            // that from the user. While Redis is away a repeat is refused anyway (fail closed);
            // the queue spends the token as soon as Redis is back.
            metrics::REDIS_ERRORS_TOTAL.inc();
            if let Some(held_back) = Warning::SpendFailed.pass() {
                tracing::error!(%error, user, also_failed = held_back, "could not spend an entry token after a successful order; queued");
            }
            room.settles().retry(Settle::new(user, &token, &id, true), Retry::Spend, token_ttl);
        }
    }
    fate
}
