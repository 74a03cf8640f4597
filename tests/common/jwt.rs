//! Tokens for the tests of JWT mode (`identity.jwt`), signed as a shop's identity provider would.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::Value;

/// `claims` signed with HS256 under `secret`.
pub fn hs256_jwt(secret: &str, claims: &Value) -> String {
    let key = EncodingKey::from_secret(secret.as_bytes()).expect("HS256 key");
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &key).expect("sign test token")
}

/// An `exp` claim `secs` from now, in seconds since the epoch.
pub fn jwt_exp_in(secs: u64) -> u64 {
    jsonwebtoken::get_current_timestamp() + secs
}
