//! Who is asking (contract sections 3 and 8): the user named by a trusted header, or by a
//! verified JWT.
//!
//! Trusted-header mode believes whatever the layer in front put in the header, so that layer must
//! *overwrite* the header on every request (appending would let a client send its own); a request
//! carrying the header twice is refused rather than guessed at. JWT mode believes only a token
//! signed with a key the configuration names, for an algorithm the configuration lists.
//!
//! One file a concern: the identity rules and header reading (`header`), the JWT verifier
//! (`jwt`), its key files (`keys`). The settings the verifier is built from are the
//! configuration's ([`crate::config::JwtConfig`]). [`IdentityConfig`] stays here although the
//! configuration holds it: its JWT mode holds the built verifier, and were it beside the settings
//! the verifier is built from, that file and `jwt` would each need the other.

mod header;
mod jwt;
mod keys;

pub use header::{check_identity, cookie, IdentityProblem, MAX_IDENTITY_BYTES};
pub use jwt::{JwtProblem, JwtVerifier, Rotation, MAX_TOKEN_BYTES};
pub use keys::{read_key_file, KeyProblem};

use http::{HeaderMap, HeaderName};

#[derive(Debug, Clone)]
pub enum IdentityConfig {
    /// Trusted-header mode: the layer in front names the user.
    Header(HeaderName),
    /// A verified JWT names the user; keys parsed at load .
    Jwt(std::sync::Arc<JwtVerifier>),
}

/// Why a request names no usable user: the status and message its answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The identity value itself breaks the rules of section 3 (missing, too long, bad bytes).
    Identity(IdentityProblem),
    /// The identity header appears more than once: the layer in front appended instead of
    /// overwriting, so one of the values may be the client's own (400).
    DuplicateHeader,
    /// The JWT was not accepted (401).
    Jwt(JwtProblem),
}

impl Refusal {
    pub fn status(self) -> u16 {
        match self {
            Refusal::Identity(p) => p.status(),
            Refusal::DuplicateHeader => 400,
            Refusal::Jwt(_) => 401,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::Identity(p) => p.message(),
            Refusal::DuplicateHeader => "more than one user identity header",
            Refusal::Jwt(p) => p.message(),
        }
    }

}

/// The user a request names, by the configured identity mode, checked by the identity rules.
pub fn identify(config: &IdentityConfig, headers: &HeaderMap) -> Result<String, Refusal> {
    match config {
        IdentityConfig::Header(name) => {
            let mut values = headers.get_all(name).iter();
            let first = values.next();
            if values.next().is_some() {
                return Err(Refusal::DuplicateHeader);
            }
            check_identity(first.map(|v| v.as_bytes()))
                .map(str::to_owned)
                .map_err(Refusal::Identity)
        }
        IdentityConfig::Jwt(verifier) => verifier.verify(headers),
    }
}

/// Start-up warnings about how identity is configured; logged once by the server.
pub fn startup_warnings(identity: &IdentityConfig, listen: std::net::SocketAddr) -> Vec<String> {
    let mut warnings = Vec::new();
    match identity {
        IdentityConfig::Header(name) if !listen.ip().is_loopback() => warnings.push(format!(
            "identity.header: trusted-header mode on a non-loopback listener ({}): anyone who can \
             reach it can claim any user by sending {name}; the layer in front must overwrite \
             (not append) that header on every request, and nothing else may reach this port",
            listen
        )),
        IdentityConfig::Jwt(verifier) => {
            // RFC 7518 section 3.2: an HS256 key must be at least as long as the hash (32 bytes);
            // a shorter one can be guessed offline from any token a user holds.
            if let Some(len) = verifier.secret_len.filter(|len| *len < 32) {
                warnings.push(format!(
                    "identity.jwt.secret_env: the HS256 secret is {len} bytes; use at least 32 random bytes"
                ));
            }
        }
        _ => {}
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// `jwt`'s tests build their requests with it too.
    pub(super) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_duplicated_identity_header_is_refused() {
        let config = IdentityConfig::Header(http::HeaderName::from_static("x-user-id"));
        assert_eq!(
            identify(&config, &headers(&[("x-user-id", "alice")])),
            Ok("alice".into())
        );
        let two = headers(&[("x-user-id", "mallory"), ("x-user-id", "alice")]);
        assert_eq!(identify(&config, &two), Err(Refusal::DuplicateHeader));
        assert_eq!(Refusal::DuplicateHeader.status(), 400);
        assert_eq!(
            identify(&config, &HeaderMap::new()).map_err(Refusal::status),
            Err(401)
        );
    }
}
