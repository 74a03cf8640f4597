//! Who sent a request, as far as the per-address identity limit needs to know: both ways into
//! the line (a plain enter and an event's enter) count the same address.

use std::net::IpAddr;

use http::HeaderMap;
use pingora::proxy::Session;

use crate::config::Config;
use crate::rules;

/// Who sent an enter, as far as the per-address identity limit needs to know.
pub struct Sender<'a> {
    /// The connection's peer; `None` when the limit is off (nobody asks) or it is unknown.
    pub peer: Option<IpAddr>,
    pub headers: &'a HeaderMap,
}

impl Sender<'_> {
    pub fn of<'s>(config: &Config, session: &'s Session) -> Sender<'s> {
        let peer = (config.abuse.identities_per_address > 0)
            .then(|| session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip()))
            .flatten();
        Sender { peer, headers: &session.req_header().headers }
    }
}

/// The address the per-address identity limit counts (see [`rules::client_address`]).
pub fn client_address(config: &Config, sender: &Sender<'_>) -> String {
    let Some(peer) = sender.peer else { return "unknown".to_string() };
    let forwarded = crate::paths::forwarded_for(sender.headers);
    rules::client_address(peer, forwarded.as_deref(), &config.abuse.trusted_proxies).to_string()
}
