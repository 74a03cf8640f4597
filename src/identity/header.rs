//! The identity rules (contract section 3) that every user name meets, whichever mode found it,
//! and reading one cookie out of a request's headers. Both modes need them and neither owns them,
//! so they sit below both: the JWT verifier checks its claim with the same rules the trusted
//! header is checked with.

use http::HeaderMap;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
