//! The checks of every value and of the rules between keys, each problem recorded with its key
//! path and checking carried on, so one `--check` names everything wrong with a file.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use http::{HeaderName, Method};

use super::units::is_standard_method;
use super::*;
use crate::rules::{Cidr, PollTier};

/// Whether loading reads the secrets that `*_env` keys name. `Skip` is `--check --no-env`: a CI
/// job checks a file without the production secrets; every other check still runs, and the
/// configuration it yields holds placeholders, so it is never served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Env {
    #[default]
    Read,
    Skip,
}

/// What a secret read under [`Env::Skip`] holds: any non-empty value without surrounding
/// whitespace passes every check a real one gets.
const UNREAD_SECRET: &str = "not-read-under-no-env";

/// Collects problems while converting; each check returns `None` after recording a problem.
#[derive(Default)]
pub(super) struct Validator {
    pub(super) problems: Vec<Problem>,
    pub(super) env: Env,
}

impl Validator {
    /// The environment variable `name`, unless secrets are not read at all ([`Env::Skip`]).
    pub(super) fn env_var(&self, name: &str) -> Option<std::ffi::OsString> {
        match self.env {
            Env::Read => std::env::var_os(name),
            Env::Skip => Some(UNREAD_SECRET.into()),
        }
    }

    /// A secret that an `*_env` key names: a variable set and not empty (an empty one would be a
    /// secret anybody guesses), without whitespace at either end (a secret file's trailing
    /// newline: no client can send that in a header, whose value HTTP trims).
    pub(super) fn env_secret(&mut self, path: &str, name: &str) -> Option<Secret> {
        let name = name.trim();
        if name.is_empty() {
            return self.fail(path, "must name an environment variable");
        }
        match self.env_var(name) {
            Some(value) if !value.is_empty() => {
                let value = std::os::unix::ffi::OsStringExt::into_vec(value);
                if value.trim_ascii().len() != value.len() {
                    return self.fail(
                        path,
                        format!("environment variable {name} starts or ends with whitespace (a trailing newline?): remove it"),
                    );
                }
                Some(Secret(value))
            }
            Some(_) => self.fail(path, format!("environment variable {name} is empty")),
            None => self.fail(path, format!("environment variable {name} is not set")),
        }
    }

    pub(super) fn fail<T>(&mut self, path: &str, message: impl Into<String>) -> Option<T> {
        self.problems.push(Problem { path: path.to_string(), message: message.into() });
        None
    }

    pub(super) fn duration(&mut self, path: &str, text: &str) -> Option<Duration> {
        match humantime::parse_duration(text.trim()) {
            Ok(d) => Some(d),
            Err(_) => self.fail(
                path,
                format!("'{text}' is not a duration (write a number with a unit: 100ms, 2s, 5m, 1h)"),
            ),
        }
    }

    pub(super) fn positive_duration(&mut self, path: &str, text: &str) -> Option<Duration> {
        let d = self.duration(path, text)?;
        if d.is_zero() {
            return self.fail(path, "must be greater than 0");
        }
        Some(d)
    }

    /// A duration within `min..=max`, both shown in the message when it is not.
    pub(super) fn bounded_duration(&mut self, path: &str, text: &str, min: Duration, max: Duration) -> Option<Duration> {
        let d = self.duration(path, text)?;
        if d < min || d > max {
            return self.fail(
                path,
                format!(
                    "must be between {} and {}",
                    humantime::format_duration(min),
                    humantime::format_duration(max)
                ),
            );
        }
        Some(d)
    }

    pub(super) fn positive(&mut self, path: &str, value: i64) -> Option<u64> {
        if value < 1 {
            return self.fail(path, "must be at least 1");
        }
        Some(value as u64)
    }

    pub(super) fn non_negative(&mut self, path: &str, value: i64) -> Option<u64> {
        if value < 0 {
            return self.fail(path, "must be 0 or more");
        }
        Some(value as u64)
    }

