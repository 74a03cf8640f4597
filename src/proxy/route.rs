//! Which room a request belongs to (contract section 17): the room under whose prefix its path
//! is, or whose protected rules it matches, among the rooms for its Host. The configuration
//! refuses rooms that could both claim one request, so the first room that claims it is the
//! only one.

use std::sync::Arc;

use pingora::http::RequestHeader;

use super::Endpoint;
use crate::paths::PathRefusal;
use crate::room::{Room, Rooms};

/// What a request is: its room (none for a pass-through), its endpoint there, and its target
/// as forwarded when canonicalizing changed it.
pub struct Routed {
    pub room: Option<Arc<Room>>,
    pub found: Result<(Endpoint, Option<Vec<u8>>), PathRefusal>,
}

pub fn route(rooms: &Rooms, header: &RequestHeader) -> Routed {
    let all = rooms.all();
    let host = request_host(header);
    for room in all.iter() {
        if room.host().is_some_and(|wanted| Some(wanted) != host.as_deref()) {
            continue;
        }
        let settings = room.settings();
        match Endpoint::classify(&settings.config, header) {
            Ok((Endpoint::Passthrough, _)) => continue,
            found => return Routed { room: Some(room.clone()), found },
        }
    }
    Routed { room: None, found: Ok((Endpoint::Passthrough, None)) }
}

/// The request's host as rooms name theirs: the Host header (or an absolute target's
/// authority), lowercase, without its port.
pub fn request_host(header: &RequestHeader) -> Option<String> {
    let raw = match header.headers.get(http::header::HOST) {
        Some(value) => value.to_str().ok()?,
        None => header.uri.authority()?.as_str(),
    };
    let name = match raw.rsplit_once(':') {
        // An IPv6 literal's colons are inside its brackets.
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => name,
        _ => raw,
    };
    Some(name.trim().to_ascii_lowercase())
}
