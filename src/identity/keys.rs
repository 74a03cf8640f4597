//! `identity.jwt`'s key material, read and parsed once, when the configuration is loaded: a
//! missing, oversized, private or malformed key is a configuration problem with its key path
//! ([`KeyProblem`]), found before the proxy serves, never a request's 401.

use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::{Algorithm, DecodingKey};

/// Why `identity.jwt`'s keys could not be prepared: a configuration problem at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyProblem {
    pub path: &'static str,
    pub message: String,
}

pub(super) fn hmac_key(secret: Option<&[u8]>) -> Result<DecodingKey, KeyProblem> {
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
pub(super) fn rsa_key(pem: Option<&[u8]>) -> Result<DecodingKey, KeyProblem> {
    let pem = pem_text(pem, "RS256")?;
    let not_rsa = || key_file_problem("is not a PEM RSA public key (needed for RS256)");
    let der = DecodingKey::from_rsa_pem(pem).map_err(|_| not_rsa())?;
    let der = der.try_get_as_bytes().map_err(|_| not_rsa())?;
    let provider = CryptoProvider::try_get_default().ok_or_else(not_rsa)?;
    let (n, e) = (provider.key_utils.rsa_pub_components_from_public_key)(der).map_err(|_| not_rsa())?;
    Ok(DecodingKey::from_rsa_raw_components(&n, &e))
}

/// ES256: a PEM P-256 public key (SPKI `PUBLIC KEY`).
pub(super) fn ec_key(pem: Option<&[u8]>) -> Result<DecodingKey, KeyProblem> {
    let pem = pem_text(pem, "ES256")?;
    let not_ec = || key_file_problem("is not a PEM P-256 public key (needed for ES256)");
    let key = DecodingKey::from_ec_pem(pem).map_err(|_| not_ec())?;
    // Building a verifier decodes the curve point: a key that is not on P-256 fails here, once.
    let provider = CryptoProvider::try_get_default().ok_or_else(not_ec)?;
    (provider.verifier_factory)(&Algorithm::ES256, &key).map_err(|_| not_ec())?;
    Ok(key)
}