    pub(super) fn batch(&mut self, path: &str, value: i64) -> Option<NonZeroU32> {
        let v = self.positive(path, value)?;
        match u32::try_from(v).ok().and_then(NonZeroU32::new) {
            Some(n) => Some(n),
            None => self.fail(path, "is too large"),
        }
    }

    pub(super) fn socket_addr(&mut self, path: &str, text: &str) -> Option<SocketAddr> {
        match text.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => self.fail(path, format!("'{text}' is not an address (write ip:port, e.g. 0.0.0.0:8080)")),
        }
    }

    pub(super) fn host_port(&mut self, path: &str, text: &str) -> Option<()> {
        if text.parse::<SocketAddr>().is_ok() {
            return Some(());
        }
        let ok = match text.rsplit_once(':') {
            Some((host, port)) => {
                !host.is_empty()
                    && host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
                    && port.parse::<u16>().map(|p| p > 0).unwrap_or(false)
            }
            None => false,
        };
        if ok {
            Some(())
        } else {
            self.fail(path, format!("'{text}' is not host:port"))
        }
    }

    pub(super) fn redis_url(&mut self, path: &str, text: &str) -> Option<String> {
        match redis::parse_redis_url(text) {
            Some(_) if text.starts_with("redis://") || text.starts_with("rediss://") || text.starts_with("unix://") || text.starts_with("redis+unix://") => {
                Some(text.to_string())
            }
            _ => self.fail(path, format!("'{text}' is not a Redis URL (redis://host:port)")),
        }
    }

    pub(super) fn redis(&mut self, r: raw::Redis) -> Option<RedisConfig> {
        /// Cluster nodes and sentinels name each other by host and port: no unix sockets.
        fn tcp_url(v: &mut Validator, path: &str, text: &str) {
            let Some(url) = v.redis_url(path, text) else { return };
            if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                v.fail::<()>(path, format!("'{text}' must be a TCP address (redis://host:port)"));
            }
        }
        let timeout = self.positive_duration("redis.timeout", &r.timeout);
        let prefix_ok = !r.key_prefix.is_empty()
            && !r.key_prefix.contains(['{', '}'])
            && r.key_prefix.bytes().all(|b| b.is_ascii_graphic());
        if !prefix_ok {
            self.fail::<()>(
                "redis.key_prefix",
                "must be non-empty printable ASCII without spaces or braces (the proxy adds the {hash tag} itself)",
            );
        }
        let chosen = [r.url.is_some(), r.cluster.is_some(), r.sentinel.is_some()]
            .iter()
            .filter(|x| **x)
            .count();
        let target = match (r.url, r.cluster, r.sentinel) {
            _ if chosen > 1 => self.fail("redis", "takes exactly one of url, cluster or sentinel"),
            (None, None, None) => Some(RedisTarget::Url("redis://127.0.0.1:6379".into())),
            (Some(url), _, _) => self.redis_url("redis.url", &url).map(RedisTarget::Url),
            (_, Some(nodes), _) => {
                if nodes.is_empty() {
                    self.fail("redis.cluster", "needs at least one seed node")
                } else {
                    let before = self.problems.len();
                    for (i, n) in nodes.iter().enumerate() {
                        tcp_url(self, &format!("redis.cluster[{i}]"), n);
                    }
                    (self.problems.len() == before).then_some(RedisTarget::Cluster(nodes))
                }
            }
            (_, _, Some(s)) => {
                let before = self.problems.len();
                if s.master.is_empty() {
                    self.fail::<()>("redis.sentinel.master", "must not be empty");
                }
                if s.addrs.is_empty() {
                    self.fail::<()>("redis.sentinel.addrs", "needs at least one sentinel");
                }
                for (i, a) in s.addrs.iter().enumerate() {
                    tcp_url(self, &format!("redis.sentinel.addrs[{i}]"), a);
                }
                let auth = self.node_auth(s.username, s.password_env);
                (self.problems.len() == before).then(|| RedisTarget::Sentinel {
                    master: s.master,
                    addrs: s.addrs,
                    auth: auth.unwrap_or_default(),
                })
            }
        };
        if r.read_from_replicas && matches!(target, Some(RedisTarget::Url(_))) {
            // One server has no replica to read from: an option that silently did nothing would
            // let an operator plan capacity on reads it never moves.
            self.fail::<()>(
                "redis.read_from_replicas",
                "needs replicas: redis.cluster or redis.sentinel (with url every call goes to that server)",
            );
            return None;
        }
        let target = target?;
        prefix_ok.then_some(())?;
        Some(RedisConfig {
            target,
            key_prefix: r.key_prefix,
            timeout: timeout?,
            read_from_replicas: r.read_from_replicas,
        })
    }

    /// `redis.sentinel.username` and `.password_env`; the password is read here, once, and an
    /// unset variable is refused like a missing JWT secret: a proxy that cannot log in to the
    /// primary would start only to answer 503.
    pub(super) fn node_auth(&mut self, username: Option<String>, password_env: Option<String>) -> Option<NodeAuth> {
        if username.as_deref().is_some_and(|u| u.trim().is_empty()) {
            return self.fail("redis.sentinel.username", "must not be empty when set");
        }
        let password = match password_env.as_deref().map(str::trim) {
            None => None,
            Some("") => {
                return self.fail("redis.sentinel.password_env", "must name an environment variable (or leave the key out)")
            }
            Some(name) => match self.env_var(name).map(std::ffi::OsString::into_string) {
                Some(Ok(value)) if !value.is_empty() => Some(Secret(value.into_bytes())),
                Some(Ok(_)) => return self.fail("redis.sentinel.password_env", format!("environment variable {name} is empty")),
                Some(Err(_)) => {
                    return self.fail("redis.sentinel.password_env", format!("environment variable {name} is not UTF-8"))
                }
                None => return self.fail("redis.sentinel.password_env", format!("environment variable {name} is not set")),
            },
        };
        if username.is_some() && password.is_none() {
            return self.fail("redis.sentinel.username", "needs redis.sentinel.password_env (a user logs in with a password)");
        }
        Some(NodeAuth { username: username.map(|u| u.trim().to_owned()), password })
    }

    pub(super) fn header_name(&mut self, path: &str, text: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(text.as_bytes()) {
            Ok(h) if !text.is_empty() => Some(h),
            _ => self.fail(path, format!("'{text}' is not an HTTP header name")),
        }
    }

    pub(super) fn identity(&mut self, i: raw::Identity, folder: &Path) -> Option<IdentityConfig> {
        match (i.header, i.jwt) {
            (Some(_), Some(_)) => self.fail("identity", "takes either header or jwt, not both"),
            (h, None) => {
                let h = h.unwrap_or_else(|| "X-User-Id".to_string());
                self.header_name("identity.header", &h).map(IdentityConfig::Header)
            }
            (None, Some(jwt)) => {
                let config = self.jwt(jwt, folder)?;
                match crate::identity::JwtVerifier::new(&config) {
                    Ok(verifier) => Some(IdentityConfig::Jwt(std::sync::Arc::new(verifier))),
                    Err(problem) => self.fail(problem.path, problem.message),
                }
            }
        }
    }

    /// `identity.jwt`: every setting checked, the secret and the key file read (once, here).
    pub(super) fn jwt(&mut self, j: raw::Jwt, folder: &Path) -> Option<JwtConfig> {
        use jsonwebtoken::Algorithm;
        let before = self.problems.len();
        let from = TokenSource::parse(&j.from);
        if from.is_none() {
            self.fail::<()>(
                "identity.jwt.from",
                format!("'{}' is neither authorization nor cookie:NAME", j.from),
            );
        }
        let mut algorithms = Vec::new();
        if j.algorithms.is_empty() {
            self.fail::<()>("identity.jwt.algorithms", "needs at least one of HS256, RS256, ES256");
        }
        for (i, name) in j.algorithms.iter().enumerate() {
            match identity::algorithm(name.trim()) {
                Some(a) if !algorithms.contains(&a) => algorithms.push(a),
                Some(_) => {}
                None => {
                    self.fail::<()>(
                        &format!("identity.jwt.algorithms[{i}]"),
                        format!("'{name}' is not one of HS256, RS256, ES256"),
                    );
                }
            }
        }
        let mut secret = None;
        if algorithms.contains(&Algorithm::HS256) {
            match j.secret_env.as_deref().map(str::trim) {
                None | Some("") => {
                    self.fail::<()>(
                        "identity.jwt.secret_env",
                        "is required for HS256 (the environment variable that holds the secret)",
                    );
                }
                Some(name) => match self.env_var(name) {
                    Some(value) if !value.is_empty() => {
                        secret = Some(std::os::unix::ffi::OsStringExt::into_vec(value));
                    }
                    Some(_) => {
                        self.fail::<()>("identity.jwt.secret_env", format!("environment variable {name} is empty"));
                    }
                    None => {
                        self.fail::<()>("identity.jwt.secret_env", format!("environment variable {name} is not set"));
                    }
                },
            }
        }
        let mut public_key_pem = None;
        if algorithms.iter().any(|a| *a != Algorithm::HS256) {
            match j.public_key_file.as_deref().map(str::trim) {
                None | Some("") => {
                    self.fail::<()>("identity.jwt.public_key_file", "is required for RS256 and ES256 (a PEM public key)");
                }
                Some(file) => match crate::identity::read_key_file(&folder.join(file)) {
                    Ok(pem) => public_key_pem = Some(pem),
                    Err(message) => {
                        self.fail::<()>("identity.jwt.public_key_file", message);
                    }
                },
            }
        }
        if j.claim.trim().is_empty() {
            self.fail::<()>("identity.jwt.claim", "must name a claim (e.g. sub)");
        }
        for (key, value) in [("identity.jwt.issuer", &j.issuer), ("identity.jwt.audience", &j.audience)] {
            if value.as_deref().is_some_and(|v| v.is_empty()) {
                self.fail::<()>(key, "must not be empty when set");
            }
        }
        let leeway = self.duration("identity.jwt.leeway", &j.leeway);
        let forward_header = self.header_name("identity.jwt.forward_header", &j.forward_header);
        (self.problems.len() == before).then_some(())?;
        Some(JwtConfig {
            from: from?,
            algorithms,
            secret,
            public_key_pem,
            claim: j.claim.trim().to_string(),
            issuer: j.issuer,
            audience: j.audience,
            leeway: leeway?,
            forward_header: forward_header?,
        })
    }

    pub(super) fn routes(&mut self, routes: Vec<raw::Route>) -> Option<Vec<crate::paths::Rule>> {
        use crate::paths::{PathMatch, Rule};
        let before = self.problems.len();
        let mut out = Vec::with_capacity(routes.len());
        for (i, r) in routes.into_iter().enumerate() {
            // Requests' methods are compared case-insensitively, so `post` names POST.
            let method = match Method::from_bytes(r.method.to_ascii_uppercase().as_bytes()) {
                Ok(m) if is_standard_method(&m) => Some(m),
                _ => self.fail(
                    &format!("protected[{i}].method"),
                    format!("'{}' is not an HTTP method", r.method),
                ),
            };
            let matching = match r.matching.as_deref() {
                None | Some("exact") => Some(PathMatch::Exact),
                Some("prefix") => Some(PathMatch::Prefix),
                Some(other) => self.fail(
                    &format!("protected[{i}].match"),
                    format!("'{other}' is not exact or prefix"),
                ),
            };
            if !r.path.starts_with('/') {
                self.fail::<()>(&format!("protected[{i}].path"), "must start with /");
                continue;
            }
            let (Some(method), Some(matching)) = (method, matching) else { continue };
            match Rule::new(method, &r.path, matching) {
                Ok(rule) => out.push(rule),
                Err(refusal) => {
                    self.fail::<()>(&format!("protected[{i}].path"), refusal.message());
                }
            }
        }
        (self.problems.len() == before).then_some(out)
    }

    pub(super) fn admission(&mut self, a: raw::Admission) -> Option<AdmissionConfig> {
        let interval = self.bounded_duration("admission.interval", &a.interval, MIN_INTERVAL, MAX_INTERVAL);
        let batch_size = self.batch("admission.batch_size", a.batch_size);
        if batch_size.is_some_and(|b| b.get() > MAX_BATCH) {
            self.fail::<()>("admission.batch_size", format!("must be at most {MAX_BATCH} (raise the rate with a shorter interval)"));
            return None;
        }
        let max_active = self.non_negative("admission.max_active", a.max_active);
        let adaptive = match a.adaptive {
            None => Some(None),
            Some(ad) => {
                let target = self.positive_duration("admission.adaptive.target_p95", &ad.target_p95);
                let min_batch = self.batch("admission.adaptive.min_batch", ad.min_batch);
                if let (Some(min), Some(max)) = (min_batch, batch_size) {
                    if min > max {
                        self.fail::<()>(
                            "admission.adaptive.min_batch",
                            "must not exceed admission.batch_size",
                        );
                        return None;
                    }
                }
                Some(Some(AdaptiveConfig { target_p95: target?, min_batch: min_batch? }))
            }
        };
        Some(AdmissionConfig {
            interval: interval?,
            batch_size: batch_size?,
            instant: a.instant,
            max_active: max_active?,
            adaptive: adaptive?,
        })
    }

    pub(super) fn endpoint_prefix(&mut self, prefix: &str) -> Option<String> {
        if !prefix.starts_with('/') {
            return self.fail("endpoints.prefix", "must start with /");
        }
        // "/queue/" and "/queue" name the same endpoints: {prefix}/enter is built from it.
        Some(prefix.trim_end_matches('/').to_string())
    }

    pub(super) fn tiers(&mut self, tiers: Vec<raw::Tier>) -> Option<Vec<PollTier>> {
        if tiers.is_empty() {
            return self.fail("poll_after", "needs at least one tier, the last with min_wait 0s");
        }
        let before = self.problems.len();
        let mut out = Vec::with_capacity(tiers.len());
        for (i, t) in tiers.iter().enumerate() {
            let min_wait = self.duration(&format!("poll_after[{i}].min_wait"), &t.min_wait);
            let poll = self.positive_duration(&format!("poll_after[{i}].poll_after"), &t.poll_after);
            if let (Some(min_wait), Some(poll_after)) = (min_wait, poll) {
                out.push(PollTier { min_wait, poll_after });
            }
        }
        if self.problems.len() != before {
            return None;
        }
        if out.last().map(|t| !t.min_wait.is_zero()).unwrap_or(true) {
            return self.fail(
                &format!("poll_after[{}].min_wait", out.len() - 1),
                "the last tier must have min_wait 0s, so every wait has a tier",
            );
        }
        Some(out)
    }

    pub(super) fn polling(&mut self, p: raw::Polling) -> Option<PollingConfig> {
        let text = p.grace.trim();
        let grace = text
            .strip_suffix('%')
            .and_then(|n| n.trim().parse::<f64>().ok())
            .filter(|g| (0.0..100.0).contains(g))
            .map(|g| g / 100.0);
        let Some(grace) = grace else {
            return self.fail("polling.grace", format!("'{}' is not a percentage from 0% to 99%", p.grace));
        };
        Some(PollingConfig { enforce: p.enforce, grace })
    }

    pub(super) fn abuse(&mut self, a: raw::Abuse) -> Option<AbuseConfig> {
        let limit = self.non_negative("abuse.identities_per_address", a.identities_per_address);
        let before = self.problems.len();
        let mut proxies = Vec::new();
        for (i, c) in a.trusted_proxies.iter().enumerate() {
            match Cidr::parse(c) {
                Some(cidr) => proxies.push(cidr),
                None => {
                    self.fail::<()>(&format!("abuse.trusted_proxies[{i}]"), format!("'{c}' is not a CIDR"));
                }
            }
        }
        let limit = u32::try_from(limit?).ok().or_else(|| {
            self.fail("abuse.identities_per_address", "is too large")
        })?;
        (self.problems.len() == before)
            .then_some(AbuseConfig { identities_per_address: limit, trusted_proxies: proxies })
    }

    /// `limits`: every timeout within [`LIMIT_TIMEOUT_RANGE`] (shorter cuts off healthy clients,
    /// longer is no limit and would overflow timer arithmetic), the head size within
    /// [`LIMIT_HEAD_RANGE`] (smaller refuses ordinary browsers, larger meets pingora's own cap,
    /// which answers 400 rather than 431).
    pub(super) fn limits(&mut self, l: raw::Limits) -> Option<LimitsConfig> {
        let before = self.problems.len();
        let timeout = |v: &mut Validator, key: &str, text: &str| {
            let d = v.duration(key, text)?;
            if !LIMIT_TIMEOUT_RANGE.contains(&d) {
                return v.fail(key, "must be from 100ms to 24h");
            }
            Some(d)
        };
        let header_timeout = timeout(self, "limits.header_timeout", &l.header_timeout);
        let idle_timeout = timeout(self, "limits.idle_timeout", &l.idle_timeout);
        let upstream_timeout = timeout(self, "limits.upstream_timeout", &l.upstream_timeout);
        let max_connections = self
            .positive("limits.max_connections", l.max_connections)
            .and_then(|n| match u32::try_from(n) {
                Ok(n) => Some(n as usize),
                Err(_) => self.fail("limits.max_connections", "is too large"),
            });
        let max_connections_per_address = self
            .non_negative("limits.max_connections_per_address", l.max_connections_per_address)
            .and_then(|n| match u32::try_from(n) {
                Ok(n) => Some(n as usize),
                Err(_) => self.fail("limits.max_connections_per_address", "is too large"),
            });
        let max_request_head = match parse_size(&l.max_request_head) {
            Ok(n) if LIMIT_HEAD_RANGE.contains(&n) => Some(n as usize),
            Ok(_) => self.fail("limits.max_request_head", "must be from 1KiB to 512KiB"),
            Err(message) => self.fail("limits.max_request_head", message),
        };
        (self.problems.len() == before).then_some(())?;
        Some(LimitsConfig {
            header_timeout: header_timeout?,
            idle_timeout: idle_timeout?,
            max_connections: max_connections?,
            max_connections_per_address: max_connections_per_address?,
            upstream_timeout: upstream_timeout?,
            max_request_head: max_request_head?,
        })
    }

    pub(super) fn event(&mut self, e: raw::Event) -> Option<EventConfig> {
        let instant = |v: &mut Validator, path: &str, text: &str| match event::parse_time(text) {
            Ok(t) => Some(t),
            Err(why) => v.fail(path, format!("'{text}' is not an RFC 3339 time ({why}), e.g. 2026-12-24T10:00:00Z")),
        };
        let opens_at = instant(self, "event.opens_at", &e.opens_at);
        let prequeue = self.duration("event.prequeue", &e.prequeue);
        let closes_at = match &e.closes_at {
            Some(text) => Some(instant(self, "event.closes_at", text)?),
            None => None,
        };
        let opens_at = opens_at?;
        if closes_at.is_some_and(|c| c <= opens_at) {
            return self.fail("event.closes_at", "must be after event.opens_at");
        }
        Some(EventConfig { opens_at, prequeue: prequeue?, closes_at, shuffle: e.shuffle })
    }

    pub(super) fn page(&mut self, p: raw::Page, folder: &Path) -> Option<PageConfig> {
        let url_like = |url: &str| !url.is_empty() && !url.contains(['"', '<', '>', '\'', ' ']);
        if !url_like(&p.ready_url) {
            return self.fail("page.ready_url", "must be a URL or path without quotes, spaces or angle brackets");
        }
        if !p.sign_in_url.is_empty() && !url_like(&p.sign_in_url) {
            return self.fail("page.sign_in_url", "must be a URL or path without quotes, spaces or angle brackets");
        }
        let template = match p.template_file.trim() {
            "" => None,
            file => {
                let path = folder.join(file);
                match crate::page::template::Template::load(&path) {
                    Ok(template) => Some(template),
                    Err(why) => return self.fail("page.template_file", format!("{}: {why}", path.display())),
                }
            }
        };
        let mut texts = crate::page::texts::TextOverrides::default();
        for (lang, overrides) in p.texts {
            match crate::page::texts::Lang::from_code(&lang) {
                None => self.fail::<()>(&format!("page.texts.{lang}"), "not a language of the page (en, ko)"),
                Some(code) => {
                    for (key, text) in overrides {
                        if crate::page::texts::Lang::En.has_text(&key) {
                            texts.insert(code, key, text);
                        } else {
                            self.fail::<()>(&format!("page.texts.{lang}.{key}"), "not a text of the page (see assets/i18n/en.json)");
                        }
                    }
                    Some(())
                }
            };
        }
        Some(PageConfig { ready_url: p.ready_url, enabled: p.enabled, texts, template, sign_in_url: p.sign_in_url })
    }

    /// The token is read here, once: a variable that is named but unset or empty would leave an
    /// admin API nobody can use, so it is refused like a missing JWT secret. So is one with
    /// whitespace at either end (a secret file's trailing newline): no client sends that in a
    /// bearer header, and trimming it quietly would make a different token than the one stored.
    /// The value itself is never part of a message.
    pub(super) fn admin(&mut self, a: raw::Admin) -> Option<AdminConfig> {
        let token_env = a.token_env.map(|name| name.trim().to_owned());
        let token = match token_env.as_deref() {
            None => None,
            Some("") => return self.fail("admin.token_env", "must name an environment variable (or leave the key out)"),
            Some(name) => match self.env_var(name) {
                Some(value) if !value.is_empty() => {
                    let value = std::os::unix::ffi::OsStringExt::into_vec(value);
                    let text = String::from_utf8_lossy(&value);
                    if text.trim() != text {
                        return self.fail(
                            "admin.token_env",
                            format!("environment variable {name} starts or ends with whitespace (a trailing newline?): remove it"),
                        );
                    }
                    Some(Secret(value))
                }
                Some(_) => return self.fail("admin.token_env", format!("environment variable {name} is empty")),
                None => return self.fail("admin.token_env", format!("environment variable {name} is not set")),
            },
        };
        let listen = match a.listen.as_deref() {
            None => None,
            Some(text) => Some(self.socket_addr("admin.listen", text)?),
        };
        Some(AdminConfig { token, token_env, origin_commands: a.origin_commands, listen })
    }

    /// `bypass`: every CIDR parsed, the header's name checked and its secret read (once, here).
    pub(super) fn bypass(&mut self, b: raw::Bypass) -> Option<BypassConfig> {
        let before = self.problems.len();
        let mut addresses = Vec::with_capacity(b.addresses.len());
        for (i, text) in b.addresses.iter().enumerate() {
            match Cidr::parse(text.trim()) {
                Some(cidr) => addresses.push(cidr),
                None => self.fail::<()>(&format!("bypass.addresses[{i}]"), format!("'{text}' is not a CIDR (e.g. 10.0.0.0/8)"))
                    .unwrap_or_default(),
            }
        }
        let header = match b.header {
            None => None,
            Some(h) => {
                let name = self.header_name("bypass.header.name", h.name.trim());
                let secret = self.env_secret("bypass.header.secret_env", &h.secret_env);
                Some(BypassHeader { name: name?, secret: secret? })
            }
        };
        (self.problems.len() == before).then_some(BypassConfig { addresses, header })
    }
}

