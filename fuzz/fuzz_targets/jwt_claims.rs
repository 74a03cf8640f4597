//! JWT verification past the signature: arbitrary bytes as the claims of a correctly signed
//! HS256 token, so the fuzzer explores claim handling (exp, nbf, iss, aud, the identity claim)
//! rather than bouncing off the signature. An accepted token names a valid user, and the user
//! is the `sub` the claims really carry.

#![no_main]

#[path = "common.rs"]
mod common;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let message = format!("{header}.{}", URL_SAFE_NO_PAD.encode(data));
    let key = EncodingKey::from_secret(common::SECRET).unwrap();
    let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256).unwrap();
    let token = format!("{message}.{signature}");
    match common::HS256.verify_token(token.as_bytes()) {
        Ok(user) => {
            common::assert_valid_user(&user);
            let claims: serde_json::Value = serde_json::from_slice(data).expect("accepted claims are JSON");
            assert_eq!(claims["sub"].as_str(), Some(user.as_str()));
            assert_eq!(claims["iss"].as_str(), Some("me"));
        }
        Err(refusal) => assert!(matches!(refusal.status(), 400 | 401), "{refusal:?}"),
    }
});
