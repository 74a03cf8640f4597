//! Logs go to stderr through `tracing`: human-readable by default, one JSON object a line with
//! `WAITROOM_LOG_FORMAT=json`, filtered by `RUST_LOG` (default `info`). pingora logs through the
//! `log` crate; the bridge puts its lines in the same stream.
//!
//! Access lines use the target `waitroom::access`; `RUST_LOG=info,waitroom::access=off` silences
//! them. Entry tokens are never logged: pingora's debug and trace lines dump whole request
//! headers (the token header included, which must travel upstream), so pingora's targets are
//! capped at INFO whatever `RUST_LOG` says.

use tracing::Level;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// False for pingora's debug and trace events, which print request headers verbatim.
fn not_pingora_debug(meta: &tracing::Metadata<'_>) -> bool {
    !(meta.target().starts_with("pingora") && *meta.level() > Level::INFO)
}

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("WAITROOM_LOG_FORMAT").map(|v| v == "json").unwrap_or(false);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let cap = filter_fn(not_pingora_debug);
    // With tracing-subscriber's `tracing-log` feature, `try_init` also installs the `log`
    // bridge; a second subscriber (tests that call init twice) is simply refused.
    let _ = if json {
        builder.json().flatten_event(true).finish().with(cap).try_init()
    } else {
        builder.with_ansi(false).finish().with(cap).try_init()
    };
}
