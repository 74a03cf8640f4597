//! JWT mode: the user named by a token signed with a key the configuration names. Kept apart
//! from the header rules because only this mode has keys, algorithms, clocks and a reload that
//! rotates them.
//!
//! Keys are read and parsed once, when the configuration is loaded ([`JwtVerifier::new`]); a
//! request only decodes its token and checks one signature: no file I/O, no PEM or ASN.1 parsing.
//!
//! Algorithm confusion is ruled out by construction: each accepted algorithm has its own key of
//! its own family (an HS256 token is checked against the HS256 secret, never against an RSA
//! public key used as an HMAC secret), and a token whose header names an algorithm the
//! configuration does not list (`none` included) is refused before any key is touched.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use http::{HeaderMap, HeaderName};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::header::{check_identity, cookie};
use super::keys::{ec_key, hmac_key, rsa_key, KeyProblem};
use super::Refusal;
use crate::config::{JwtConfig, TokenSource};
use crate::rules;

/// A token longer than this is refused before it is decoded: real ones are a few hundred bytes,
/// and an identity provider's largest stay well under it.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a request's JWT was not accepted; always 401. The messages name the rule, never the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtProblem {
    /// No bearer token, or no cookie of that name.
    Missing,
    /// More than one `Authorization` header: which one would the user mean?
    Ambiguous,
    TooLong,
    /// Not three base64url parts of JSON, or a claim of the wrong type (`exp` as text, ...).
    Malformed,
    /// The header names an algorithm the configuration does not accept (`none` included).
    Algorithm,
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// The identity claim is missing, empty or not a string.
    Claim,
}

impl JwtProblem {
    pub fn message(self) -> &'static str {
        match self {
            JwtProblem::Missing => "missing identity token",
            JwtProblem::Ambiguous => "more than one Authorization header",
            JwtProblem::TooLong => "identity token is too long",
            JwtProblem::Malformed => "malformed identity token",
            JwtProblem::Algorithm => "identity token algorithm is not accepted",
            JwtProblem::Signature => "identity token signature is not valid",
            JwtProblem::Expired => "identity token has expired",
            JwtProblem::NotYetValid => "identity token is not valid yet",
            JwtProblem::Issuer => "identity token has the wrong issuer",
            JwtProblem::Audience => "identity token has the wrong audience",
            JwtProblem::Claim => "identity token does not name a user",
        }
    }

    fn from_decode_error(kind: &ErrorKind) -> JwtProblem {
        match kind {
            ErrorKind::InvalidSignature => JwtProblem::Signature,
            ErrorKind::ExpiredSignature => JwtProblem::Expired,
            ErrorKind::ImmatureSignature => JwtProblem::NotYetValid,
            ErrorKind::InvalidIssuer => JwtProblem::Issuer,
            ErrorKind::InvalidAudience => JwtProblem::Audience,
            ErrorKind::MissingRequiredClaim(c) if c == "iss" => JwtProblem::Issuer,
            ErrorKind::MissingRequiredClaim(c) if c == "aud" => JwtProblem::Audience,
            ErrorKind::InvalidAlgorithm
            | ErrorKind::InvalidAlgorithmName
            | ErrorKind::UnsupportedAlgorithm
            | ErrorKind::MissingAlgorithm => JwtProblem::Algorithm,
            _ => JwtProblem::Malformed,
        }
    }
}

/// One accepted algorithm: the key its tokens are checked with and the rules they must meet.
#[derive(Clone)]
struct Accepted {
    algorithm: Algorithm,
    key: DecodingKey,
    validation: Validation,
}

/// `identity.jwt`, ready to check requests: keys parsed, validation rules built.
pub struct JwtVerifier {
    from: TokenSource,
    claim: String,
    /// Set by the proxy on forwarded protected requests, replacing whatever the client sent, so
    /// the upstream can trust it (contract section 12).
    pub forward_header: HeaderName,
    accepted: Vec<Accepted>,
    /// Bytes of the HS256 secret, for the start-up warning about short ones.
    pub(super) secret_len: Option<usize>,
    /// What it was built from that a reload may rotate, to tell which of it a reload changed.
    rotatable: Rotatable,
}

