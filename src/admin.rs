//! The admin API on `metrics_listen`, or on `admin.listen` (contract sections 15 and 17): look at
//! a room, pause, resume, close and open it; `/admin/room` is the room `default` or the only room,
//! `/admin/rooms/NAME` any room, `/admin/rooms` all of them. Parse (enabled? bearer token, path, method) -> apply
//! ([`crate::services::control::apply`]) -> render (the room's JSON, or `{"error": ...}`).
//!
//! It sits on an operator listener, not on `listen`, so the public side never routes to it, and
//! with `admin.listen` not even on the port opened to Prometheus and health probes;
//! the bearer token is the second fence, for operator networks that are wider than one team. The
//! token is compared in constant time ([`subtle`]), so a timing probe learns nothing of it but
//! its length. Every answer is JSON with `Cache-Control: no-store`, like the proxy's own.

use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;
use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::services::control::{self, Actor, Command, View};
use crate::process::Process;
use crate::store::Redis;

/// Where the admin API lives: everything under it is answered here, never by the metrics side.
pub const PREFIX: &str = "/admin";

/// `GET /admin/room`'s body: exactly the contract's keys, in its order; in `/admin/rooms`' list
/// each room's also names it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RoomBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    state: &'static str,
    queue_length: u64,
    batch: u32,
    active_tokens: u64,
    admitted_last_minute: u64,
    event: Option<&'a str>,
    mode: &'static str,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

/// The body the admin API and the command-line client agree on.
pub fn room_body(view: &View) -> Vec<u8> {
    // Plain numbers and strings: serialising cannot fail.
    serde_json::to_vec(&body_of(None, view)).unwrap_or_default()
}

fn body_of<'a>(name: Option<&'a str>, view: &'a View) -> RoomBody<'a> {
    RoomBody {
        name,
        state: view.mode.as_str(),
        queue_length: view.queue_length,
        batch: view.batch,
        active_tokens: view.active_tokens,
        admitted_last_minute: view.admitted_last_minute,
        event: view.event.as_deref(),
        mode: match view.run_mode {
            crate::config::RoomMode::Active => "active",
            crate::config::RoomMode::Shadow => "shadow",
        },
    }
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CONTENT_LENGTH, body.len())
        .header(http::header::CACHE_CONTROL, "no-store")
        .body(body)
        .unwrap_or_default()
}

fn error(status: StatusCode, message: &str) -> Response<Vec<u8>> {
    json(status, serde_json::to_vec(&ErrorBody { error: message }).unwrap_or_default())
}

/// What a request under [`PREFIX`] asks for, once it is let in.
#[derive(Debug, PartialEq, Eq)]
enum Route<'p> {
    /// `/admin/room` (the room `default` or the only one) or `/admin/rooms/NAME`: GET only.
    Room(Option<&'p str>),
    /// `.../{pause,resume,close,open}` under either: POST only.
    Command(Option<&'p str>, Command),
    /// `/admin/rooms`: GET only.
    Rooms,
    Unknown,
}

fn route(path: &str) -> Route<'_> {
    let command = |name, rest: &str| rest.strip_prefix('/').and_then(Command::parse).map_or(Route::Unknown, |c| Route::Command(name, c));
    if let Some(rest) = path.strip_prefix("/admin/rooms") {
        return match rest.strip_prefix('/') {
            None if rest.is_empty() => Route::Rooms,
            None => Route::Unknown,
            Some(named) => match named.split_once('/') {
                None if !named.is_empty() => Route::Room(Some(named)),
                Some((name, cmd)) if !name.is_empty() => command(Some(name), &format!("/{cmd}")),
                _ => Route::Unknown,
            },
        };
    }
    match path.strip_prefix("/admin/room") {
        Some("") => Route::Room(None),
        Some(rest) => command(None, rest),
        None => Route::Unknown,
    }
}

/// Whether `Authorization` carries `Bearer <token>` for this token. The scheme is
/// case-insensitive (RFC 9110); the token is compared in constant time.
fn authorized(header: Option<&http::HeaderValue>, token: &[u8]) -> bool {
    let Some(value) = header.map(http::HeaderValue::as_bytes) else { return false };
    let Some((scheme, presented)) = value.split_first_chunk::<7>() else { return false };
    if !scheme.eq_ignore_ascii_case(b"Bearer ") {
        return false;
    }
    bool::from(presented.trim_ascii().ct_eq(token))
}

