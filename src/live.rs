//! The running configuration, swappable without a restart (SIGHUP, section 6 of the contract).
//!
//! Readers take a snapshot per request ([`RoomState::settings`]), so a reload never changes the
//! rules half way through one request. Only what can change safely while serving does; the rest
//! is logged as needing a restart and kept as it was. The room's policy is compiled once here,
//! from the merged file, not per request.

use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, ConfigError, IdentityConfig};
use crate::metrics;
use crate::policy::Settings;
use crate::process::Process;

/// What a reload changed: settings now in force, and settings that wait for a restart.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub applied: Vec<&'static str>,
    pub need_restart: Vec<&'static str>,
}

/// Merges a freshly validated file into the running configuration.
pub fn merge(running: &Config, mut next: Config) -> (Config, Changes) {
    let mut changes = Changes::default();
    // Types without a natural equality (verified identity holds keys) compare by their debug
    // form, which names every setting.
    let differs = |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    let mut needs_restart = |key: &'static str, changed: bool| {
        if changed {
            changes.need_restart.push(key);
        }
        changed
    };
    // Sockets and the Redis connection are made once at start-up; the file watcher is started
    // (or not) with the process.
    if needs_restart("listen", next.listen != running.listen) {
        next.listen = running.listen;
    }
    if needs_restart("metrics_listen", next.metrics_listen != running.metrics_listen) {
        next.metrics_listen = running.metrics_listen;
    }
    if needs_restart("redis", next.redis != running.redis) {
        next.redis = running.redis.clone();
    }
    if needs_restart("upstream", next.upstream != running.upstream) {
        next.upstream = running.upstream.clone();
    }
    if needs_restart("admin.listen", next.admin.listen != running.admin.listen) {
        next.admin.listen = running.admin.listen;
    }
    if needs_restart("reload.watch", next.reload_watch != running.reload_watch) {
        next.reload_watch = running.reload_watch;
    }
    // What open waiting pages and clients already use: a new prefix would turn their polls into
    // pass-through 404s, a new identity mode would rename every user, a new token header would
    // make every token already handed out unusable.
    if needs_restart("endpoints.prefix", next.endpoints.prefix != running.endpoints.prefix) {
        next.endpoints.prefix = running.endpoints.prefix.clone();
    }
    let mut rotated = Vec::new();
    next.identity = match (&running.identity, &next.identity) {
        (IdentityConfig::Header(a), IdentityConfig::Header(b)) => {
            needs_restart("identity.header", a != b);
            running.identity.clone()
        }
        // Keys rotate without a restart; what names the user stays until one.
        (IdentityConfig::Jwt(a), IdentityConfig::Jwt(b)) => {
            let rotation = a.rotation(b);
            for key in rotation.need_restart {
                needs_restart(key, true);
            }
            rotated = rotation.applied;
            if rotated.is_empty() {
                running.identity.clone()
            } else {
                IdentityConfig::Jwt(Arc::new(a.rotated_to(b)))
            }
        }
        // Header mode to JWT or back would rename every user.
        _ => {
            needs_restart("identity", true);
            running.identity.clone()
        }
    };
    if needs_restart("token.header", next.token.header != running.token.header) {
        next.token.header = running.token.header.clone();
    }
    let applied = [
        ("admission", next.admission != running.admission),
        ("queue", next.queue != running.queue),
        ("token.ttl", next.token.ttl != running.token.ttl),
        ("poll_after", next.poll_after != running.poll_after),
        ("protected", next.protected != running.protected),
        ("shutdown.grace", next.shutdown_grace != running.shutdown_grace),
        ("polling", differs(&next.polling, &running.polling)),
        ("abuse", differs(&next.abuse, &running.abuse)),
        ("page", differs(&next.page, &running.page)),
        // Nothing of `limits` is baked into a socket: the connection guard reads them at each
        // accept and each request head, the upstream peer per request (see crate::limits).
        ("limits", next.limits != running.limits),
        // Read per admin request and per protected response.
        ("admin", differs(&next.admin, &running.admin)),
        // Times may move before the draw; the seed lives in Redis, out of any file's reach.
        ("event", next.event != running.event),
        // Both read per protected request.
        ("bypass", differs(&next.bypass, &running.bypass)),
        ("mode", next.mode != running.mode),
    ];
    changes.applied = applied.iter().filter(|(_, changed)| *changed).map(|(k, _)| *k).collect();
    changes.applied.extend(rotated);
    merge_rooms(running, &mut next, &mut changes);
    (next, changes)
}

/// Rooms are added, changed and removed by a reload (contract section 17); a room is known by
/// its name, and a running room's prefix and host, like the top level's prefix, wait for a
/// restart. Every room's proxy-wide keys are the top level's as merged, so what waits for a
/// restart waits in every room, and rotated keys reach every room.
fn merge_rooms(running: &Config, next: &mut Config, changes: &mut Changes) {
    let names = |config: &Config| config.rooms.iter().map(|room| room.name.clone()).collect::<Vec<_>>();
    let mut restart = Vec::new();
    for room in &mut next.rooms {
        let config = &mut room.config;
        config.listen = next.listen;
        config.metrics_listen = next.metrics_listen;
        config.redis = next.redis.clone();
        config.identity = next.identity.clone();
        config.token.header = next.token.header.clone();
        config.admin.listen = next.admin.listen;
        config.reload_watch = next.reload_watch;
        let Some(before) = running.rooms.iter().find(|r| r.name == room.name) else { continue };
        if room.config.endpoints.prefix != before.config.endpoints.prefix {
            room.config.endpoints.prefix = before.config.endpoints.prefix.clone();
            restart.push("rooms.endpoints.prefix");
        }
        if room.host != before.host {
            room.host = before.host.clone();
            restart.push("rooms.host");
        }
    }
    let changed = names(running) != names(next)
        || running.rooms.iter().zip(&next.rooms).any(|(a, b)| format!("{:?}", a.config) != format!("{:?}", b.config));
    if changed {
        changes.applied.push("rooms");
    }
    for key in restart {
        if !changes.need_restart.contains(&key) {
            changes.need_restart.push(key);
        }
    }
}