/// What of `identity.jwt` a reload takes without a restart (contract section 6): the keys and the
/// rules a token must meet, but nothing that says which user a token names. The key material by
/// its SHA-256, so that it is compared without being kept twice.
#[derive(Clone, PartialEq, Eq)]
struct Rotatable {
    algorithms: Vec<Algorithm>,
    secret: Option<[u8; 32]>,
    public_key: Option<[u8; 32]>,
    issuer: Option<String>,
    audience: Option<String>,
    leeway: Duration,
}

impl Rotatable {
    fn of(config: &JwtConfig) -> Rotatable {
        use sha2::Digest;
        let digest = |bytes: &Option<Vec<u8>>| bytes.as_ref().map(|b| sha2::Sha256::digest(b).into());
        Rotatable {
            algorithms: config.algorithms.clone(),
            secret: digest(&config.secret),
            public_key: digest(&config.public_key_pem),
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            leeway: config.leeway,
        }
    }
}

/// How a reload's verified identity differs from the running one, by key path.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rotation {
    /// Keys and rules that take effect now.
    pub applied: Vec<&'static str>,
    /// What would rename users: kept as running until a restart.
    pub need_restart: Vec<&'static str>,
}

impl fmt::Debug for JwtVerifier {
    /// Never the key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("from", &self.from)
            .field("claim", &self.claim)
            .field("forward_header", &self.forward_header)
            .field("algorithms", &self.algorithms())
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// Parses the keys `config` carries (the HS256 secret, the PEM public key) and builds one
    /// validation per algorithm.
    pub fn new(config: &JwtConfig) -> Result<JwtVerifier, KeyProblem> {
        let mut accepted = Vec::with_capacity(config.algorithms.len());
        for &algorithm in &config.algorithms {
            let key = match algorithm {
                Algorithm::HS256 => hmac_key(config.secret.as_deref())?,
                Algorithm::RS256 => rsa_key(config.public_key_pem.as_deref())?,
                Algorithm::ES256 => ec_key(config.public_key_pem.as_deref())?,
                other => {
                    return Err(KeyProblem {
                        path: "identity.jwt.algorithms",
                        message: format!("{other:?} is not supported"),
                    })
                }
            };
            accepted.push(Accepted {
                algorithm,
                key,
                validation: validation(algorithm, config),
            });
        }
        Ok(JwtVerifier {
            from: config.from.clone(),
            claim: config.claim.clone(),
            forward_header: config.forward_header.clone(),
            accepted,
            secret_len: config.secret.as_ref().map(Vec::len),
            rotatable: Rotatable::of(config),
        })
    }

    /// What `next` (a reloaded file's verifier) changes of this running one, by key path.
    pub fn rotation(&self, next: &JwtVerifier) -> Rotation {
        let (a, b) = (&self.rotatable, &next.rotatable);
        let changed = |key, differs: bool| differs.then_some(key);
        let applied = [
            changed("identity.jwt.algorithms", a.algorithms != b.algorithms),
            changed("identity.jwt.secret_env", a.secret != b.secret),
            changed("identity.jwt.public_key_file", a.public_key != b.public_key),
            changed("identity.jwt.issuer", a.issuer != b.issuer),
            changed("identity.jwt.audience", a.audience != b.audience),
            changed("identity.jwt.leeway", a.leeway != b.leeway),
        ];
        let need_restart = [
            changed("identity.jwt.from", self.from != next.from),
            changed("identity.jwt.claim", self.claim != next.claim),
            changed("identity.jwt.forward_header", self.forward_header != next.forward_header),
        ];
        Rotation {
            applied: applied.into_iter().flatten().collect(),
            need_restart: need_restart.into_iter().flatten().collect(),
        }
    }

    /// `next`'s keys and rules, naming users as this running verifier does: what a reload applies.
    pub fn rotated_to(&self, next: &JwtVerifier) -> JwtVerifier {
        JwtVerifier {
            from: self.from.clone(),
            claim: self.claim.clone(),
            forward_header: self.forward_header.clone(),
            accepted: next.accepted.clone(),
            secret_len: next.secret_len,
            rotatable: next.rotatable.clone(),
        }
    }

