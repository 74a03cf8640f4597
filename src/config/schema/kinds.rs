//! What each text field of the raw configuration holds (a duration, a size, a time...), as the
//! schema says it: the raw structs name these in `#[schemars(with = ...)]`, so they sit below both
//! the raw structs and the schema built from them.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

/// What `humantime::parse_duration` (which reads every duration, trimmed) accepts: numbers,
/// fractions allowed, each with a unit, whitespace anywhere between; and a bare `0`, the one
/// number it takes without a unit.
pub(super) const DURATION_PATTERN: &str = concat!(
    r"^\s*(0\s*|([0-9][0-9\s]*(\.[0-9\s]*[0-9][0-9\s]*)?\s*",
    r"(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m",
    r"|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)\s*)+)$",
);

/// What [`crate::config::parse_size`] accepts.
pub(super) const SIZE_PATTERN: &str = r"^\s*[0-9]+\s*(B|KiB|MiB)\s*$";

/// What `polling.grace` accepts: a number (as Rust's `f64` reads it) and a percent sign.
pub(super) const PERCENT_PATTERN: &str = r"^\s*[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*%\s*$";

/// What chrono's RFC 3339 reader accepts (event times).
pub(super) const TIME_PATTERN: &str = concat!(
    r"^\s*[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?",
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})\s*$",
);

/// A text kind: a unit struct whose schema is inlined wherever a field names it.
macro_rules! text_kind {
    ($(#[$doc:meta])* $name:ident => $schema:tt) => {
        $(#[$doc])*
        pub struct $name;

        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($schema)
            }
        }
    };
}

text_kind! {
    /// A duration written with a unit: `100ms`, `2s`, `5m`, `1h`, `1h 30m`.
    Duration => { "type": "string", "pattern": DURATION_PATTERN, "examples": ["100ms", "2s", "5m", "1h"] }
}

text_kind! {
    /// A size in bytes with an unambiguous unit: `512B`, `32KiB`, `1MiB`.
    Size => { "type": "string", "pattern": SIZE_PATTERN, "examples": ["32KiB"] }
}

text_kind! {
    /// A percentage: `20%`.
    Percent => { "type": "string", "pattern": PERCENT_PATTERN, "examples": ["20%"] }
}

text_kind! {
    /// An RFC 3339 time: `2026-12-24T10:00:00Z`.
    Time => { "type": "string", "pattern": TIME_PATTERN, "examples": ["2026-12-24T10:00:00Z"] }
}

// A pattern, not an enum: the proxy trims the name, and the schema must not refuse what the proxy
// takes.
text_kind! {
    /// A JWT signature algorithm (`identity.jwt.algorithms`).
    Algorithm => { "type": "string", "pattern": r"^\s*(HS256|RS256|ES256)\s*$", "examples": ["HS256", "RS256", "ES256"] }
}

text_kind! {
    /// How a protected path matches (`protected[].match`).
    Match => { "type": "string", "enum": ["exact", "prefix"] }
}
