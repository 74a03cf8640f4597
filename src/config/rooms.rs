//! `rooms` (contract section 17). A room's configuration is the top-level document with the
//! room's own keys merged in, read by the same pipeline as a file of its own: a room's keys are
//! checked exactly as the top level's are, and a problem in one is named by its place in the
//! file (`rooms[1].admission.batch_size`). Then the rooms are checked against each other: names,
//! and that no request could belong to two rooms.

use std::path::Path;

use serde_yaml::{Mapping, Value};

use super::validate::Env;
use super::{Config, Problem, RoomConfig};

/// The keys a room may have of its own; the rest of a configuration belongs to the proxy.
const OWN_KEYS: [&str; 11] =
    ["endpoints", "protected", "admission", "queue", "token", "poll_after", "polling", "abuse", "event", "page", "upstream"];

/// The paths of a room's own endpoints under its prefix: what no other room's rule may match.
const ENDPOINT_PATHS: [&str; 5] = ["/enter", "/status", "/", "/event", "/event/draw"];

/// Each room of `text`'s `rooms`, in the file's order, or every problem found in them. A file
/// without `rooms` has none (its one room is the top level itself). Problems of the file's
/// structure (a room that is not a mapping, an unknown key) are the structural reading's to
/// report: a room it cannot read is skipped here.
pub(super) fn read(text: &str, folder: &Path, env: Env) -> Result<Vec<RoomConfig>, Vec<Problem>> {
    let Ok(Value::Mapping(mut top)) = serde_yaml::from_str::<Value>(text) else { return Ok(Vec::new()) };
    let Some(Value::Sequence(listed)) = top.remove("rooms") else { return Ok(Vec::new()) };
    let mut problems = Vec::new();
    if listed.is_empty() {
        problems.push(problem("rooms", "lists no room: leave `rooms` out to run the one room `default`"));
    }
    let mut rooms: Vec<RoomConfig> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (i, room) in listed.iter().enumerate() {
        let Value::Mapping(own) = room else { continue };
        let Some(name) = own.get("name").and_then(Value::as_str) else { continue };
        let at = format!("rooms[{i}]");
        if let Err(why) = check_name(name) {
            problems.push(problem(&format!("{at}.name"), why));
        } else if names.contains(&name) {
            problems.push(problem(&format!("{at}.name"), format!("`{name}` names two rooms; each room's name is its own")));
        }
        names.push(name);
        let host = match own.get("host") {
            None | Some(Value::Null) => None,
            Some(Value::String(host)) => match check_host(host) {
                Ok(host) => Some(host),
                Err(why) => {
                    problems.push(problem(&format!("{at}.host"), why));
                    None
                }
            },
            Some(_) => continue,
        };
        let merged = merge(&top, own);
        let doc = serde_yaml::to_string(&Value::Mapping(merged)).expect("a YAML mapping writes as YAML");
        match Config::parse_one(&doc, folder, env) {
            Ok(config) => rooms.push(RoomConfig { name: name.to_owned(), host, config }),
            Err(e) => problems.extend(
                e.problems
                    .into_iter()
                    .filter(|p| set_by(own, &p.path))
                    .map(|p| Problem { path: format!("{at}.{}", p.path), message: p.message }),
            ),
        }
    }
    if problems.is_empty() {
        problems.extend(overlaps(&rooms, &listed));
    }
    if problems.is_empty() {
        Ok(rooms)
    } else {
        Err(problems)
    }
}

fn problem(path: &str, message: impl Into<String>) -> Problem {
    Problem { path: path.to_owned(), message: message.into() }
}

fn check_name(name: &str) -> Result<(), String> {
    let fits = (1..=32).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if fits {
        Ok(())
    } else {
        Err(format!("`{name}` is not a room name: 1 to 32 of a-z, 0-9 and - (it names the room in Redis keys and metrics)"))
    }
}

/// A host as requests are compared with it: lowercase, without a port.
fn check_host(host: &str) -> Result<String, String> {
    let valid = !host.is_empty()
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !host.starts_with(['.', '-']);
    if valid {
        Ok(host.to_ascii_lowercase())
    } else {
        Err(format!("`{host}` is not a host name (letters, digits, - and ., without a port: the request's port is ignored)"))
    }
}

