//! Which room a request belongs to (contract section 17): the room under whose prefix its path
//! is, or whose protected rules it matches, among the rooms for its Host. The configuration
//! refuses rooms that could both claim one request, so the first room that claims it is the
//! only one.

use std::cell::OnceCell;
use std::sync::Arc;

use pingora::http::RequestHeader;

use super::Endpoint;
use crate::paths::{self, PathRefusal};
use crate::room::{Room, Rooms};

/// What a request is: its room (none for a pass-through), its endpoint there, and its target
/// as forwarded when canonicalizing changed it.
pub struct Routed {
    pub room: Option<Arc<Room>>,
    pub found: Result<(Endpoint, Option<Vec<u8>>), PathRefusal>,
}

pub fn route(rooms: &Rooms, header: &RequestHeader) -> Routed {
    let routes = rooms.routes();
    // Read only when some room names a host: most configurations have none.
    let host = routes.iter().any(|route| route.host.is_some()).then(|| request_host(header)).flatten();
    // The target, read by the first room that needs it and judged by each room's rules after.
    let target = OnceCell::new();
    let target = || target.get_or_init(|| paths::Target::read(header.raw_path()));
    let methods = paths::Methods::of(&header.method, &header.headers);
    let path = header.uri.path();
    // Whether some room read the target: then it is readable, for every room alike.
    let mut read = false;
    for route in routes.iter() {
        if route.host.as_deref().is_some_and(|wanted| !host.is_some_and(|host| host.eq_ignore_ascii_case(wanted))) {
            continue;
        }
        let config = &route.settings.config;
        // The cheap look that spares every other room the reading of the target, and every
        // room the look of its rules at the one reading: the path under the room's prefix, or
        // the request's method one of the room's protected rules'.
        // The prefix is a whole string: what follows it in the path starts on a char boundary.
        let below = paths::after_prefix(path.as_bytes(), config.endpoints.prefix.as_bytes())
            .map(|rest| &path[path.len() - rest.len()..]);
        if below.is_none() && !config.protected.iter().any(|rule| methods.include(rule.method())) {
            continue;
        }
        if let Some(endpoint) = below.and_then(|rest| Endpoint::own_below(config, &header.method, rest)) {
            return Routed { room: Some(route.room.clone()), found: Ok((endpoint, None)) };
        }
        match Endpoint::by_rules(config, &methods, target()) {
            Ok((Endpoint::Passthrough, _)) => read = true,
            found => return Routed { room: Some(route.room.clone()), found },
        }
    }
    // No room claims it. A target that cannot be read is still refused, as one room refuses it:
    // the reading does not depend on the room, so the first room's is asked.
    let refused = if read { None } else { routes.first().and_then(|route| Endpoint::classify(&route.settings.config, header).err()) };
    Routed { room: None, found: refused.map_or(Ok((Endpoint::Passthrough, None)), Err) }
}

/// The request's host as rooms name theirs: the Host header (or an absolute target's
/// authority), without its port; rooms compare it case-insensitively.
pub fn request_host(header: &RequestHeader) -> Option<&str> {
    let raw = match header.headers.get(http::header::HOST) {
        Some(value) => value.to_str().ok()?,
        None => header.uri.authority()?.as_str(),
    };
    let name = match raw.rsplit_once(':') {
        // An IPv6 literal's colons are inside its brackets.
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => name,
        _ => raw,
    };
    Some(name.trim())
}
