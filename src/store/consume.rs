//! A protected request's two Redis calls (contract section 12): the claim on the user's token as
//! the request is forwarded (`lua/claim.lua`), and settling it once the upstream answered
//! (`lua/consume.lua`): spent after a 2xx, released otherwise.
//!
//! Both are on every order's path, so the proxy's claims and settles travel in groups, as enters
//! do (see `group.rs`): each script takes its members in their order, each exactly as a call of
//! its own would have been.

use std::sync::Arc;

use super::group::grouped;
use super::{RoomStore, StoreError};

pub(super) mod claim {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{grouped, Claim, RoomStore, StoreError};

    script! {
        static SCRIPT = [] "lua/claim.lua";
        keys []
        args ClaimArgs {
            claim_ms: u64,
            members: u64,
        }
        reply Reply {
            "CLAIMED" => Claimed {},
            "IN_USE" => InUse {},
            "INVALID" => Invalid {},
        }
    }

    /// One claim of a group; the group shares how long a claim holds, in ms.
    #[derive(Debug)]
    pub(in crate::store) struct Member {
        user: String,
        token: String,
        claim: String,
    }

    impl Member {
        fn new(user: &str, token: &str, claim: &str, hold: Duration) -> (u64, Member) {
            let hold_ms = (hold.as_millis() as u64).max(1);
            (hold_ms, Member { user: user.to_owned(), token: token.to_owned(), claim: claim.to_owned() })
        }
    }

    impl RoomStore {
        /// Claims the user's token for one request, if `token` is the current one and nobody
        /// holds it, in a call of its own. A claim left behind (a proxy that died mid-request)
        /// ends after `hold`, or with the token.
        pub async fn claim(&self, user: &str, token: &str, claim: &str, hold: Duration) -> Result<Claim, StoreError> {
            let (hold_ms, member) = Member::new(user, token, claim, hold);
            self.alone(&hold_ms, &member).await
        }

        /// The same claim, in a group with the claims that arrive while earlier groups are out.
        /// Bounded by `redis.timeout` from now, the wait for a group included.
        pub async fn claim_grouped(
            self: &Arc<Self>,
            user: &str,
            token: &str,
            claim: &str,
            hold: Duration,
        ) -> Result<Claim, StoreError> {
            let (hold_ms, member) = Member::new(user, token, claim, hold);
            self.grouped(hold_ms, member).await
        }

        async fn claim_members(&self, hold_ms: u64, members: &[&Member]) -> Result<Vec<Claim>, StoreError> {
            let mut call = invoke(&self.keys, ClaimArgs { claim_ms: hold_ms, members: members.len() as u64 });
            for member in members {
                let (user_token, user_claim) = self.keys.token_and_claim(&member.user);
                call.key(user_token).key(user_claim);
                call.arg(member.token.as_str()).arg(member.claim.as_str());
            }
            let replies: Vec<redis::Value> = self.run(&call).await?;
            let mut values = replies.into_iter();
            let claims = members
                .iter()
                .map(|_| {
                    Ok(match Reply::take(&mut values)? {
                        Reply::Claimed {} => Claim::Claimed,
                        Reply::InUse {} => Claim::InUse,
                        Reply::Invalid {} => Claim::Invalid,
                    })
                })
                .collect::<Result<_, StoreError>>()?;
            crate::store::script::nothing_left(FILE, values)?;
            Ok(claims)
        }
    }

    grouped!(Member {
        terms: u64,
        reply: Claim,
        groups: claims,
        call: |room, hold_ms, members| room.claim_members(*hold_ms, members),
    });
}

pub(super) mod keep {
    use std::time::Duration;

    use super::{RoomStore, StoreError};

    script! {
        static SCRIPT = [] "lua/keep_claims.lua";
        keys []
        args KeepArgs {
            claim_ms: u64,
            members: u64,
        }
    }

