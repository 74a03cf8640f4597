//! A protected request (`protected` method + path): forwarded only with the user's current entry
//! token, claimed for this one request as it is forwarded and for as long as it is in flight
//! (contract section 12: one admission, one order), and settled by the upstream's status line:
//! a 2xx spends it; an order sent with no status line back has an unknown outcome, which spends it
//! too unless `token.unknown_outcome: release`; anything else releases the claim.
//! Parse (identity, token header) -> apply (claim the token in Redis) -> render (a refusal, or
//! nothing and the request goes upstream).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::proxy::Session;

use super::{identity, Answer, Ctx};
use crate::claims::Live;
use crate::config::{Config, TokenConfig};
use crate::metrics;
use crate::rules::{self, Outcome, TokenFate};
use crate::spent::SpentTokens;
use crate::state::RoomState;
use crate::store::{Claim, Room};

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
    state: &RoomState,
    config: &Config,
    room: &Arc<Room>,
    session: &Session,
    ctx: &mut Ctx,
) -> Option<(&'static str, Answer)> {
    let (result, refusal) = decide(state, config, room, session, ctx).await;
    match refusal {
        None => {
            metrics::PROTECTED_BY_RESULT.with(result, |count| count.inc());
            None
        }
        Some(answer) => Some((result, answer)),
    }
}

async fn decide(
    state: &RoomState,
    config: &Config,
    room: &Arc<Room>,
    session: &Session,
    ctx: &mut Ctx,
) -> (&'static str, Option<Answer>) {
    let spent = state.spent();
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
    match room.claim_grouped(user, token, &id, config.token.claim_timeout).await {
        Ok(Claim::Claimed) => {
            let live = state.claims().register(user, &id);
            ctx.claimed = Some(Claimed { token: token.to_owned(), id, _live: live });
            ("forwarded", None)
        }
        Ok(Claim::InUse) => ("in_use", Some(Answer::error(409, "this entry token is already in use"))),
        Ok(Claim::Invalid) => ("forbidden", Some(Answer::error(403, "the entry token is not valid for this user"))),
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, "protected: redis unavailable, refusing (fail closed)");
            // The claim may have been written before the reply was lost (Redis died in between):
            // left alone it would hold the user's retries at 409 for claim_timeout. The id is
            // this request's own, so ending it can never end another request's claim.
            let room = room.clone();
            let (user, token) = (user.clone(), token.to_owned());
            let deadline = Instant::now() + config.token.claim_timeout;
            tokio::spawn(async move { settle_later(&room, &user, &token, &id, false, deadline).await });
            ("unavailable", Some(Answer::unavailable(config)))
        }
    }
}

/// Applies what became of the order to the token that was used (see [`rules::token_fate`]);
/// returns the fate it applied.
pub async fn settle(
    room: &Arc<Room>,
    spent: &SpentTokens,
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
        // Retrying is the user's right; if this release fails the claim still ends with
        // claim_timeout.
        if let Err(error) = room.consume_grouped(user, &token, &id, false).await {
            // Left to claim_timeout, the claim would refuse the user's retries with 409 long
            // after Redis is back.
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, user, "could not release an entry token's claim; retrying");
            let (room, user) = (room.clone(), user.to_owned());
            let deadline = Instant::now() + claim_timeout;
            tokio::spawn(async move { settle_later(&room, &user, &token, &id, false, deadline).await });
        }
        return fate;
    }
    // Before Redis hears of it: a repeat through this proxy is refused from now on, whatever
    // becomes of the delete.
    spent.remember(&token, user, token_ttl);
    match room.consume_grouped(user, &token, &id, true).await {
        Ok(true) => metrics::TOKENS_CONSUMED_TOTAL.inc(),
        // Expired, or already replaced by a newer token, between the check and now.
        Ok(false) => {}
        Err(error) => {
            // The order went through (or may have); refusing its response now would only hide
            // that from the user. While Redis is away a repeat is refused anyway (fail closed);
            // keep trying in the background so the token is gone as soon as Redis is back.
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::error!(%error, user, "could not spend an entry token after a successful order; retrying");
            let (room, user) = (room.clone(), user.to_owned());
            let deadline = Instant::now() + token_ttl;
            tokio::spawn(async move { settle_later(&room, &user, &token, &id, true, deadline).await });
        }
    }
    fate
}

/// Retries settling a token (ending its claim, and spending it after a successful order) until
/// Redis answers or there is nothing left to settle: the claim or the token would have expired.
async fn settle_later(room: &Room, user: &str, token: &str, claim: &str, spend: bool, deadline: Instant) {
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match room.consume(user, token, claim, spend).await {
            Ok(spent) => {
                if spent {
                    metrics::TOKENS_CONSUMED_TOTAL.inc();
                }
                tracing::info!(user, spend, "entry token settled after Redis came back");
                return;
            }
            Err(_) => metrics::REDIS_ERRORS_TOTAL.inc(),
        }
    }
}
