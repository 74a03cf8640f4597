//! `identity.jwt` as the code uses it once validated: the settings and where a request carries
//! its token. They are configuration, so the configuration owns them. `crate::identity` builds
//! its verifier from them, so nothing here names anything of that module: the verifier depends
//! on these types, never these on the verifier.

use std::fmt;
use std::time::Duration;

use http::HeaderName;
use jsonwebtoken::Algorithm;

/// `identity.jwt`, validated, with its key material read (the HS256 secret from the environment,
/// the public key file's bytes); [`JwtVerifier::new`](crate::identity::JwtVerifier::new) parses
/// the keys.
#[derive(Clone)]
pub struct JwtConfig {
    pub from: TokenSource,
    pub algorithms: Vec<jsonwebtoken::Algorithm>,
    pub secret: Option<Vec<u8>>,
    pub public_key_pem: Option<Vec<u8>>,
    pub claim: String,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub leeway: Duration,
    /// The header the proxy sets on a forwarded protected request to the verified identity.
    pub forward_header: HeaderName,
}

impl fmt::Debug for JwtConfig {
    /// Never the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtConfig")
            .field("from", &self.from)
            .field("algorithms", &self.algorithms)
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .field("public_key_pem", &self.public_key_pem.as_ref().map(Vec::len))
            .field("claim", &self.claim)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway", &self.leeway)
            .field("forward_header", &self.forward_header)
            .finish()
    }
}

/// The algorithms `identity.jwt.algorithms` may list, by their JOSE names.
pub const ALGORITHMS: [(&str, Algorithm); 3] = [
    ("HS256", Algorithm::HS256),
    ("RS256", Algorithm::RS256),
    ("ES256", Algorithm::ES256),
];

/// An algorithm by its JOSE name, if `identity.jwt.algorithms` accepts it.
pub fn algorithm(name: &str) -> Option<Algorithm> {
    ALGORITHMS.iter().find(|(n, _)| *n == name).map(|(_, a)| *a)
}

/// Where a request carries its JWT (`identity.jwt.from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `Authorization: Bearer <token>`.
    Authorization,
    /// `Cookie: <name>=<token>`.
    Cookie(String),
}

impl TokenSource {
    /// `authorization` or `cookie:NAME` (NAME a cookie-name token of RFC 6265).
    pub fn parse(text: &str) -> Option<TokenSource> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("authorization") {
            return Some(TokenSource::Authorization);
        }
        let name = text.strip_prefix("cookie:")?.trim();
        let token_char = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
        (!name.is_empty() && name.bytes().all(token_char)).then(|| TokenSource::Cookie(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_sources() {
        assert_eq!(
            TokenSource::parse("authorization"),
            Some(TokenSource::Authorization)
        );
        assert_eq!(
            TokenSource::parse("Authorization"),
            Some(TokenSource::Authorization)
        );
        assert_eq!(
            TokenSource::parse("cookie:session"),
            Some(TokenSource::Cookie("session".into()))
        );
        assert_eq!(TokenSource::parse("cookie:"), None);
        assert_eq!(TokenSource::parse("cookie:a;b"), None);
        assert_eq!(TokenSource::parse("header:x"), None);
    }
}