    impl RoomStore {
        /// Keeps each of `claims` (user, claim id), the claims of this proxy's orders still in
        /// flight, for `hold` more (never past its token's expiry), if it is still that
        /// request's; how many were.
        pub async fn keep_claims(&self, claims: &[(&str, &str)], hold: Duration) -> Result<u64, StoreError> {
            if claims.is_empty() {
                return Ok(0);
            }
            let claim_ms = (hold.as_millis() as u64).max(1);
            let mut call = invoke(&self.keys, KeepArgs { claim_ms, members: claims.len() as u64 });
            for (user, claim) in claims {
                let (user_token, user_claim) = self.keys.token_and_claim(user);
                call.key(user_token).key(user_claim);
                call.arg(*claim);
            }
            self.run(&call).await
        }
    }
}

script! {
    static SCRIPT = [] "lua/consume.lua";
    keys [tokens]
    args ConsumeArgs<'a> {
        spent_channel: &'a str,
        members: u64,
    }
}

/// What a claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The token is the user's current one and this request now holds it.
    Claimed,
    /// Another request holds it (409).
    InUse,
    /// Not the user's current token, or none is live (403).
    Invalid,
}

/// One settle: of a group, or of the proxy's retries (see `crate::claims::Settles`).
#[derive(Debug, Clone)]
pub struct Settle {
    user: String,
    token: String,
    /// The request's claim id; empty for none.
    claim: String,
    spend: bool,
}

impl Settle {
    pub fn new(user: &str, token: &str, claim: &str, spend: bool) -> Settle {
        Settle { user: user.to_owned(), token: token.to_owned(), claim: claim.to_owned(), spend }
    }

    /// Whether it spends the token (an order that succeeded), rather than only ending a claim.
    pub fn spends(&self) -> bool {
        self.spend
    }
}

impl RoomStore {
    /// Ends the request's claim and, when `spend` (the order succeeded), deletes the user's
    /// token if it is still `token`, in a call of its own; true when it was deleted.
    pub async fn consume(&self, user: &str, token: &str, claim: &str, spend: bool) -> Result<bool, StoreError> {
        self.alone(&(), &Settle::new(user, token, claim, spend)).await
    }

    /// The same settle, in a group with the settles that arrive while earlier groups are out.
    /// Bounded by `redis.timeout` from now, the wait for a group included.
    pub async fn consume_grouped(
        self: &Arc<Self>,
        user: &str,
        token: &str,
        claim: &str,
        spend: bool,
    ) -> Result<bool, StoreError> {
        self.grouped((), Settle::new(user, token, claim, spend)).await
    }

    async fn settle_members(&self, members: &[&Settle]) -> Result<Vec<bool>, StoreError> {
        let args = ConsumeArgs { spent_channel: &self.keys.spent, members: members.len() as u64 };
        let mut call = invoke(&self.keys, args);
        for member in members {
            let (user_token, user_claim) = self.keys.token_and_claim(&member.user);
            call.key(user_token).key(user_claim);
            call.arg(member.token.as_str()).arg(member.user.as_str()).arg(member.claim.as_str()).arg(member.spend);
        }
        let deleted: Vec<i64> = self.run(&call).await?;
        Ok(deleted.into_iter().map(|deleted| deleted == 1).collect())
    }

    /// Several settles in one call of their own, in their order (at most [`super::GROUP_MAX`]
    /// make a call short); for each, whether its token was deleted.
    pub async fn settle_all(&self, settles: &[Settle]) -> Result<Vec<bool>, StoreError> {
        let members: Vec<&Settle> = settles.iter().collect();
        let replies = self.settle_members(&members).await?;
        if replies.len() != members.len() {
            return Err(StoreError::Reply(format!("{FILE}: {} replies for {} members", replies.len(), members.len())));
        }
        Ok(replies)
    }

    /// The user's current token, if one is live.
    pub async fn current_token(&self, user: &str) -> Result<Option<String>, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let token: Option<String> =
                redis::cmd("GET").arg(self.keys.token(user)).query_async(&mut conn).await?;
            Ok(token)
        })
        .await
    }
}

grouped!(Settle {
    terms: (),
    reply: bool,
    groups: settles,
    call: |room, _, members| room.settle_members(members),
});