/// Re-reads the file and swaps it in when valid; an invalid file leaves everything as it was.
pub fn reload(process: &Process, path: &Path) -> Result<Changes, ConfigError> {
    match Config::load(path) {
        Ok(next) => {
            let (merged, changes) = merge(&process.settings().config, next);
            let settings = Settings::new(merged);
            process.replace_settings(settings);
            metrics::CONFIG_RELOADS_TOTAL.with_label_values(&["ok"]).inc();
            tracing::info!(applied = ?changes.applied, "configuration reloaded");
            for key in &changes.need_restart {
                tracing::warn!(key, "configuration change needs a restart to take effect; keeping the running value");
            }
            Ok(changes)
        }
        Err(error) => {
            metrics::CONFIG_RELOADS_TOTAL.with_label_values(&["error"]).inc();
            for problem in &error.problems {
                tracing::error!(%problem, "configuration reload refused; the running configuration stays");
            }
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_only_keys_are_kept_and_reported() {
        let running = Config::parse("upstream: 127.0.0.1:1").unwrap();
        let next = Config::parse(
            "upstream: 127.0.0.1:2\nlisten: 127.0.0.1:1\nadmission: {batch_size: 20}\nredis: {key_prefix: other}\n\
             endpoints: {prefix: /line}\nidentity: {header: X-Who}\ntoken: {header: X-Pass}\n\
             limits: {max_connections: 5, header_timeout: 2s}",
        )
        .unwrap();
        let (merged, changes) = merge(&running, next);
        assert_eq!(
            changes.need_restart,
            vec!["listen", "redis", "upstream", "endpoints.prefix", "identity.header", "token.header"]
        );
        assert_eq!(changes.applied, vec!["admission", "limits"]);
        assert_eq!(merged.limits.max_connections, 5);
        assert_eq!(merged.listen, running.listen);
        assert_eq!(merged.redis, running.redis);
        assert_eq!(merged.upstream, running.upstream);
        assert_eq!(merged.endpoints.prefix, "/queue");
        assert_eq!(merged.token.header, running.token.header);
        assert!(matches!(&merged.identity, IdentityConfig::Header(h) if h == "x-user-id"), "{:?}", merged.identity);
        assert_eq!(merged.admission.batch_size.get(), 20);
    }

    /// Section 6: keys and the rules a token must meet rotate; what names the user waits for a
    /// restart. Told apart by what the merged verifier accepts, not by how it prints.
    #[test]
    fn a_reload_rotates_jwt_keys_and_keeps_what_names_the_user() {
        use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
        const A: &str = "live-test-secret-a-of-at-least-32-bytes";
        const B: &str = "live-test-secret-b-of-at-least-32-bytes";
        std::env::set_var("WAITROOM_LIVE_TEST_SECRET_A", A);
        std::env::set_var("WAITROOM_LIVE_TEST_SECRET_B", B);
        let config = |jwt: &str| Config::parse(&format!("upstream: 127.0.0.1:1\nidentity: {{jwt: {{{jwt}}}}}")).unwrap();
        let running = config("secret_env: WAITROOM_LIVE_TEST_SECRET_A, issuer: one");
        let next = config("secret_env: WAITROOM_LIVE_TEST_SECRET_B, issuer: two, audience: shop, leeway: 5s, claim: uid, from: 'cookie:id'");
        let (merged, changes) = merge(&running, next);
        assert_eq!(
            changes.applied,
            ["identity.jwt.secret_env", "identity.jwt.issuer", "identity.jwt.audience", "identity.jwt.leeway"]
        );
        assert_eq!(changes.need_restart, ["identity.jwt.from", "identity.jwt.claim"]);
        let IdentityConfig::Jwt(verifier) = &merged.identity else { panic!("{:?}", merged.identity) };
        let exp = jsonwebtoken::get_current_timestamp() + 300;
        let token = |secret: &str, iss: &str| {
            let claims = serde_json::json!({"sub": "alice", "uid": "zed", "iss": iss, "aud": "shop", "exp": exp});
            encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap()).unwrap()
        };
        // The new key and issuer, and still the user `sub` names, read from the bearer header.
        assert_eq!(verifier.verify_token(token(B, "two").as_bytes()).ok().as_deref(), Some("alice"));
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {}", token(B, "two")).parse().unwrap());
        assert_eq!(verifier.verify(&headers).ok().as_deref(), Some("alice"));
        assert!(verifier.verify_token(token(A, "one").as_bytes()).is_err(), "the old key verifies");
        assert!(verifier.verify_token(token(B, "one").as_bytes()).is_err(), "the old issuer verifies");

        // Nothing changed: nothing applied, and the running verifier stays the very same.
        let again = config("secret_env: WAITROOM_LIVE_TEST_SECRET_A, issuer: one");
        let (merged, changes) = merge(&running, again);
        assert_eq!(changes, Changes::default());
        let (IdentityConfig::Jwt(a), IdentityConfig::Jwt(b)) = (&running.identity, &merged.identity) else { panic!() };
        assert!(Arc::ptr_eq(a, b));
    }
}