/// Answers a request under [`PREFIX`]. Disabled: 404, as if there were no such path. Then the
/// token (401 for anything without it, so nothing is learned about the API without it), then
/// the path (404) and the method (405 with `Allow`).
pub async fn serve(process: &Process, redis: &Redis, session: &ServerSession) -> Response<Vec<u8>> {
    let request = session.req_header();
    let token = process.settings().config.admin.token.clone();
    let Some(token) = token else {
        return error(StatusCode::NOT_FOUND, "not found");
    };
    if !authorized(request.headers.get(http::header::AUTHORIZATION), token.expose()) {
        let mut answer = error(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
        answer.headers_mut().insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
        return answer;
    }
    let (name, command, allow) = match route(request.uri.path()) {
        Route::Unknown => return error(StatusCode::NOT_FOUND, "not found"),
        Route::Room(name) => (name, None, "GET"),
        Route::Command(name, command) => (name, Some(command), "POST"),
        Route::Rooms => (None, None, "GET"),
    };
    if request.method.as_str() != allow {
        let mut answer = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        answer.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
        return answer;
    }
    if route(request.uri.path()) == Route::Rooms {
        return all_rooms(process, redis).await;
    }
    let room = match name {
        None => process.rooms().default_or_only(),
        Some(name) => process.rooms().get(name),
    };
    let Some(room) = room else {
        return match name {
            Some(name) => error(StatusCode::NOT_FOUND, &format!("no room {name}")),
            None => error(StatusCode::NOT_FOUND, "no room default: name one under /admin/rooms"),
        };
    };
    let who = session.client_addr().map_or_else(|| "admin API".to_owned(), |a| format!("admin API from {a}"));
    match control::apply(&room, &redis.room(room.keys().clone()), command, Actor::Admin, &who).await {
        Ok(applied) => match applied.refused {
            None => json(StatusCode::OK, room_body(&applied.view)),
            Some(reason) => error(StatusCode::CONFLICT, &reason),
        },
        Err(e) => {
            crate::metrics::REDIS_ERRORS_TOTAL.inc();
            tracing::warn!(error = %e, "admin: redis unavailable");
            error(StatusCode::SERVICE_UNAVAILABLE, "redis is unavailable; the room was not changed")
        }
    }
}

/// `GET /admin/rooms`: every room's body, with its name, in configuration order.
async fn all_rooms(process: &Process, redis: &Redis) -> Response<Vec<u8>> {
    let rooms = process.rooms().all();
    let mut views = Vec::with_capacity(rooms.len());
    for room in rooms.iter() {
        match control::apply(room, &redis.room(room.keys().clone()), None, Actor::Admin, "admin API").await {
            Ok(applied) => views.push((room.name(), applied.view)),
            Err(e) => {
                crate::metrics::REDIS_ERRORS_TOTAL.inc();
                tracing::warn!(error = %e, "admin: redis unavailable");
                return error(StatusCode::SERVICE_UNAVAILABLE, "redis is unavailable");
            }
        }
    }
    #[derive(Serialize)]
    struct Rooms<'a> {
        rooms: Vec<RoomBody<'a>>,
    }
    let body = Rooms { rooms: views.iter().map(|(name, view)| body_of(Some(name), view)).collect() };
    json(StatusCode::OK, serde_json::to_vec(&body).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> http::HeaderValue {
        http::HeaderValue::from_str(text).unwrap()
    }

    #[test]
    fn only_the_exact_bearer_token_is_let_in() {
        let token = b"s3cret";
        assert!(authorized(Some(&value("Bearer s3cret")), token));
        assert!(authorized(Some(&value("bearer s3cret")), token));
        assert!(!authorized(Some(&value("Bearer s3cre")), token));
        assert!(!authorized(Some(&value("Bearer s3crett")), token));
        assert!(!authorized(Some(&value("Basic s3cret")), token));
        assert!(!authorized(Some(&value("s3cret")), token));
        assert!(!authorized(Some(&value("Bearer ")), token));
        assert!(!authorized(None, token));
    }

    #[test]
    fn paths_name_the_room_or_one_command() {
        assert_eq!(route("/admin/room"), Route::Room(None));
        assert_eq!(route("/admin/room/close"), Route::Command(None, Command::Close));
        assert_eq!(route("/admin/rooms"), Route::Rooms);
        assert_eq!(route("/admin/rooms/sneakers"), Route::Room(Some("sneakers")));
        assert_eq!(route("/admin/rooms/sneakers/pause"), Route::Command(Some("sneakers"), Command::Pause));
        assert_eq!(route("/admin/rooms/"), Route::Unknown);
        assert_eq!(route("/admin/rooms//pause"), Route::Unknown);
        assert_eq!(route("/admin/rooms/sneakers/shutdown"), Route::Unknown);
        assert_eq!(route("/admin/roomsy"), Route::Unknown);
        assert_eq!(route("/admin/room/"), Route::Unknown);
        assert_eq!(route("/admin/room/shutdown"), Route::Unknown);
        assert_eq!(route("/admin/roomy"), Route::Unknown);
        assert_eq!(route("/admin"), Route::Unknown);
    }

    #[test]
    fn the_room_body_has_exactly_the_contract_keys() {
        let view = View {
            mode: control::Mode::Paused,
            queue_length: 12,
            batch: 10,
            active_tokens: 3,
            admitted_last_minute: 600,
            event: None,
            run_mode: crate::config::RoomMode::Shadow,
        };
        assert_eq!(
            String::from_utf8(room_body(&view)).unwrap(),
            r#"{"state":"paused","queueLength":12,"batch":10,"activeTokens":3,"admittedLastMinute":600,"event":null,"mode":"shadow"}"#
        );
    }
}
