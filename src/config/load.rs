//! Loading: a file or text in, a [`Config`] or every problem out. The structure is checked
//! first ([`super::structure`]), then each value ([`super::validate`]).

use std::net::{SocketAddr, ToSocketAddrs};
use std::num::NonZeroU64;
use std::path::Path;

use super::rooms;
use super::validate::{Env, Validator};
use super::*;

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with(path, Env::Read)
    }

    /// [`Config::load`], reading the secrets `*_env` keys name or not (`--check --no-env`).
    pub fn load_with(path: &Path, env: Env) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one("", format!("cannot read {}: {e}", path.display())))?;
        // A relative `identity.jwt.public_key_file` is read from the configuration's folder.
        Config::parse_with(&text, path.parent().unwrap_or(Path::new("")), env)
    }

    /// Parses and validates configuration text; relative paths in it are read from the working
    /// directory.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_in(text, Path::new(""))
    }

    /// Parses and validates configuration text whose relative paths start at `folder`.
    pub fn parse_in(text: &str, folder: &Path) -> Result<Config, ConfigError> {
        Config::parse_with(text, folder, Env::Read)
    }

    pub(super) fn parse_with(text: &str, folder: &Path, env: Env) -> Result<Config, ConfigError> {
        let top = Config::parse_one(text, folder, env);
        let rooms = rooms::read(text, folder, env);
        match (top, rooms) {
            (Ok(mut config), Ok(rooms)) => {
                config.rooms = rooms;
                Ok(config)
            }
            (Ok(_), Err(problems)) => Err(ConfigError { problems }),
            (Err(mut e), Err(problems)) => {
                e.problems.extend(problems);
                Err(e)
            }
            (Err(e), Ok(_)) => Err(e),
        }
    }

    /// One configuration document, its `rooms` left aside: the top level, or one room's merged
    /// document (see [`super::rooms`]).
    pub(super) fn parse_one(text: &str, folder: &Path, env: Env) -> Result<Config, ConfigError> {
        let mut read = structure::read(text);
        let mut problems = std::mem::take(&mut read.problems);
        if let Some(raw) = read.raw.take() {
            match Config::from_raw_with(raw, folder, env) {
                Ok(config) if problems.is_empty() => return Ok(config),
                Ok(_) => {}
                Err(e) => problems.extend(
                    e.problems
                        .into_iter()
                        .map(|p| Problem { path: read.in_file(&p.path), message: p.message })
                        .filter(|p| !read.covers(&p.path)),
                ),
            }
        }
        Err(ConfigError { problems })
    }

    /// [`Config::from_raw_in`] with relative paths read from the working directory.
    pub fn from_raw(raw: raw::Config) -> Result<Config, ConfigError> {
        Config::from_raw_in(raw, Path::new(""))
    }

    /// The one place where what operators write becomes what the code uses. Relative paths
    /// (`identity.jwt.public_key_file`) start at `folder`; key material is read and parsed here,
    /// once, so that no request does file I/O or key parsing.
    pub fn from_raw_in(raw: raw::Config, folder: &Path) -> Result<Config, ConfigError> {
        Config::from_raw_with(raw, folder, Env::Read)
    }

    fn from_raw_with(raw: raw::Config, folder: &Path, env: Env) -> Result<Config, ConfigError> {
        let mut v = Validator { problems: Vec::new(), env };

        let listen = v.socket_addr("listen", &raw.listen);
        let metrics_listen = v.socket_addr("metrics_listen", &raw.metrics_listen);
        let upstream = match raw.upstream {
            None => v.fail("upstream", "is required (host:port of the order API)"),
            Some(u) => v.host_port("upstream", &u).map(|_| u),
        };
        let redis = v.redis(raw.redis);
        let identity = v.identity(raw.identity, folder);
        let token_header = v.header_name("token.header", &raw.token.header);
        let ttl = v.bounded_duration("token.ttl", &raw.token.ttl, Duration::from_millis(1), MAX_TOKEN_TTL);
        let claim_timeout =
            v.bounded_duration("token.claim_timeout", &raw.token.claim_timeout, Duration::from_millis(1), MAX_TOKEN_TTL);
        let protected = v.routes(raw.protected);
        let admission = v.admission(raw.admission);
        let capacity = v.positive("queue.capacity", raw.queue.capacity);
        let retry_after = v.positive_duration("queue.retry_after", &raw.queue.retry_after);
        let abandon_after = v.duration("queue.abandon_after", &raw.queue.abandon_after);
        let prefix = v.endpoint_prefix(&raw.endpoints.prefix);
        let hold = v.bounded_duration("endpoints.hold", &raw.endpoints.hold, Duration::ZERO, MAX_HOLD);
        let poll_after = v.tiers(raw.poll_after);
        let shutdown_grace = v.duration("shutdown.grace", &raw.shutdown.grace);
        let polling = v.polling(raw.polling);
        let abuse = v.abuse(raw.abuse);
        let page = v.page(raw.page, folder);
        let limits = v.limits(raw.limits);
        let admin = v.admin(raw.admin);
        let event = raw.event.map(|e| v.event(e));
        let bypass = v.bypass(raw.bypass);

        if let (Some(proxy), Some(operator)) = (listen, metrics_listen) {
            // Never both served: one of the two binds waits for the other. A wildcard address
            // takes its port on every address of its family, and `[::]` on IPv4's too (dual stack).
            let overlap = shares_port(proxy, operator);
            if overlap {
                v.fail::<()>("metrics_listen", format!("must not share its port with listen ({proxy})"));
            }
            if let Some(admin) = admin.as_ref().and_then(|a| a.listen) {
                for (key, other) in [("listen", proxy), ("metrics_listen", operator)] {
                    if shares_port(admin, other) {
                        v.fail::<()>("admin.listen", format!("must not share its port with {key} ({other})"));
                    }
                }
            }
        }
        if let (Some(abandon), Some(tiers)) = (abandon_after, poll_after.as_ref()) {
            // What users are told: answers carry whole seconds, rounded up.
            let longest = tiers
                .iter()
                .map(|t| Duration::from_secs(crate::rules::ceil_secs(t.poll_after)))
                .max()
                .unwrap_or_default();
            // Twice: a user who polls as told is late by network delays and the page's jitter,
            // and one lost poll must not cost the place.
            let floor = longest * 2;
            if !abandon.is_zero() && abandon < floor {
                v.fail::<()>(
                    "queue.abandon_after",
                    format!(
                        "must be 0s or at least twice the longest poll_after ({}), or users who poll as told are dropped",
                        humantime::format_duration(floor)
                    ),
                );
            }
        }
        if let (Some(claim), Some(limits)) = (claim_timeout, limits.as_ref()) {
            // A claim that ends while its order is still at the upstream would let a parallel
            // request through: it must outlast the longest wait for an answer.
            if claim <= limits.upstream_timeout {
                v.fail::<()>(
                    "token.claim_timeout",
                    format!(
                        "must be longer than limits.upstream_timeout ({})",
                        humantime::format_duration(limits.upstream_timeout)
                    ),
                );
            }
        }
        if v.problems.is_empty() {
            // Every Option below is Some when no problem was recorded.
            let unwrap = "validated above";
            Ok(Config {
                listen: listen.expect(unwrap),
                metrics_listen: metrics_listen.expect(unwrap),
                upstream: upstream.expect(unwrap),
                redis: redis.expect(unwrap),
                identity: identity.expect(unwrap),
                token: TokenConfig {
                    header: token_header.expect(unwrap),
                    ttl: ttl.expect(unwrap),
                    claim_timeout: claim_timeout.expect(unwrap),
                    unknown_outcome: raw.token.unknown_outcome,
                    spend_on_redirect: raw.token.spend_on_redirect,
                },
                protected: protected.expect(unwrap),
                admission: admission.expect(unwrap),
                queue: QueueConfig {
                    capacity: NonZeroU64::new(capacity.expect(unwrap)).expect(unwrap),
                    retry_after: retry_after.expect(unwrap),
                    abandon_after: abandon_after.expect(unwrap),
                },
                endpoints: EndpointsConfig { prefix: prefix.expect(unwrap), hold: hold.expect(unwrap) },
                poll_after: poll_after.expect(unwrap),
                shutdown_grace: shutdown_grace.expect(unwrap),
                reload_watch: raw.reload.watch,
                polling: polling.expect(unwrap),
                abuse: abuse.expect(unwrap),
                page: page.expect(unwrap),
                limits: limits.expect(unwrap),
                admin: admin.expect(unwrap),
                event: event.map(|e| e.expect(unwrap)),
                bypass: bypass.expect(unwrap),
                mode: raw.mode,
                rooms: Vec::new(),
            })
        } else {
            Err(ConfigError { problems: v.problems })
        }
    }

    /// Resolves `upstream` to the address connections go to.
    pub fn resolve_upstream(&self) -> std::io::Result<SocketAddr> {
        self.upstream.to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "upstream resolved to no address")
        })
    }
}

/// Whether two listeners could never both be served: one of the two binds waits for the other.
/// A wildcard address takes its port on every address of its family, and `[::]` on IPv4's too
/// (dual stack).
fn shares_port(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |wild: SocketAddr, other: SocketAddr| wild.ip().is_unspecified() && (wild.is_ipv6() || other.is_ipv4());
    a.port() == b.port() && (a.ip() == b.ip() || covers(a, b) || covers(b, a))
}
