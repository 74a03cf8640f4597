//! A protected request's two Redis calls (contract section 12): the claim on the user's token as
//! the request is forwarded (`lua/claim.lua`), and settling it once the upstream answered
//! (`lua/consume.lua`): spent after a 2xx, released otherwise.

use super::{Room, StoreError};

pub(super) mod claim {
    use std::time::Duration;

    use super::{Claim, Room, StoreError};

    script! {
        static SCRIPT = [] "lua/claim.lua";
        keys [] and ClaimKeys { user_token, user_claim }
        args ClaimArgs<'a> {
            token: &'a str,
            claim: &'a str,
            claim_ms: u64,
        }
        reply Reply {
            "CLAIMED" => Claimed {},
            "IN_USE" => InUse {},
            "INVALID" => Invalid {},
        }
    }

    impl Room {
        /// Claims the user's token for one request, if `token` is the current one and nobody
        /// holds it. A claim left behind (a proxy that died mid-request) ends after `hold`, or
        /// with the token.
        pub async fn claim(&self, user: &str, token: &str, claim: &str, hold: Duration) -> Result<Claim, StoreError> {
            let (user_token, user_claim) = self.keys.token_and_claim(user);
            let call = invoke(
                &self.keys,
                ClaimKeys { user_token: &user_token, user_claim: &user_claim },
                ClaimArgs { token, claim, claim_ms: (hold.as_millis() as u64).max(1) },
            );
            let reply: Vec<redis::Value> = self.run(&call).await?;
            Ok(match Reply::decode(reply)? {
                Reply::Claimed {} => Claim::Claimed,
                Reply::InUse {} => Claim::InUse,
                Reply::Invalid {} => Claim::Invalid,
            })
        }
    }
}

script! {
    static SCRIPT = [] "lua/consume.lua";
    keys [tokens] and ConsumeKeys { user_token, user_claim }
    args ConsumeArgs<'a> {
        token: &'a str,
        user: &'a str,
        claim: &'a str,
        spend: bool,
        spent_channel: &'a str,
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

impl Room {
    /// Ends the request's claim and, when `spend` (the order succeeded), deletes the user's
    /// token if it is still `token`; true when it was deleted.
    pub async fn consume(&self, user: &str, token: &str, claim: &str, spend: bool) -> Result<bool, StoreError> {
        let (user_token, user_claim) = self.keys.token_and_claim(user);
        let keys = ConsumeKeys { user_token: &user_token, user_claim: &user_claim };
        let spent_channel = &self.keys.spent;
        let call = invoke(&self.keys, keys, ConsumeArgs { token, user, claim, spend, spent_channel });
        let deleted: i64 = self.run(&call).await?;
        Ok(deleted == 1)
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