    pub fn algorithms(&self) -> Vec<Algorithm> {
        self.accepted.iter().map(|a| a.algorithm).collect()
    }

    /// The user a request's token names.
    pub fn verify(&self, headers: &HeaderMap) -> Result<String, Refusal> {
        let token = match &self.from {
            TokenSource::Authorization => bearer_token(headers)?,
            TokenSource::Cookie(name) => cookie(headers, name).ok_or(Refusal::Jwt(JwtProblem::Missing))?,
        };
        self.verify_token(token)
    }

    /// The user a token names: signature, algorithm, time, issuer and audience checked, then
    /// the identity rules applied to the claim.
    pub fn verify_token(&self, token: &[u8]) -> Result<String, Refusal> {
        let jwt = |p| Refusal::Jwt(p);
        if token.is_empty() {
            return Err(jwt(JwtProblem::Missing));
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(jwt(JwtProblem::TooLong));
        }
        // The header only picks the key; `decode` checks it again, with everything else.
        let header = jsonwebtoken::decode_header(token).map_err(|_| jwt(JwtProblem::Malformed))?;
        let accepted = self
            .accepted
            .iter()
            .find(|a| a.algorithm == header.alg)
            .ok_or(jwt(JwtProblem::Algorithm))?;
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &accepted.key,
            &accepted.validation,
        )
        .map_err(|e| jwt(JwtProblem::from_decode_error(e.kind())))?;
        match data.claims.get(&self.claim) {
            Some(serde_json::Value::String(user)) if !user.is_empty() => {
                check_identity(Some(user.as_bytes()))
                    .map(str::to_owned)
                    .map_err(Refusal::Identity)
            }
            _ => Err(jwt(JwtProblem::Claim)),
        }
    }
}

fn validation(algorithm: Algorithm, config: &JwtConfig) -> Validation {
    let mut v = Validation::new(algorithm);
    v.leeway = rules::ceil_secs(config.leeway);
    v.validate_exp = true;
    v.validate_nbf = true;
    // `exp` and `nbf` are checked when present; section 8 does not require them.
    v.required_spec_claims = HashSet::new();
    if let Some(issuer) = &config.issuer {
        v.set_issuer(&[issuer]);
        v.required_spec_claims.insert("iss".to_string());
    }
    match &config.audience {
        Some(audience) => {
            v.set_audience(&[audience]);
            v.required_spec_claims.insert("aud".to_string());
        }
        // Without a configured audience, any `aud` the token carries is fine.
        None => v.validate_aud = false,
    }
    v
}

