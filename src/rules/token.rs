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
    /// The order went through (or may have): the token is spent.
    Consume,
    /// The order failed (or never reached the backend): the user may retry with the same token.
    Keep,
}

/// How a protected request's exchange with the upstream ended, as far as its token is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream's status line came back: it decides, whatever happens to the exchange after.
    Answered(u16),
    /// The request reached the upstream, whole or in part, and no status line came back (a
    /// timeout, a reset, a closed connection): the upstream may have placed the order.
    Unknown,
    /// The request never reached the upstream (refused, or failed before it was sent).
    NotSent,
}

/// What the room's settings say of the outcomes that are not a plain 2xx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpendTerms {
    /// `token.spend_on_redirect`: a 3xx is a placed order (POST, then 303 See Other).
    pub on_redirect: bool,
    /// `token.unknown_outcome: spend`: an unknown outcome is taken for a placed order.
    pub on_unknown: bool,
}

/// A 2xx spends a token, and so do a 3xx and an unknown outcome when the terms say so; anything
/// else leaves the user free to retry until it expires.
pub fn token_fate(outcome: Outcome, terms: SpendTerms) -> TokenFate {
    let spends = match outcome {
        Outcome::Answered(status) => (200..300).contains(&status) || (terms.on_redirect && (300..400).contains(&status)),
        Outcome::Unknown => terms.on_unknown,
        Outcome::NotSent => false,
    };
    if spends {
        TokenFate::Consume
    } else {
        TokenFate::Keep
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
    fn the_status_line_decides_and_the_terms_say_the_rest() {
        use Outcome::*;
        let plain = SpendTerms { on_redirect: false, on_unknown: false };
        for status in [200, 201, 299] {
            assert_eq!(token_fate(Answered(status), plain), TokenFate::Consume, "{status}");
        }
        for status in [100, 302, 303, 409, 500] {
            assert_eq!(token_fate(Answered(status), plain), TokenFate::Keep, "{status}");
        }
        assert_eq!(token_fate(Unknown, plain), TokenFate::Keep);
        assert_eq!(token_fate(NotSent, plain), TokenFate::Keep);

        let redirects = SpendTerms { on_redirect: true, on_unknown: false };
        for status in [300, 303, 307, 399] {
            assert_eq!(token_fate(Answered(status), redirects), TokenFate::Consume, "{status}");
        }
        assert_eq!(token_fate(Answered(400), redirects), TokenFate::Keep);

        let unknown = SpendTerms { on_redirect: false, on_unknown: true };
        assert_eq!(token_fate(Unknown, unknown), TokenFate::Consume);
        // Nothing was sent: nothing can have been placed, whatever the terms.
        assert_eq!(token_fate(NotSent, unknown), TokenFate::Keep);
        assert_eq!(token_fate(Answered(502), unknown), TokenFate::Keep);
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
