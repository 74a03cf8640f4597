//! The entry-token header comparison: `token_matches` is byte equality (whatever the lengths or
//! contents), and a token survives the trip through an HTTP header value unchanged.

#![no_main]

use http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use waitroom::rules::token_matches;

fuzz_target!(|data: &[u8]| {
    let cut = data.first().map_or(0, |b| *b as usize % data.len().max(1));
    let (a, b) = data.split_at(cut);
    assert_eq!(token_matches(a, b), a == b);
    assert!(token_matches(b, b));
    if let Ok(v) = HeaderValue::from_bytes(b) {
        assert!(token_matches(v.as_bytes(), b));
        assert_eq!(token_matches(v.as_bytes(), a), a == b);
    }
});