/// `Authorization: Bearer <token>`; the scheme is case-insensitive (RFC 9110 section 11.1).
fn bearer_token(headers: &HeaderMap) -> Result<&[u8], Refusal> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = values.next().ok_or(Refusal::Jwt(JwtProblem::Missing))?;
    if values.next().is_some() {
        return Err(Refusal::Jwt(JwtProblem::Ambiguous));
    }
    let bytes = value.as_bytes();
    let scheme_ok = bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ");
    if !scheme_ok {
        return Err(Refusal::Jwt(JwtProblem::Missing));
    }
    let token = bytes[7..].trim_ascii();
    if token.is_empty() {
        return Err(Refusal::Jwt(JwtProblem::Missing));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, IdentityConfig};
    use crate::identity::tests::headers;

    #[test]
    fn bearer_and_cookie_extraction() {
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer abc")])),
            Ok(&b"abc"[..])
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "bearer  abc ")])),
            Ok(&b"abc"[..])
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Basic abc")])),
            Err(Refusal::Jwt(JwtProblem::Missing))
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer ")])),
            Err(Refusal::Jwt(JwtProblem::Missing))
        );
        assert_eq!(
            bearer_token(&headers(&[
                ("authorization", "Bearer a"),
                ("authorization", "Bearer b")
            ])),
            Err(Refusal::Jwt(JwtProblem::Ambiguous))
        );
        let h = headers(&[("cookie", "a=1; jwt=\"tok\"; jwt=second"), ("cookie", "b=2")]);
        assert_eq!(cookie(&h, "jwt"), Some(&b"tok"[..]));
        assert_eq!(cookie(&h, "b"), Some(&b"2"[..]));
        assert_eq!(cookie(&h, "j"), None);
        assert_eq!(cookie(&headers(&[("cookie", "jwt=")]), "jwt"), None);
    }

    fn hs256(extra: &str) -> std::sync::Arc<JwtVerifier> {
        let yaml = format!("upstream: a:1\nidentity: {{jwt: {{secret_env: WAITROOM_UNIT_SECRET{extra}}}}}");
        // Every test here sets the same value; nothing else reads this variable.
        std::env::set_var("WAITROOM_UNIT_SECRET", "0123456789abcdef0123456789abcdef");
        match Config::parse(&yaml).unwrap().identity {
            IdentityConfig::Jwt(v) => v,
            other => panic!("{other:?}"),
        }
    }

    fn sign(claims: serde_json::Value, alg: Algorithm, secret: &[u8]) -> String {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(alg),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret).unwrap(),
        )
        .unwrap()
    }

    fn now() -> i64 {
        jsonwebtoken::get_current_timestamp() as i64
    }

    #[test]
    fn hs256_tokens() {
        let v = hs256(", issuer: me, audience: shop, leeway: 30s");
        let key = b"0123456789abcdef0123456789abcdef";
        let ok = serde_json::json!({"sub": "alice", "iss": "me", "aud": "shop", "exp": now() + 60});
        assert_eq!(
            v.verify_token(sign(ok.clone(), Algorithm::HS256, key).as_bytes()),
            Ok("alice".into())
        );
        let bad = |claims: serde_json::Value, secret: &[u8]| {
            v.verify_token(sign(claims, Algorithm::HS256, secret).as_bytes())
                .unwrap_err()
        };
        let with = |k: &str, val: serde_json::Value| {
            let mut c = ok.clone();
            c[k] = val;
            c
        };
        assert_eq!(
            bad(ok.clone(), b"another secret, also 32 bytes long"),
            Refusal::Jwt(JwtProblem::Signature)
        );
        assert_eq!(
            bad(with("exp", (now() - 90).into()), key),
            Refusal::Jwt(JwtProblem::Expired)
        );
        assert_eq!(
            v.verify_token(sign(with("exp", (now() - 10).into()), Algorithm::HS256, key).as_bytes()),
            Ok("alice".into())
        );
        assert_eq!(
            bad(with("iss", "other".into()), key),
            Refusal::Jwt(JwtProblem::Issuer)
        );
        assert_eq!(
            bad(with("aud", "other".into()), key),
            Refusal::Jwt(JwtProblem::Audience)
        );
        assert_eq!(bad(with("sub", 42.into()), key), Refusal::Jwt(JwtProblem::Claim));
        assert_eq!(bad(with("sub", "".into()), key), Refusal::Jwt(JwtProblem::Claim));
        assert_eq!(bad(with("sub", "x".repeat(300).into()), key).status(), 400);
        assert_eq!(
            bad(with("exp", "soon".into()), key),
            Refusal::Jwt(JwtProblem::Malformed)
        );
        assert_eq!(
            v.verify_token(sign(ok.clone(), Algorithm::HS384, key).as_bytes()),
            Err(Refusal::Jwt(JwtProblem::Algorithm))
        );
        // alg "none": header {"alg":"none"}, no signature.
        let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSJ9.";
        assert!(v.verify_token(none.as_bytes()).is_err());
        assert_eq!(
            v.verify_token(b"not a token"),
            Err(Refusal::Jwt(JwtProblem::Malformed))
        );
        assert_eq!(
            v.verify_token(&vec![b'a'; MAX_TOKEN_BYTES + 1]),
            Err(Refusal::Jwt(JwtProblem::TooLong))
        );
    }

    #[test]
    fn the_verifier_never_shows_its_key() {
        let v = hs256("");
        assert!(!format!("{v:?}").contains("0123456789abcdef"));
    }
}
