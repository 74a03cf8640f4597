//! Logs go to stderr through `tracing`: human-readable by default, one JSON object a line with
//! `WAITROOM_LOG_FORMAT=json`, filtered by `RUST_LOG` (default `info`). pingora logs through the
//! `log` crate; the bridge puts its lines in the same stream.
//!
//! Access lines use the target `waitroom::access`; `RUST_LOG=info,waitroom::access=off` silences
//! them. Entry tokens are never logged.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("WAITROOM_LOG_FORMAT").map(|v| v == "json").unwrap_or(false);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.with_ansi(false).try_init()
    };
    // With tracing-subscriber's `tracing-log` feature, `try_init` also installs the `log`
    // bridge; a second subscriber (tests that call init twice) is simply refused.
    drop(installed);
}
