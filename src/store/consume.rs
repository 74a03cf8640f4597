//! A protected request's two Redis calls: the user's live token, and spending it
//! (`lua/consume.lua`) once the order succeeded.

use super::{Room, StoreError};

script! {
    static SCRIPT = [] "lua/consume.lua";
    keys [tokens] and ConsumeKeys { user_token }
    args ConsumeArgs<'a> {
        token: &'a str,
        user: &'a str,
    }
}

impl Room {
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

    /// Deletes the user's token if it is still `token`; true when it was deleted.
    pub async fn consume(&self, user: &str, token: &str) -> Result<bool, StoreError> {
        let user_token = self.keys.token(user);
        let call = invoke(&self.keys, ConsumeKeys { user_token: &user_token }, ConsumeArgs { token, user });
        let deleted: i64 = self.run(&call).await?;
        Ok(deleted == 1)
    }
}
