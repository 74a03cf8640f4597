//! Who is asking (contract sections 3 and 8): the user named by a trusted header, or by a
//! verified JWT.
//!
//! Trusted-header mode believes whatever the layer in front put in the header, so that layer must
//! *overwrite* the header on every request (appending would let a client send its own); a request
//! carrying the header twice is refused rather than guessed at. JWT mode believes only a token
//! signed with a key the configuration names, for an algorithm the configuration lists.
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
use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::rules;

/// What is wrong with an identity value, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityProblem {
    /// Missing or empty: the user is not authenticated (401).
    Missing,
    /// Longer than [`MAX_IDENTITY_BYTES`] (400).
    TooLong,
    /// A byte outside printable ASCII (400).
    BadBytes,
}

pub const MAX_IDENTITY_BYTES: usize = 256;

impl IdentityProblem {
    pub fn status(self) -> u16 {
        match self {
            IdentityProblem::Missing => 401,
            IdentityProblem::TooLong | IdentityProblem::BadBytes => 400,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            IdentityProblem::Missing => "missing user identity",
            IdentityProblem::TooLong => "user identity is longer than 256 bytes",
            IdentityProblem::BadBytes => "user identity must be printable ASCII",
        }
    }
}

/// Checks an identity value (a header's raw bytes, or a verified claim) and returns it as text.
pub fn check_identity(raw: Option<&[u8]>) -> Result<&str, IdentityProblem> {
    let bytes = raw.unwrap_or_default();
    if bytes.is_empty() {
        return Err(IdentityProblem::Missing);
    }
    if bytes.len() > MAX_IDENTITY_BYTES {
        return Err(IdentityProblem::TooLong);
    }
    if !bytes.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Err(IdentityProblem::BadBytes);
    }
    // Printable ASCII is always valid UTF-8.
    std::str::from_utf8(bytes).map_err(|_| IdentityProblem::BadBytes)
}

#[derive(Debug, Clone)]
pub enum IdentityConfig {
    /// Trusted-header mode: the layer in front names the user.
    Header(HeaderName),
    /// A verified JWT names the user; keys parsed at load .
    Jwt(std::sync::Arc<JwtVerifier>),
}

/// `identity.jwt`, validated, with its key material read (the HS256 secret from the environment,
/// the public key file's bytes); [`JwtVerifier::new`] parses the keys.
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

/// A token longer than this is refused before it is decoded: real ones are a few hundred bytes,
/// and an identity provider's largest stay well under it.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

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

/// Why `identity.jwt`'s keys could not be prepared: a configuration problem at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyProblem {
    pub path: &'static str,
    pub message: String,
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
    secret_len: Option<usize>,
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

fn hmac_key(secret: Option<&[u8]>) -> Result<DecodingKey, KeyProblem> {
    let problem = |m: &str| KeyProblem {
        path: "identity.jwt.secret_env",
        message: m.to_string(),
    };
    let secret = secret.ok_or_else(|| problem("is required for HS256"))?;
    DecodingKey::from_secret(secret).map_err(|_| problem("names an empty secret"))
}

/// A PEM public key is a few KiB; anything much larger is not one.
const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// Reads `identity.jwt.public_key_file`: a regular file of at most 64 KiB (so a path such as
/// `/dev/zero` or a FIFO cannot hang the configuration load). The error is the problem's text.
pub fn read_key_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    // Looked at before opening: opening a FIFO for reading would wait for a writer.
    if !std::fs::metadata(path).map_err(cannot)?.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut pem = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(cannot)?;
    if pem.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(format!(
            "{} is larger than 64 KiB: not a PEM public key",
            path.display()
        ));
    }
    Ok(pem)
}

fn key_file_problem(message: impl Into<String>) -> KeyProblem {
    KeyProblem {
        path: "identity.jwt.public_key_file",
        message: message.into(),
    }
}

fn pem_text<'a>(pem: Option<&'a [u8]>, algorithm: &str) -> Result<&'a [u8], KeyProblem> {
    let pem = pem.ok_or_else(|| key_file_problem(format!("is required for {algorithm}")))?;
    // The proxy only verifies: a private key here is a key in the wrong place.
    if pem.windows(11).any(|w| w == b"PRIVATE KEY") {
        return Err(key_file_problem(
            "holds a private key; give the proxy the public key only",
        ));
    }
    Ok(pem)
}

/// RS256: a PEM RSA public key (PKCS#1 `RSA PUBLIC KEY` or SPKI `PUBLIC KEY`), kept as its
/// modulus and exponent so a request never parses DER.
fn rsa_key(pem: Option<&[u8]>) -> Result<DecodingKey, KeyProblem> {
    let pem = pem_text(pem, "RS256")?;
    let not_rsa = || key_file_problem("is not a PEM RSA public key (needed for RS256)");
    let der = DecodingKey::from_rsa_pem(pem).map_err(|_| not_rsa())?;
    let der = der.try_get_as_bytes().map_err(|_| not_rsa())?;
    let provider = CryptoProvider::try_get_default().ok_or_else(not_rsa)?;
    let (n, e) = (provider.key_utils.rsa_pub_components_from_public_key)(der).map_err(|_| not_rsa())?;
    Ok(DecodingKey::from_rsa_raw_components(&n, &e))
}

/// ES256: a PEM P-256 public key (SPKI `PUBLIC KEY`).
fn ec_key(pem: Option<&[u8]>) -> Result<DecodingKey, KeyProblem> {
    let pem = pem_text(pem, "ES256")?;
    let not_ec = || key_file_problem("is not a PEM P-256 public key (needed for ES256)");
    let key = DecodingKey::from_ec_pem(pem).map_err(|_| not_ec())?;
    // Building a verifier decodes the curve point: a key that is not on P-256 fails here, once.
    let provider = CryptoProvider::try_get_default().ok_or_else(not_ec)?;
    (provider.verifier_factory)(&Algorithm::ES256, &key).map_err(|_| not_ec())?;
    Ok(key)
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

/// The first cookie called `name` in any `Cookie` header (HTTP/2 may split them), unquoted.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|b| *b == b'=')?;
            if pair[..eq].trim_ascii() != name.as_bytes() {
                return None;
            }
            let value = pair[eq + 1..].trim_ascii();
            let value = value
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(value);
            (!value.is_empty()).then_some(value)
        })
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
    use crate::config::Config;

    #[test]
    fn identity_rules() {
        assert_eq!(check_identity(None), Err(IdentityProblem::Missing));
        assert_eq!(check_identity(Some(b"")), Err(IdentityProblem::Missing));
        assert_eq!(check_identity(Some(b"alice")), Ok("alice"));
        assert_eq!(check_identity(Some(b"a b~!")), Ok("a b~!"));
        assert_eq!(check_identity(Some(&[b'a'; 256])).map(str::len), Ok(256));
        assert_eq!(check_identity(Some(&[b'a'; 257])), Err(IdentityProblem::TooLong));
        assert_eq!(check_identity(Some(b"tab\there")), Err(IdentityProblem::BadBytes));
        assert_eq!(check_identity(Some("caf\u{e9}".as_bytes())), Err(IdentityProblem::BadBytes));
        assert_eq!(check_identity(Some(&[0x7f])), Err(IdentityProblem::BadBytes));
        assert_eq!(IdentityProblem::Missing.status(), 401);
        assert_eq!(IdentityProblem::BadBytes.status(), 400);
    }

    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
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
