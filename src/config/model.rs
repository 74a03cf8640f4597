//! The validated configuration the code runs with: typed values (durations, addresses, non-zero
//! counts) made from the raw file by [`super::Config::from_raw`], so nothing downstream parses text.

use std::fmt;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use http::HeaderName;

use super::{EventConfig, IdentityConfig, RoomMode, UnknownOutcome};
use crate::rules::{Cidr, PollTier};

/// The validated configuration the proxy runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    /// As written (`host:port`); resolved once at start-up.
    pub upstream: String,
    pub redis: RedisConfig,
    pub identity: IdentityConfig,
    pub token: TokenConfig,
    /// Compiled once per load (canonical paths, see [`crate::paths`]).
    pub protected: Vec<crate::paths::Rule>,
    pub admission: AdmissionConfig,
    pub queue: QueueConfig,
    pub endpoints: EndpointsConfig,
    pub poll_after: Vec<PollTier>,
    pub shutdown_grace: Duration,
    pub reload_watch: bool,
    pub polling: PollingConfig,
    pub abuse: AbuseConfig,
    pub page: PageConfig,
    pub limits: LimitsConfig,
    pub event: Option<EventConfig>,
    pub admin: AdminConfig,
    /// `bypass` (contract section 18): belongs to the proxy, checked before any room's rules.
    pub bypass: BypassConfig,
    /// `mode` (section 18).
    pub mode: RoomMode,
    /// `rooms` (section 17), in the file's order; empty without `rooms`: the one room `default`
    /// is this configuration itself.
    pub rooms: Vec<RoomConfig>,
}

/// One room of `rooms`: its name, its host, and the whole configuration it runs with (the
/// top-level keys with the room's own in their place; its proxy-wide keys are the top level's).
#[derive(Debug, Clone)]
pub struct RoomConfig {
    pub name: String,
    /// Lowercase, without a port.
    pub host: Option<String>,
    pub config: Config,
}

/// `bypass`: who skips the room.
#[derive(Debug, Clone, Default)]
pub struct BypassConfig {
    pub addresses: Vec<Cidr>,
    pub header: Option<BypassHeader>,
}

impl BypassConfig {
    /// Whether any rule is configured: without one, a request costs no look at all.
    pub fn is_set(&self) -> bool {
        !self.addresses.is_empty() || self.header.is_some()
    }
}

/// `bypass.header`: the header and the secret (read once, at load) it must carry.
#[derive(Debug, Clone)]
pub struct BypassHeader {
    pub name: HeaderName,
    pub secret: Secret,
}

/// `admin` (contract section 15): the admin API on `metrics_listen` and origin commands.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// The bearer token the admin API wants, read from the variable `admin.token_env` names;
    /// `None`: no admin API (404).
    pub token: Option<Secret>,
    /// The variable's name, for the command-line client's messages.
    pub token_env: Option<String>,
    /// Whether a protected response's `Waitroom-Command` is obeyed (it is removed either way).
    pub origin_commands: bool,
    /// `admin.listen`: the admin API's own address; `None`: it is served on `metrics_listen`.
    pub listen: Option<SocketAddr>,
}

/// A value that must never reach a log line: its `Debug` shows only that it is set.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub(super) Vec<u8>);

impl Secret {
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Url(String),
    Cluster(Vec<String>),
    Sentinel {
        master: String,
        addrs: Vec<String>,
        /// How the proxy logs in to the primary; the sentinels' own credentials are in `addrs`.
        auth: NodeAuth,
    },
}

/// A login to the Redis nodes behind the sentinels (`redis.sentinel.username`, `.password_env`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAuth {
    pub username: Option<String>,
    /// Read from the variable `password_env` names, once, at load.
    pub password: Option<Secret>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub target: RedisTarget,
    pub key_prefix: String,
    pub timeout: Duration,
    pub read_from_replicas: bool,
}

#[derive(Debug, Clone)]
pub struct TokenConfig {
    pub header: HeaderName,
    pub ttl: Duration,
    /// How long a protected request's claim on a token holds when nobody ends it (a proxy that
    /// died mid-request); never past the token's own expiry.
    pub claim_timeout: Duration,
    /// Whether an order sent upstream with no status line back spends its token.
    pub unknown_outcome: UnknownOutcome,
    /// Whether a 3xx answer spends the token, as a 2xx does.
    pub spend_on_redirect: bool,
}

impl TokenConfig {
    /// What spends a token besides a 2xx.
    pub fn spend_terms(&self) -> crate::rules::SpendTerms {
        crate::rules::SpendTerms {
            on_redirect: self.spend_on_redirect,
            on_unknown: self.unknown_outcome == UnknownOutcome::Spend,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    pub interval: Duration,
    pub batch_size: NonZeroU32,
    pub instant: bool,
    pub max_active: u64,
    pub adaptive: Option<AdaptiveConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    pub target_p95: Duration,
    pub min_batch: NonZeroU32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub capacity: NonZeroU64,
    pub retry_after: Duration,
    pub abandon_after: Duration,
}

#[derive(Debug, Clone)]
pub struct EndpointsConfig {
    pub prefix: String,
    /// A waiting user whose estimated wait is at most this (in whole seconds) has their status
    /// poll held open until admitted or until it passes; zero never holds.
    pub hold: Duration,
}

#[derive(Debug, Clone)]
pub struct PollingConfig {
    pub enforce: bool,
    /// Fraction of pollAfter that may be skipped (0.2 for "20%").
    pub grace: f64,
}

#[derive(Debug, Clone)]
pub struct AbuseConfig {
    pub identities_per_address: u32,
    pub trusted_proxies: Vec<Cidr>,
}

/// `limits` (contract section 16), enforced by [`crate::connection`] and the proxy's upstream peer.
/// Every one is read per connection or per request, so a reload applies to what starts after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// Open connections from one peer IP at most; 0: no limit.
    pub max_connections_per_address: usize,
    pub upstream_timeout: Duration,
    /// Bytes of request line + headers (the blank line included).
    pub max_request_head: usize,
}

#[derive(Debug, Clone)]
pub struct PageConfig {
    pub ready_url: String,
    pub enabled: bool,
    /// `page.texts`, checked: only the page's languages and the keys its texts have.
    pub texts: crate::page::texts::TextOverrides,
    /// `page.template_file`, read and checked at load: the shop's page, split where the proxy's
    /// script goes. `None`: the built-in page.
    pub template: Option<crate::page::template::Template>,
    /// `page.sign_in_url`; empty: the page offers no sign-in link.
    pub sign_in_url: String,
}
