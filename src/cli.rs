//! `waitroom room status|pause|resume|close|open --config proxy.yaml`: the admin API of a running
//! proxy from a terminal. The address is the configuration's `admin.listen` (else its
//! `metrics_listen`) and the token the
//! variable `admin.token_env` names, so an operator who can start the proxy can steer it without
//! copying either by hand.
//!
//! A plain HTTP/1.1 request over a `TcpStream`: one request, `Connection: close`, a JSON body
//! back. Not worth an HTTP client crate in the proxy's binary.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::config::Config;

/// How long the client waits to connect, and for each read and write.
const TIMEOUT: Duration = Duration::from_secs(5);

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Status,
    Pause,
    Resume,
    Close,
    Open,
}

impl Action {
    fn request(self) -> (&'static str, &'static str) {
        match self {
            Action::Status => ("GET", "/admin/room"),
            Action::Pause => ("POST", "/admin/room/pause"),
            Action::Resume => ("POST", "/admin/room/resume"),
            Action::Close => ("POST", "/admin/room/close"),
            Action::Open => ("POST", "/admin/room/open"),
        }
    }

    fn done(self) -> Option<&'static str> {
        match self {
            Action::Status => None,
            Action::Pause => Some("paused: admission stopped, the line keeps its places"),
            Action::Resume => Some("resumed: admission runs"),
            Action::Close => Some("closed: nobody new gets in, waiting users hear CLOSED"),
            Action::Open => Some("opened"),
        }
    }
}

/// Why the command did not work, said so that the operator knows what to do next.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("the admin API is not enabled in {0}: set admin.token_env to the name of an environment variable holding a token")]
    NotConfigured(String),
    #[error("cannot reach the admin API at {addr}: {source} (is the proxy running, and is this its configuration?)")]
    Unreachable { addr: SocketAddr, source: std::io::Error },
    #[error("the proxy at {0} refused the token (401): {1} must hold the same token as the proxy's environment")]
    Unauthorized(SocketAddr, String),
    #[error("the proxy at {0} has no admin API (404): it runs without admin.token_env (restart it with the key set)")]
    NotEnabled(SocketAddr),
    #[error("refused ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("unexpected answer from {addr}: {what}")]
    Garbled { addr: SocketAddr, what: String },
}

/// Where to reach the admin API: `admin.listen` or else `metrics_listen`, or loopback when it
/// listens on every address.
pub fn admin_addr(config: &Config) -> SocketAddr {
    let mut addr = config.admin.listen.unwrap_or(config.metrics_listen);
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    addr
}

/// Runs `action` against the proxy `config` describes; returns what to print.
/// `room` names one of the proxy's rooms (section 17); `None`: the room `default`, or the only one.
pub fn run(config: &Config, config_path: &str, action: Action, room: Option<&str>) -> Result<String, CliError> {
    let admin = &config.admin;
    let (Some(token), Some(env)) = (admin.token.as_ref(), admin.token_env.as_deref()) else {
        return Err(CliError::NotConfigured(config_path.to_owned()));
    };
    let addr = admin_addr(config);
    let (method, path) = action.request();
    let path = match room {
        None => path.to_owned(),
        Some(name) => path.replacen("/admin/room", &format!("/admin/rooms/{name}"), 1),
    };
    let (status, body) = send(addr, method, &path, token.expose())?;
    let message = || {
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned())
    };
    match status {
        200 => {}
        401 => return Err(CliError::Unauthorized(addr, env.to_owned())),
        404 if message() != "not found" => return Err(CliError::Refused { status: 404, message: message() }),
        404 => return Err(CliError::NotEnabled(addr)),
        status => return Err(CliError::Refused { status, message: message() }),
    }
    let room: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| CliError::Garbled { addr, what: format!("not JSON ({e})") })?;
    let mut out = String::new();
    if let Some(done) = action.done() {
        out.push_str(&format!("room {done}\n\n"));
    }
    out.push_str(&describe(&room, config).map_err(|what| CliError::Garbled { addr, what })?);
    Ok(out)
}

/// The room, one fact a line, aligned.
pub fn describe(room: &serde_json::Value, config: &Config) -> Result<String, String> {
    let number = |key: &str| room.get(key).and_then(serde_json::Value::as_u64).ok_or(format!("no {key}"));
    let state = room.get("state").and_then(|s| s.as_str()).ok_or("no state")?;
    let meaning = match state {
        "open" => "open: users join the line and are admitted",
        "paused" => "paused: users join the line, nobody is admitted",
        "closed" => "closed: nobody new joins; holders of a token may still order",
        other => other,
    };
    let event = match room.get("event") {
        Some(serde_json::Value::String(phase)) => phase.clone(),
        _ => "none".to_owned(),
    };
    let mode = match room.get("mode").and_then(|m| m.as_str()) {
        Some("shadow") => "shadow: a rehearsal, every protected request is forwarded",
        Some(other) => other,
        None => "active",
    };
    let interval = humantime::format_duration(config.admission.interval);
    Ok(format!(
        "state                  {meaning}\n\
         mode                   {mode}\n\
         waiting                {}\n\
         batch                  {} per {interval}\n\
         active tokens          {}\n\
         admitted (last 60 s)   {}\n\
         event                  {event}\n",
        number("queueLength")?,
        number("batch")?,
        number("activeTokens")?,
        number("admittedLastMinute")?,
    ))
}

/// One request, `Connection: close`; the status code and the body.
fn send(addr: SocketAddr, method: &str, path: &str, token: &[u8]) -> Result<(u16, Vec<u8>), CliError> {
    let unreachable = |source| CliError::Unreachable { addr, source };
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(unreachable)?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(unreachable)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(unreachable)?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\nAuthorization: Bearer "
    )
    .into_bytes();
    request.extend_from_slice(token);
    request.extend_from_slice(b"\r\n\r\n");
    stream.write_all(&request).map_err(unreachable)?;
    let mut response = Vec::new();
    // The server may keep the connection open after the body despite `Connection: close`: stop
    // at Content-Length rather than wait for the end of the stream.
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(parsed) = parse_response(&response) {
            return Ok(parsed);
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(unreachable(e)),
        }
    }
    parse_response(&response).ok_or_else(|| CliError::Garbled { addr, what: "an incomplete HTTP response".into() })
}

/// A complete response with a Content-Length: its status and body; `None` while incomplete.
fn parse_response(bytes: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let length: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let body = bytes.get(end + 4..end + 4 + length)?;
    Some((status, body.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_complete_at_its_content_length() {
        let full = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(parse_response(full), Some((401, b"{}".to_vec())));
        assert_eq!(parse_response(&full[..full.len() - 1]), None);
        assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\n"), None);
    }

    #[test]
    fn an_address_on_every_interface_is_reached_on_loopback() {
        let config = Config::parse("upstream: 127.0.0.1:1\nmetrics_listen: 0.0.0.0:9555").unwrap();
        assert_eq!(admin_addr(&config), "127.0.0.1:9555".parse().unwrap());
    }
}
