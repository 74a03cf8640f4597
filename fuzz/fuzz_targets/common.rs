//! What the identity targets share: verifiers built the way the proxy builds them, from a
//! configuration with real keys (public halves only; the private halves were thrown away).

#![allow(dead_code)]

use std::sync::{Arc, LazyLock};

use waitroom::config::{Config, IdentityConfig};
use waitroom::identity::JwtVerifier;

pub const SECRET: &[u8] = b"fuzz-secret-fuzz-secret-fuzz-secret!";

const EC_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAETS26fZ6XDx7BN0DiW2+RVBJhZ6un
dEA6QcIhgUPfEkHUylpca35dTb9FmLTy+6m4K8AqTBIoNvUDtJ2fuID+tA==
-----END PUBLIC KEY-----
";

const RSA_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAkRgXk7XNv0Ms5XbQoQg3
brOvB/0U/8kxc87N/1cpDHQANZwuMD2UJ4j6KV1nSNuIPdAvnzHtMEjOfB2rPgQy
VMAf3Tt3Wt9CecAOIa4NR1dDcKRqJvuoDNWhBlI2t4Deu/po7gGg9xpXV0c4N2ED
V7hW1I1OeSX/ODobqbPDSyYwHps9JnUPnk7uBKDdFELSD7FEOTnIEfEoc3xqD9UB
zvjHnqUImouVENSzUPhHu+RR0y5RgkjZOdQHL8kZCMXFCJaZKmJercc3+gSYiI8o
w/QZ/r53K9cIusIfNEveL19YWRjRUh3tzLPIdDHvBQeveIpHfMjoS5qQADX0tYm4
PwIDAQAB
-----END PUBLIC KEY-----
";

fn identity(yaml: &str) -> IdentityConfig {
    let folder = std::env::temp_dir().join(format!("waitroom-fuzz-keys-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("ec.pem"), EC_PUBLIC).unwrap();
    std::fs::write(folder.join("rsa.pem"), RSA_PUBLIC).unwrap();
    std::env::set_var("WAITROOM_FUZZ_SECRET", std::str::from_utf8(SECRET).unwrap());
    Config::parse_in(&format!("upstream: 127.0.0.1:1\n{yaml}"), &folder)
        .unwrap_or_else(|e| panic!("fuzz config: {e}"))
        .identity
}

/// The trusted header, and JWT verifiers for each algorithm and token source.
pub static IDENTITIES: LazyLock<Vec<IdentityConfig>> = LazyLock::new(|| {
    vec![
        identity("identity: {header: X-User-Id}"),
        identity(
            "identity: {jwt: {secret_env: WAITROOM_FUZZ_SECRET, issuer: me, audience: shop, leeway: 30s}}",
        ),
        identity("identity: {jwt: {from: 'cookie:wr_id', secret_env: WAITROOM_FUZZ_SECRET, claim: uid}}"),
        identity("identity: {jwt: {algorithms: [RS256], public_key_file: rsa.pem}}"),
        identity(
            "identity: {jwt: {algorithms: [HS256, ES256], secret_env: WAITROOM_FUZZ_SECRET, public_key_file: ec.pem}}",
        ),
    ]
});

/// The HS256 verifier (issuer `me`, audience `shop`) that `jwt_claims` signs for.
pub static HS256: LazyLock<Arc<JwtVerifier>> = LazyLock::new(|| match &IDENTITIES[1] {
    IdentityConfig::Jwt(v) => v.clone(),
    other => panic!("{other:?}"),
});

/// What an accepted user must look like (contract section 3).
pub fn assert_valid_user(user: &str) {
    assert!(!user.is_empty() && user.len() <= 256, "{user:?}");
    assert!(user.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{user:?}");
}
