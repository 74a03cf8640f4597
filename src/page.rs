//! The waiting page served at `GET {prefix}/` (section 10 of the contract): one self-contained
//! HTML document compiled into the binary, filled in with the room's settings per request.

use crate::config::Config;

const TEMPLATE: &str = include_str!("../assets/waiting.html");

/// Renders the page for this configuration.
pub fn render(config: &Config, _accept_language: Option<&[u8]>) -> Vec<u8> {
    let settings = serde_json::json!({
        "prefix": config.endpoints.prefix,
        "readyUrl": config.page.ready_url,
    });
    TEMPLATE.replace("__WAITROOM_SETTINGS__", &settings.to_string()).into_bytes()
}
