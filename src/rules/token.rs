//! A protected request's entry token: what the upstream's answer means for it, and how its
//! remaining life is told (it is compared, hashed, inside `lua/claim.lua`).

/// What is left of a token's life in whole seconds, rounded up, at least 1. Not capped by the
/// configured ttl: a token issued before a reload shortened it keeps its own, longer life.
pub fn expires_in_secs(remaining_ms: u64) -> u64 {
    remaining_ms.div_ceil(1000).max(1)
}

/// What a protected request's upstream outcome means for the token it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFate {
    /// The order went through: the token is spent.
    Consume,
    /// The order failed (or never reached the backend): the user may retry with the same token.
    Keep,
}

/// Only a 2xx spends a token; anything else leaves the user free to retry until it expires.
pub fn token_fate(upstream_status: Option<u16>) -> TokenFate {
    match upstream_status {
        Some(s) if (200..300).contains(&s) => TokenFate::Consume,
        _ => TokenFate::Keep,
    }
}

/// The label `waitroom_upstream_responses_total` puts on an upstream outcome.
pub fn status_class(upstream_status: Option<u16>) -> &'static str {
    match upstream_status {
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expires_in_rounds_up_and_is_at_least_one() {
        assert_eq!(expires_in_secs(300_000), 300);
        assert_eq!(expires_in_secs(299_001), 300);
        assert_eq!(expires_in_secs(299_000), 299);
        assert_eq!(expires_in_secs(1), 1);
        assert_eq!(expires_in_secs(0), 1);
        // A token issued under a longer ttl before a reload reports its own remaining life.
        assert_eq!(expires_in_secs(900_000), 900);
    }


    #[test]
    fn only_2xx_spends_a_token() {
        assert_eq!(token_fate(Some(200)), TokenFate::Consume);
        assert_eq!(token_fate(Some(201)), TokenFate::Consume);
        assert_eq!(token_fate(Some(299)), TokenFate::Consume);
        assert_eq!(token_fate(Some(302)), TokenFate::Keep);
        assert_eq!(token_fate(Some(409)), TokenFate::Keep);
        assert_eq!(token_fate(Some(500)), TokenFate::Keep);
        assert_eq!(token_fate(None), TokenFate::Keep);
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(Some(201)), "2xx");
        assert_eq!(status_class(Some(304)), "3xx");
        assert_eq!(status_class(Some(404)), "4xx");
        assert_eq!(status_class(Some(503)), "5xx");
        assert_eq!(status_class(None), "error");
    }
}