/// `top` with `own`'s keys of [`OWN_KEYS`] in their place: a mapping replaces key by key, at
/// every depth; anything else (a list, a text) replaces the whole value.
fn merge(top: &Mapping, own: &Mapping) -> Mapping {
    let mut merged = top.clone();
    for key in OWN_KEYS {
        if let Some(value) = own.get(key) {
            let base = merged.get(key).cloned().unwrap_or(Value::Null);
            merged.insert(Value::from(key), merge_value(base, value.clone()));
        }
    }
    merged
}

fn merge_value(base: Value, own: Value) -> Value {
    match (base, own) {
        (Value::Mapping(mut base), Value::Mapping(own)) => {
            for (key, value) in own {
                let below = base.remove(&key).unwrap_or(Value::Null);
                base.insert(key, merge_value(below, value));
            }
            Value::Mapping(base)
        }
        (_, own) => own,
    }
}

/// Whether the room itself wrote the key a problem at `path` (of its merged document) is about;
/// the others are the top level's, reported once at their own place.
fn set_by(own: &Mapping, path: &str) -> bool {
    let mut node = Some(own);
    let mut value: Option<&Value> = None;
    for segment in path.split(['.', '[']).filter(|s| !s.is_empty()) {
        if segment.ends_with(']') {
            // A list is the room's whole when the room wrote it: the index is inside.
            return value.is_some();
        }
        let Some(mapping) = node else { return value.is_some() };
        value = mapping.get(segment);
        match value {
            None => return false,
            Some(Value::Mapping(m)) => node = Some(m),
            Some(_) => node = None,
        }
    }
    value.is_some()
}

/// Every pair of rooms that could both claim a request: on hosts that overlap (the same, or one
/// of them any host), the same prefix or one inside another, a rule of one that matches the
/// other's endpoints, or two rules that match one request. Named at the later room, naming both.
fn overlaps(rooms: &[RoomConfig], listed: &[Value]) -> Vec<Problem> {
    let index_of = |name: &str| {
        listed.iter().position(|r| r.get("name").and_then(Value::as_str) == Some(name)).unwrap_or_default()
    };
    let mut problems = Vec::new();
    for (j, later) in rooms.iter().enumerate() {
        let at = format!("rooms[{}]", index_of(&later.name));
        for earlier in &rooms[..j] {
            let shared_host = match (&earlier.host, &later.host) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            if !shared_host {
                continue;
            }
            let (a, b) = (&earlier.config.endpoints.prefix, &later.config.endpoints.prefix);
            if inside(a, b) || inside(b, a) {
                problems.push(problem(
                    &format!("{at}.endpoints.prefix"),
                    format!("`{b}` overlaps room `{}`'s prefix `{a}`: a request under both would belong to two rooms", earlier.name),
                ));
            }
            for (mine, theirs, rules_of) in [(later, earlier, &later.config.protected), (earlier, later, &earlier.config.protected)] {
                let prefix = &theirs.config.endpoints.prefix;
                if let Some(rule) = rules_of.iter().find(|rule| {
                    ENDPOINT_PATHS.iter().any(|p| rule.covers_path(&format!("{prefix}{p}")))
                }) {
                    problems.push(problem(
                        &format!("{at}.protected"),
                        format!(
                            "room `{}`'s rule {} {} matches room `{}`'s endpoints under `{prefix}`",
                            mine.name,
                            rule.method(),
                            rule.path(),
                            theirs.name
                        ),
                    ));
                }
            }
            for rule in &later.config.protected {
                if let Some(other) = earlier.config.protected.iter().find(|other| other.overlaps(rule)) {
                    problems.push(problem(
                        &format!("{at}.protected"),
                        format!(
                            "{} {} overlaps room `{}`'s rule {} {}: a request matching both would belong to two rooms",
                            rule.method(),
                            rule.path(),
                            earlier.name,
                            other.method(),
                            other.path()
                        ),
                    ));
                }
            }
        }
    }
    problems
}

/// Whether `path` is `prefix` or below it.
fn inside(prefix: &str, path: &str) -> bool {
    let (path, prefix) = (path.as_bytes(), prefix.as_bytes());
    path.eq_ignore_ascii_case(prefix)
        || (path.len() > prefix.len()
            && path[..prefix.len()].eq_ignore_ascii_case(prefix)
            && (prefix.ends_with(b"/") || path[prefix.len()] == b'/'))
}
