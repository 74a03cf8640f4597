//! A protected request (`protected` method + path): forwarded only with the user's current entry
//! token, which is spent once the upstream answers 2xx.
//! Parse (identity, token header) -> apply (read the token from Redis) -> render (a refusal, or
//! nothing and the request goes upstream).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::proxy::Session;

use super::{identity, Answer, Ctx};
use crate::config::Config;
use crate::metrics;
use crate::rules::{self, TokenFate};
use crate::spent::SpentTokens;
use crate::store::Room;

/// Returns the refusal to send, or `None` when the request may go upstream.
pub async fn check(
    config: &Config,
    room: &Room,
    spent: &SpentTokens,
    session: &Session,
    ctx: &mut Ctx,
) -> Option<Answer> {
    let (result, refusal) = decide(config, room, spent, session, ctx).await;
    metrics::PROTECTED_TOTAL.with_label_values(&[result]).inc();
    refusal
}

async fn decide(
    config: &Config,
    room: &Room,
    spent: &SpentTokens,
    session: &Session,
    ctx: &mut Ctx,
) -> (&'static str, Option<Answer>) {
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
    match room.current_token(user).await {
        Ok(Some(current)) if rules::token_matches(presented, current.as_bytes()) => {
            ctx.spend = Some(current);
            ("forwarded", None)
        }
        Ok(_) => ("forbidden", Some(Answer::error(403, "the entry token is not valid for this user"))),
        Err(error) => {
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(%error, "protected: redis unavailable, refusing (fail closed)");
            ("unavailable", Some(Answer::unavailable(config)))
        }
    }
}

/// Applies the upstream's verdict to the token that was used.
pub async fn settle(
    room: &Arc<Room>,
    spent: &SpentTokens,
    user: &str,
    token: &str,
    upstream_status: u16,
    token_ttl: Duration,
) {
    if rules::token_fate(Some(upstream_status)) == TokenFate::Keep {
        return;
    }
    // Before Redis hears of it: a repeat through this proxy is refused from now on, whatever
    // becomes of the delete.
    spent.remember(token, token_ttl);
    match room.consume(user, token).await {
        Ok(true) => metrics::TOKENS_CONSUMED_TOTAL.inc(),
        // Expired, or already replaced by a newer token, between the check and now.
        Ok(false) => {}
        Err(error) => {
            // The order went through; refusing its response now would only hide that from the
            // user. While Redis is away a repeat is refused anyway (fail closed); keep trying in
            // the background so the token is gone as soon as Redis is back.
            metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::error!(%error, user, "could not spend an entry token after a successful order; retrying");
            let (room, user, token) = (room.clone(), user.to_owned(), token.to_owned());
            tokio::spawn(async move { spend_later(&room, &user, &token, token_ttl).await });
        }
    }
}

/// Retries spending a token until it succeeds or the token would have expired anyway.
async fn spend_later(room: &Room, user: &str, token: &str, token_ttl: Duration) {
    let deadline = Instant::now() + token_ttl;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match room.consume(user, token).await {
            Ok(spent) => {
                if spent {
                    metrics::TOKENS_CONSUMED_TOTAL.inc();
                }
                tracing::info!(user, "entry token spent after Redis came back");
                return;
            }
            Err(_) => metrics::REDIS_ERRORS_TOTAL.inc(),
        }
    }
}
