//! The identity front: the authentication layer waitroom expects in front of it, for a developer's
//! machine only.
//!
//! waitroom authenticates nobody (contract section 3): in trusted-header mode the layer in front
//! names the user in `identity.header` on every request. A browser opened straight on the proxy
//! has no such layer, so the waiting page's enter gets 401 and the page can only ask the visitor
//! to sign in. This front stands in for that layer: it gives each browser a random user id in a
//! cookie, and forwards every request to the proxy with the identity header set to it, replacing
//! whatever the client sent, as a real authentication layer must.
//!
//! Why a separate program and not a setting of the proxy: a switch that makes the proxy invent
//! identities would be one configuration mistake away from letting anyone skip the line in
//! production; a tool of the `tools/` package cannot ship in the proxy at all. For the same
//! reason it listens on loopback only ([`check_listen`]): it names anyone who connects.
//!
//! Plain hyper, like the demo order API: it must not share code paths with the proxy it fronts.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE, COOKIE, HOST, SET_COOKIE};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::service::accept_forever;

/// The cookie that carries a browser's user id.
pub const COOKIE_NAME: &str = "waitroom_dev_user";

/// Headers that describe one connection, not the request (RFC 9110 section 7.6.1): a proxy must
/// not pass them on. `Connection` may name more; [`strip_hop_by_hop`] drops those too.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// What the front needs to know about the proxy behind it.
#[derive(Clone, Debug)]
pub struct FrontSettings {
    /// The proxy's `listen` address, `host:port`.
    pub proxy: String,
    /// The proxy's `identity.header`.
    pub header: HeaderName,
}

/// Why the front refuses to start.
#[derive(Debug, PartialEq, Eq)]
pub struct NotLoopback(pub SocketAddr);

impl std::fmt::Display for NotLoopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--listen {}: not a loopback address. The identity front names anyone who connects as \
             a new user, so it serves this machine only (127.0.0.1 or ::1)",
            self.0
        )
    }
}

/// Only a loopback address may be listened on: from anywhere else, the front would hand every
/// visitor an identity of their choosing (clear the cookie, get another place in line).
pub fn check_listen(addr: SocketAddr) -> Result<(), NotLoopback> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(NotLoopback(addr))
    }
}

/// A user id the front handed out earlier: ours have this shape, and anything else in the cookie
/// (edited by hand, left by something else) is replaced rather than forwarded, so the proxy never
/// sees an identity it would refuse with 400.
pub fn valid_user_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// `browser-` and 32 random hex digits: unguessable, so two browsers never share a place.
pub fn new_user_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("browser-{hex}"))
}

/// The user id in the request's cookies, when it is one of ours.
pub fn user_from_cookies(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|id| valid_user_id(id))
}

/// Removes the hop-by-hop headers and those `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

struct Front {
    settings: FrontSettings,
    client: Client<HttpConnector, Incoming>,
}

/// Serves on `listener` until the process ends.
pub async fn serve(listener: TcpListener, settings: FrontSettings) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector);
    let front = Arc::new(Front { settings, client });
    accept_forever(listener, front, serve_connection, accept_failed).await;
}

/// A failed accept is logged here, not in the loop, so that the line names this module.
fn accept_failed(e: &std::io::Error) {
    warn!(error = %e, "accept failed");
}

async fn serve_connection(front: Arc<Front>, stream: TcpStream, peer: SocketAddr) {
    let service = service_fn(move |req| {
        let front = Arc::clone(&front);
        async move { Ok::<_, Infallible>(forward(&front, req).await) }
    });
    if let Err(e) = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// One request: name its user, hand it to the proxy, hand the answer back (with the cookie when
/// the user is new).
async fn forward(front: &Front, req: Request<Incoming>) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let (user, new_user) = match user_from_cookies(&parts.headers) {
        Some(user) => (user, false),
        None => match new_user_id() {
            Ok(user) => (user, true),
            Err(e) => {
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("no randomness: {e}"),
                )
            }
        },
    };
    let target = format!(
        "http://{}{}",
        front.settings.proxy,
        parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
    );
    parts.uri = match target.parse::<Uri>() {
        Ok(uri) => uri,
        Err(e) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("cannot forward {target}: {e}"),
            )
        }
    };
    strip_hop_by_hop(&mut parts.headers);
    // The client's Host names this front; the proxy passes it to the shop's backend as it came.
    if !parts.headers.contains_key(HOST) {
        if let Ok(host) = HeaderValue::from_str(&front.settings.proxy) {
            parts.headers.insert(HOST, host);
        }
    }
    // `insert` replaces every value the client sent: the user is who the cookie says, never
    // whoever the client claims to be.
    let id = HeaderValue::from_str(&user).expect("valid_user_id admits header-safe bytes only");
    parts.headers.insert(front.settings.header.clone(), id);

    let mut res = match front.client.request(Request::from_parts(parts, body)).await {
        Ok(res) => res.map(BodyExt::boxed),
        Err(e) => {
            return plain(
                StatusCode::BAD_GATEWAY,
                format!("waitroom at {} did not answer: {e}", front.settings.proxy),
            )
        }
    };
    strip_hop_by_hop(res.headers_mut());
    if new_user {
        info!(%user, "a new browser");
        let cookie = format!("{COOKIE_NAME}={user}; Path=/; HttpOnly; SameSite=Lax");
        let cookie = HeaderValue::from_str(&cookie).expect("the cookie is header-safe");
        res.headers_mut().append(SET_COOKIE, cookie);
    }
    res
}

/// An answer of the front's own, in plain text, so it is never mistaken for the proxy's JSON.
fn plain(status: StatusCode, message: String) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from(format!("identity-front: {message}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_is_listened_on() {
        for ok in ["127.0.0.1:8090", "127.1.2.3:0", "[::1]:8090"] {
            assert_eq!(check_listen(ok.parse().unwrap()), Ok(()), "{ok}");
        }
        for refused in [
            "0.0.0.0:8090",
            "[::]:8090",
            "192.168.1.5:8090",
            "10.0.0.1:80",
        ] {
            let addr: SocketAddr = refused.parse().unwrap();
            assert_eq!(check_listen(addr), Err(NotLoopback(addr)), "{refused}");
        }
    }

    #[test]
    fn new_ids_are_valid_and_differ() {
        let a = new_user_id().unwrap();
        let b = new_user_id().unwrap();
        assert!(valid_user_id(&a) && valid_user_id(&b), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a.len(), "browser-".len() + 32);
    }

    #[test]
    fn the_cookie_names_the_user_only_when_it_is_ours() {
        let with = |cookie: &str| {
            let mut headers = HeaderMap::new();
            headers.append(COOKIE, HeaderValue::from_str(cookie).unwrap());
            user_from_cookies(&headers)
        };
        assert_eq!(
            with("waitroom_dev_user=browser-ab12"),
            Some("browser-ab12".into())
        );
        assert_eq!(
            with("a=1; waitroom_dev_user=alice ; b=2"),
            Some("alice".into())
        );
        assert_eq!(with("other_waitroom_dev_user=x"), None);
        assert_eq!(with("waitroom_dev_user="), None, "empty");
        assert_eq!(with("waitroom_dev_user=a b"), None, "a space");
        assert_eq!(
            with(&format!("waitroom_dev_user={}", "x".repeat(65))),
            None,
            "too long"
        );
        assert_eq!(user_from_cookies(&HeaderMap::new()), None);
    }

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("upgrade", "h2c"),
            ("x-user-id", "kept-for-the-caller-to-replace"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-user-id"]);
    }
}
