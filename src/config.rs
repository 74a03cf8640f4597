//! The configuration: what operators write (`raw`, serde structs that refuse unknown keys) kept
//! apart from what the code uses (`Config`, typed and validated), joined by one function,
//! [`Config::from_raw`].
//!
//! Every problem is collected, structural (an unknown key, a string where a number belongs, see
//! [`structure`]) and semantic alike, so an operator fixing a file on sale day sees all of them at
//! once, each with its key path.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::num::{NonZeroU32, NonZeroU64};
use std::path::Path;
use std::time::Duration;

use http::{HeaderName, Method};

use crate::rules::{Cidr, PollTier};

pub mod schema;
mod structure;

mod identity;
pub use crate::identity::IdentityConfig;
pub use identity::{JwtConfig, TokenSource};

mod event;
pub use event::{format_time, parse_time, EventConfig, Phase};
pub use raw::{RoomMode, UnknownOutcome};

/// The shortest admission interval served: the ticker and the Redis schedule count in
/// microseconds, but below a millisecond a tick's own round trip is the interval.
const MIN_INTERVAL: Duration = Duration::from_millis(1);
/// Longer intervals (and token lifetimes) than a day are typos, and a duration of years would
/// overflow the microsecond and millisecond counts handed to Redis.
const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);
const MAX_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest a status poll may be held: load balancers commonly give up on a request that has
/// not answered within 60 s, and a client would see that as an error rather than its place.
const MAX_HOLD: Duration = Duration::from_secs(60);
/// Every tick hands the admit script one fresh token per place in the batch (Lua has no secure
/// randomness): 10,000 is about 370 KB per call. A higher rate takes a shorter interval.
const MAX_BATCH: u32 = 10_000;

/// One problem in a configuration file, named by its key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a configuration could not be used: every problem found, the file's structure (in file
/// order) before its values (in the order of the contract's sections).
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.problems.iter().map(Problem::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl ConfigError {
    fn one(path: &str, message: impl Into<String>) -> Self {
        ConfigError { problems: vec![Problem { path: path.into(), message: message.into() }] }
    }
}

/// The user-facing shape of `proxy.yaml`. Durations and addresses stay strings here so that
/// [`Config::from_raw`] can report a bad one with its key path instead of a serde type error.
///
/// These structs are also the source of the file's JSON Schema (`waitroom --print-schema`,
/// [`schema`]): each field's doc comment is what an editor shows for its key, so they speak to
/// operators; `#[schemars(with = ...)]` names what a text field holds (a duration, a size).
/// Adding a key is adding its field here, then regenerating `docs/proxy.schema.json`.
pub mod raw {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::schema::{Algorithm, Duration, Match, Percent, Size, Time};

    /// The configuration of one waitroom proxy (`proxy.yaml`). Every key but `upstream` has a
    /// default.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Config {
        /// Where clients connect: ip:port.
        #[serde(default = "d_listen")]
        pub listen: String,
        /// Where /metrics, /healthz, /readyz and the admin API are served: ip:port.
        #[serde(default = "d_metrics_listen")]
        pub metrics_listen: String,
        /// The unmodified order API, host:port.
        #[schemars(required, with = "String")]
        pub upstream: Option<String>,
        /// The Redis that holds the room: exactly one of `url`, `cluster` or `sentinel`.
        #[serde(default)]
        pub redis: Redis,
        /// Who the user is: a trusted header (the default) or a verified JWT.
        #[serde(default)]
        pub identity: Identity,
        /// The entry token a user gets when admitted.
        #[serde(default)]
        pub token: Token,
        /// Requests that need an entry token; everything else passes through.
        #[serde(default = "d_protected")]
        pub protected: Vec<Route>,
        /// How fast users leave the line.
        #[serde(default)]
        pub admission: Admission,
        /// The line itself.
        #[serde(default)]
        pub queue: Queue,
        /// The proxy's own endpoints.
        #[serde(default)]
        pub endpoints: Endpoints,
        /// How long clients wait between polls: the first tier whose `min_wait` is at most the
        /// estimated wait applies; the last tier must have `min_wait: 0s`.
        #[serde(default = "d_poll_after")]
        pub poll_after: Vec<Tier>,
        /// Stopping on SIGTERM / SIGINT.
        #[serde(default)]
        pub shutdown: Shutdown,
        /// Reloading the file (SIGHUP always reloads it).
        #[serde(default)]
        pub reload: Reload,
        /// Refusing status polls that come earlier than told.
        #[serde(default)]
        pub polling: Polling,
        /// Limits on identities per client address.
        #[serde(default)]
        pub abuse: Abuse,
        /// The waiting page at {endpoints.prefix}/.
        #[serde(default)]
        pub page: Page,
        /// Limits on connections and on the upstream.
        #[serde(default)]
        pub limits: Limits,
        /// A scheduled event: a pre-queue, a fair draw at the opening, a close. Absent: the
        /// room is always open.
        pub event: Option<Event>,
        /// Operator control: the admin API and origin commands.
        #[serde(default)]
        pub admin: Admin,
        /// Requests that skip the room: a protected request from one of these addresses, or
        /// carrying the bypass header with its secret, is forwarded without a token.
        #[serde(default)]
        pub bypass: Bypass,
        /// `active` (the default): the room refuses protected requests without a valid token;
        /// `shadow`: it runs as usual but forwards every protected request, counting those it
        /// would have refused in waitroom_shadow_passed_total.
        #[serde(default)]
        pub mode: RoomMode,
    }

    /// Requests that never wait: the shop's own services, staff, health checks of the order API.
    #[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Bypass {
        /// CIDRs of the client address (the peer, or the X-Forwarded-For entry behind
        /// abuse.trusted_proxies).
        #[serde(default)]
        pub addresses: Vec<String>,
        /// A header whose value must equal the secret held by an environment variable; removed
        /// before the request is forwarded.
        #[serde(default)]
        pub header: Option<BypassHeader>,
    }

    /// `bypass.header`: both keys are required.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct BypassHeader {
        /// The header's name, e.g. X-Waitroom-Bypass.
        pub name: String,
        /// The environment variable that holds the secret the header must carry.
        pub secret_env: String,
    }

    /// `mode`.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub enum RoomMode {
        #[default]
        Active,
        Shadow,
    }

    /// Operator control: the admin API on `metrics_listen` and origin commands.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Admin {
        /// The environment variable that holds the admin API's bearer token; unset key: no
        /// admin API (404).
        #[serde(default)]
        pub token_env: Option<String>,
        /// Whether a protected response's `Waitroom-Command: close|pause` header is obeyed (it is
        /// removed either way).
        #[serde(default = "d_true")]
        pub origin_commands: bool,
        /// ip:port of the admin API's own listener; unset: the admin API is served on
        /// metrics_listen. Set, /admin is not served on metrics_listen.
        #[serde(default)]
        pub listen: Option<String>,
    }

    impl Default for Admin {
        fn default() -> Self {
            Admin { token_env: None, origin_commands: true, listen: None }
        }
    }

    /// The Redis that holds the room: exactly one of `url`, `cluster` or `sentinel` (none: `url`
    /// redis://127.0.0.1:6379). Changing the topology needs a restart.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Redis {
        /// One Redis server: redis://[:password@]host:port[/db], rediss:// or unix://.
        pub url: Option<String>,
        /// Seed nodes of a Redis Cluster: redis://host:port each.
        pub cluster: Option<Vec<String>>,
        /// A Redis Sentinel deployment that names the primary.
        pub sentinel: Option<Sentinel>,
        /// Every key the proxy touches starts with it (in cluster mode inside a {hash tag}).
        #[serde(default = "d_key_prefix")]
        pub key_prefix: String,
        /// A Redis call slower than this counts as unavailable.
        #[serde(default = "d_redis_timeout")]
        #[schemars(with = "Duration")]
        pub timeout: String,
        /// Status reads may go to replicas, slightly stale (cluster or sentinel; a single url has
        /// none).
        #[serde(default)]
        pub read_from_replicas: bool,
    }

    impl Default for Redis {
        fn default() -> Self {
            Redis {
                url: None,
                cluster: None,
                sentinel: None,
                key_prefix: d_key_prefix(),
                timeout: d_redis_timeout(),
                read_from_replicas: false,
            }
        }
    }

    /// A Redis Sentinel deployment: the sentinels name the current primary of `master`.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Sentinel {
        /// The name the sentinels monitor the primary under.
        pub master: String,
        /// The sentinels: redis://host:port each; redis://[user]:password@host:port when the
        /// sentinels require a password (it authenticates to that sentinel only).
        pub addrs: Vec<String>,
        /// The environment variable that holds the password of the primary (and of its
        /// replicas, which take its place on a failover): their `requirepass`, or the ACL user's.
        pub password_env: Option<String>,
        /// The ACL user to log in to the primary as, with `password_env`'s password (absent: the
        /// default user).
        pub username: Option<String>,
    }

    /// Who the user is: `header` (trusted, set by the authentication layer in front) or `jwt`.
    #[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Identity {
        /// The header that names the user (default X-User-Id).
        pub header: Option<String>,
        /// Verify a JWT instead and take the user from one of its claims.
        pub jwt: Option<Jwt>,
    }

    /// A verified JWT names the user.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Jwt {
        /// Where the token is: `authorization` (Bearer) or `cookie:NAME`.
        #[serde(default = "d_jwt_from")]
        pub from: String,
        /// The signature algorithms accepted.
        #[serde(default = "d_jwt_algorithms")]
        #[schemars(with = "Vec<Algorithm>")]
        pub algorithms: Vec<String>,
        /// HS256: the environment variable that holds the secret.
        pub secret_env: Option<String>,
        /// RS256 / ES256: the PEM public key, relative to this file's folder.
        pub public_key_file: Option<String>,
        /// The claim that names the user.
        #[serde(default = "d_jwt_claim")]
        pub claim: String,
        /// When set, the token must carry this `iss`.
        pub issuer: Option<String>,
        /// When set, the token must carry this `aud`.
        pub audience: Option<String>,
        /// How far past `exp` (or before `nbf`) a token is still accepted.
        #[serde(default = "d_jwt_leeway")]
        #[schemars(with = "Duration")]
        pub leeway: String,
        /// The header the upstream gets the verified identity in (any value the client sent is
        /// replaced).
        #[serde(default = "d_jwt_forward_header")]
        pub forward_header: String,
    }

    /// The entry token an admitted user gets.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Token {
        /// The request header that carries it.
        #[serde(default = "d_token_header")]
        pub header: String,
        /// How long a token lives (for tokens issued after a reload).
        #[serde(default = "d_token_ttl")]
        #[schemars(with = "Duration")]
        pub ttl: String,
        /// How long a protected request's claim on a token holds when nobody ends it (a proxy
        /// that died mid-request); longer than `limits.upstream_timeout`.
        #[serde(default = "d_claim_timeout")]
        #[schemars(with = "Duration")]
        pub claim_timeout: String,
        /// What an order whose outcome is unknown (sent, and no status line came back) does to
        /// its token: `spend` (the upstream may have placed it) or `release` (for an order API
        /// that deduplicates orders on the token header).
        #[serde(default)]
        pub unknown_outcome: UnknownOutcome,
        /// Whether a 3xx answer to a protected request spends its token (an order API that
        /// answers a placed order with a redirect, POST then 303).
        #[serde(default)]
        pub spend_on_redirect: bool,
    }

    impl Default for Token {
        fn default() -> Self {
            Token {
                header: d_token_header(),
                ttl: d_token_ttl(),
                claim_timeout: d_claim_timeout(),
                unknown_outcome: UnknownOutcome::default(),
                spend_on_redirect: false,
            }
        }
    }

    /// `token.unknown_outcome`.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub enum UnknownOutcome {
        #[default]
        Spend,
        Release,
    }

    /// A protected request: its method and its path.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Route {
        /// An HTTP method, any case (GET, POST, PUT, DELETE, PATCH, HEAD, OPTIONS, CONNECT, TRACE).
        pub method: String,
        /// The path, starting with /, matched on the request's canonical path ignoring case,
        /// `;` parameters and one trailing /.
        pub path: String,
        /// `exact` (the default): the path itself; `prefix`: the path and everything below it.
        #[serde(default, rename = "match")]
        #[schemars(with = "Option<Match>")]
        pub matching: Option<String>,
    }

    /// Admission: every `interval`, at most `batch_size` users leave the front of the line.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Admission {
        /// One admission tick per interval (1ms to 24h).
        #[serde(default = "d_interval")]
        #[schemars(with = "Duration")]
        pub interval: String,
        /// Users admitted per tick at most (1 to 10000); with `adaptive`, the ceiling.
        #[serde(default = "d_batch_size")]
        pub batch_size: i64,
        /// A new user who finds nobody waiting, while this interval still has room, gets READY at
        /// once from enter.
        #[serde(default)]
        pub instant: bool,
        /// Above 0: admit only while fewer than this many tokens are live.
        #[serde(default)]
        pub max_active: i64,
        /// Let the batch follow the protected upstream's latency. Absent: the batch stays
        /// `batch_size`.
        pub adaptive: Option<Adaptive>,
    }

    impl Default for Admission {
        fn default() -> Self {
            Admission {
                interval: d_interval(),
                batch_size: d_batch_size(),
                instant: false,
                max_active: 0,
                adaptive: None,
            }
        }
    }

    /// The batch moves between `min_batch` and `admission.batch_size` to keep the protected
    /// upstream's p95 latency at the target.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Adaptive {
        /// The protected upstream's p95 latency to keep, as the room's proxies see it.
        #[serde(default = "d_target_p95")]
        #[schemars(with = "Duration")]
        pub target_p95: String,
        /// The smallest batch (at most `admission.batch_size`).
        #[serde(default = "d_min_batch")]
        pub min_batch: i64,
    }

    /// The line.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Queue {
        /// Waiting users at most; beyond it enter answers 429 FULL.
        #[serde(default = "d_capacity")]
        pub capacity: i64,
        /// The Retry-After sent with FULL (429) and 503.
        #[serde(default = "d_retry_after")]
        #[schemars(with = "Duration")]
        pub retry_after: String,
        /// Above 0s: a waiting user not heard from (enter or status) for this long loses the
        /// place; at least twice the longest poll_after.
        #[serde(default = "d_zero")]
        #[schemars(with = "Duration")]
        pub abandon_after: String,
    }

    impl Default for Queue {
        fn default() -> Self {
            Queue { capacity: d_capacity(), retry_after: d_retry_after(), abandon_after: d_zero() }
        }
    }

    /// The proxy's own endpoints.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Endpoints {
        /// {prefix}/enter, {prefix}/status, {prefix}/event and the page at {prefix}/.
        #[serde(default = "d_prefix")]
        pub prefix: String,
        /// A status call from a user whose estimated wait is within this (rounded up to whole
        /// seconds) is held open until the user is admitted (READY) or this has passed (WAITING,
        /// pollAfter 0); 0s never holds; at most 60s.
        #[serde(default = "d_hold")]
        #[schemars(with = "Duration")]
        pub hold: String,
    }

    impl Default for Endpoints {
        fn default() -> Self {
            Endpoints { prefix: d_prefix(), hold: d_hold() }
        }
    }

    /// One tier of `poll_after`.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Tier {
        /// The tier applies from this estimated wait on.
        #[schemars(with = "Duration")]
        pub min_wait: String,
        /// What clients are told to wait before their next poll (rounded up to seconds).
        #[schemars(with = "Duration")]
        pub poll_after: String,
    }

    /// Stopping on SIGTERM / SIGINT.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Shutdown {
        /// In-flight requests get this long to finish.
        #[serde(default = "d_grace")]
        #[schemars(with = "Duration")]
        pub grace: String,
    }

    impl Default for Shutdown {
        fn default() -> Self {
            Shutdown { grace: d_grace() }
        }
    }

    /// Reloading the file.
    #[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Reload {
        /// true: a change of the file reloads it too (SIGHUP always does).
        #[serde(default)]
        pub watch: bool,
    }

    /// Refusing status polls that come earlier than the pollAfter last given.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Polling {
        /// true: a status call earlier than told gets 429 TOO_EARLY.
        #[serde(default)]
        pub enforce: bool,
        /// How much earlier than pollAfter is still accepted (0% to 99%).
        #[serde(default = "d_polling_grace")]
        #[schemars(with = "Percent")]
        pub grace: String,
    }

    impl Default for Polling {
        fn default() -> Self {
            Polling { enforce: false, grace: d_polling_grace() }
        }
    }

    /// Limits on identities per client address (only enter is limited).
    #[derive(Debug, Default, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Abuse {
        /// Above 0: at most this many distinct identities may enter per minute from one client
        /// address.
        #[serde(default)]
        pub identities_per_address: i64,
        /// CIDRs whose X-Forwarded-For is believed when finding the client address.
        #[serde(default)]
        pub trusted_proxies: Vec<String>,
    }

    /// The waiting page at {endpoints.prefix}/.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Page {
        /// Where READY users continue (the link carries the token in its #fragment).
        #[serde(default = "d_ready_url")]
        pub ready_url: String,
        /// false: the page's path passes through to the upstream.
        #[serde(default = "d_true")]
        pub enabled: bool,
        /// Per language (en, ko), overrides of the page's texts: `{ ko: { title: "..." } }`;
        /// the text names are those of assets/i18n/en.json.
        #[serde(default)]
        pub texts: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
        /// The shop's own HTML page (at most 256 KiB, relative to this file's folder), served
        /// instead of the built-in one: it holds the data-waitroom hooks and a </body>, before
        /// which the proxy inserts its script. Empty: the built-in page.
        #[serde(default)]
        pub template_file: String,
        /// Where a user without an identity (401) is sent to sign in; empty: no link.
        #[serde(default)]
        pub sign_in_url: String,
    }

    impl Default for Page {
        fn default() -> Self {
            Page {
                ready_url: d_ready_url(),
                enabled: true,
                texts: Default::default(),
                template_file: String::new(),
                sign_in_url: String::new(),
            }
        }
    }

    /// Limits on connections and on the upstream.
    // Durations and sizes stay text, checked (with their key path) by `Validator::limits`.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Limits {
        /// A connection that has not sent a whole request head by then is closed (100ms to 24h).
        #[serde(default = "d_header_timeout")]
        #[schemars(with = "Duration")]
        pub header_timeout: String,
        /// A keep-alive connection with no request for this long is closed (100ms to 24h).
        #[serde(default = "d_idle_timeout")]
        #[schemars(with = "Duration")]
        pub idle_timeout: String,
        /// Beyond it, new connections are refused.
        #[serde(default = "d_max_connections")]
        pub max_connections: i64,
        /// Above 0: at most this many connections open at once from one client address, the TCP
        /// peer's IP (no header has been read when a connection opens); 0: no such limit.
        #[serde(default)]
        pub max_connections_per_address: i64,
        /// An upstream that has not answered by then gets the client a 504 (100ms to 24h).
        #[serde(default = "d_upstream_timeout")]
        #[schemars(with = "Duration")]
        pub upstream_timeout: String,
        /// A larger request line + headers gets 431 (1KiB to 512KiB).
        #[serde(default = "d_max_request_head")]
        #[schemars(with = "Size")]
        pub max_request_head: String,
    }

    impl Default for Limits {
        fn default() -> Self {
            Limits {
                header_timeout: d_header_timeout(),
                idle_timeout: d_idle_timeout(),
                max_connections: d_max_connections(),
                max_connections_per_address: 0,
                upstream_timeout: d_upstream_timeout(),
                max_request_head: d_max_request_head(),
            }
        }
    }

    /// A scheduled event: early users wait in a pre-queue, drawn into the line at the opening.
    // Times stay text, checked (with their key path) by `Validator::event`.
    #[derive(Debug, Deserialize, Serialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Event {
        /// When the line opens.
        #[schemars(with = "Time")]
        pub opens_at: String,
        /// enter is accepted from opens_at - prequeue on.
        #[serde(default = "d_prequeue")]
        #[schemars(with = "Duration")]
        pub prequeue: String,
        /// No new users from then on.
        #[schemars(with = "Option<Time>")]
        pub closes_at: Option<String>,
        /// false: the pre-queue keeps arrival order instead of a checkable random draw.
        #[serde(default = "d_true")]
        pub shuffle: bool,
    }

    fn d_prequeue() -> String {
        s("30m")
    }

    fn s(v: &str) -> String {
        v.to_string()
    }
    fn d_listen() -> String {
        s("0.0.0.0:8080")
    }
    fn d_metrics_listen() -> String {
        s("127.0.0.1:8079")
    }
    fn d_key_prefix() -> String {
        s("waitroom")
    }
    fn d_redis_timeout() -> String {
        s("500ms")
    }
    fn d_jwt_from() -> String {
        s("authorization")
    }
    fn d_jwt_algorithms() -> Vec<String> {
        vec![s("HS256")]
    }
    fn d_jwt_claim() -> String {
        s("sub")
    }
    fn d_jwt_forward_header() -> String {
        s("X-User-Id")
    }
    fn d_jwt_leeway() -> String {
        s("30s")
    }
    fn d_token_header() -> String {
        s("X-Entry-Token")
    }
    fn d_claim_timeout() -> String {
        s("60s")
    }
    fn d_token_ttl() -> String {
        s("5m")
    }
    fn d_protected() -> Vec<Route> {
        vec![Route { method: s("POST"), path: s("/api/orders"), matching: None }]
    }
    fn d_interval() -> String {
        s("100ms")
    }
    fn d_batch_size() -> i64 {
        10
    }
    fn d_target_p95() -> String {
        s("300ms")
    }
    fn d_min_batch() -> i64 {
        1
    }
    fn d_capacity() -> i64 {
        100_000
    }
    fn d_retry_after() -> String {
        s("30s")
    }
    fn d_zero() -> String {
        s("0s")
    }
    fn d_prefix() -> String {
        s("/queue")
    }
    fn d_hold() -> String {
        s("2s")
    }
    fn d_poll_after() -> Vec<Tier> {
        [("60s", "10s"), ("10s", "5s"), ("0s", "2s")]
            .into_iter()
            .map(|(m, p)| Tier { min_wait: s(m), poll_after: s(p) })
            .collect()
    }
    fn d_grace() -> String {
        s("10s")
    }
    fn d_polling_grace() -> String {
        s("20%")
    }
    fn d_ready_url() -> String {
        s("/checkout")
    }
    fn d_true() -> bool {
        true
    }
    fn d_header_timeout() -> String {
        s("10s")
    }
    fn d_idle_timeout() -> String {
        s("60s")
    }
    fn d_max_connections() -> i64 {
        10_000
    }
    fn d_upstream_timeout() -> String {
        s("30s")
    }
    fn d_max_request_head() -> String {
        s("32KiB")
    }
}

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
    /// `mode` (section 18): one of the keys a room will have of its own (section 17), top-level
    /// for the one room there is today.
    pub mode: RoomMode,
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
pub struct Secret(Vec<u8>);

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

/// `limits` (contract section 16), enforced by [`crate::limits`] and the proxy's upstream peer.
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

    fn parse_with(text: &str, folder: &Path, env: Env) -> Result<Config, ConfigError> {
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
struct Validator {
    problems: Vec<Problem>,
    env: Env,
}

impl Validator {
    /// The environment variable `name`, unless secrets are not read at all ([`Env::Skip`]).
    fn env_var(&self, name: &str) -> Option<std::ffi::OsString> {
        match self.env {
            Env::Read => std::env::var_os(name),
            Env::Skip => Some(UNREAD_SECRET.into()),
        }
    }

    /// A secret that an `*_env` key names: a variable set and not empty (an empty one would be a
    /// secret anybody guesses), without whitespace at either end (a secret file's trailing
    /// newline: no client can send that in a header, whose value HTTP trims).
    fn env_secret(&mut self, path: &str, name: &str) -> Option<Secret> {
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

    fn fail<T>(&mut self, path: &str, message: impl Into<String>) -> Option<T> {
        self.problems.push(Problem { path: path.to_string(), message: message.into() });
        None
    }

    fn duration(&mut self, path: &str, text: &str) -> Option<Duration> {
        match humantime::parse_duration(text.trim()) {
            Ok(d) => Some(d),
            Err(_) => self.fail(
                path,
                format!("'{text}' is not a duration (write a number with a unit: 100ms, 2s, 5m, 1h)"),
            ),
        }
    }

    fn positive_duration(&mut self, path: &str, text: &str) -> Option<Duration> {
        let d = self.duration(path, text)?;
        if d.is_zero() {
            return self.fail(path, "must be greater than 0");
        }
        Some(d)
    }

    /// A duration within `min..=max`, both shown in the message when it is not.
    fn bounded_duration(&mut self, path: &str, text: &str, min: Duration, max: Duration) -> Option<Duration> {
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

    fn positive(&mut self, path: &str, value: i64) -> Option<u64> {
        if value < 1 {
            return self.fail(path, "must be at least 1");
        }
        Some(value as u64)
    }

    fn non_negative(&mut self, path: &str, value: i64) -> Option<u64> {
        if value < 0 {
            return self.fail(path, "must be 0 or more");
        }
        Some(value as u64)
    }

    fn batch(&mut self, path: &str, value: i64) -> Option<NonZeroU32> {
        let v = self.positive(path, value)?;
        match u32::try_from(v).ok().and_then(NonZeroU32::new) {
            Some(n) => Some(n),
            None => self.fail(path, "is too large"),
        }
    }

    fn socket_addr(&mut self, path: &str, text: &str) -> Option<SocketAddr> {
        match text.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => self.fail(path, format!("'{text}' is not an address (write ip:port, e.g. 0.0.0.0:8080)")),
        }
    }

    fn host_port(&mut self, path: &str, text: &str) -> Option<()> {
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

    fn redis_url(&mut self, path: &str, text: &str) -> Option<String> {
        match redis::parse_redis_url(text) {
            Some(_) if text.starts_with("redis://") || text.starts_with("rediss://") || text.starts_with("unix://") || text.starts_with("redis+unix://") => {
                Some(text.to_string())
            }
            _ => self.fail(path, format!("'{text}' is not a Redis URL (redis://host:port)")),
        }
    }

    fn redis(&mut self, r: raw::Redis) -> Option<RedisConfig> {
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
    fn node_auth(&mut self, username: Option<String>, password_env: Option<String>) -> Option<NodeAuth> {
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

    fn header_name(&mut self, path: &str, text: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(text.as_bytes()) {
            Ok(h) if !text.is_empty() => Some(h),
            _ => self.fail(path, format!("'{text}' is not an HTTP header name")),
        }
    }

    fn identity(&mut self, i: raw::Identity, folder: &Path) -> Option<IdentityConfig> {
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
    fn jwt(&mut self, j: raw::Jwt, folder: &Path) -> Option<JwtConfig> {
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

    fn routes(&mut self, routes: Vec<raw::Route>) -> Option<Vec<crate::paths::Rule>> {
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

    fn admission(&mut self, a: raw::Admission) -> Option<AdmissionConfig> {
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

    fn endpoint_prefix(&mut self, prefix: &str) -> Option<String> {
        if !prefix.starts_with('/') {
            return self.fail("endpoints.prefix", "must start with /");
        }
        // "/queue/" and "/queue" name the same endpoints: {prefix}/enter is built from it.
        Some(prefix.trim_end_matches('/').to_string())
    }

    fn tiers(&mut self, tiers: Vec<raw::Tier>) -> Option<Vec<PollTier>> {
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

    fn polling(&mut self, p: raw::Polling) -> Option<PollingConfig> {
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

    fn abuse(&mut self, a: raw::Abuse) -> Option<AbuseConfig> {
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
    fn limits(&mut self, l: raw::Limits) -> Option<LimitsConfig> {
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

    fn event(&mut self, e: raw::Event) -> Option<EventConfig> {
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

    fn page(&mut self, p: raw::Page, folder: &Path) -> Option<PageConfig> {
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
    fn admin(&mut self, a: raw::Admin) -> Option<AdminConfig> {
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
    fn bypass(&mut self, b: raw::Bypass) -> Option<BypassConfig> {
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

/// The timeouts of `limits` that are served as written.
pub const LIMIT_TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(100)..=Duration::from_secs(24 * 3600);
/// The `limits.max_request_head` values that are served as written (bytes).
pub const LIMIT_HEAD_RANGE: std::ops::RangeInclusive<u64> = 1024..=512 * 1024;

/// A size with a unit: `B`, `KiB` (1024 B) or `MiB` (1024 KiB), e.g. `32KiB`, `512 B`.
/// `KB`, `MB`, `k` and friends are refused rather than guessed: nginx reads `32k` as 32768 bytes,
/// SI as 32000, and an operator should not have to know which one this file means.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let hint = "write a number with a unit: 512B, 32KiB, 1MiB";
    let Ok(number) = number.parse::<u64>() else {
        return Err(format!("'{text}' is not a size ({hint})"));
    };
    let factor = match unit.trim() {
        "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        "" => return Err(format!("'{text}' needs a unit ({hint})")),
        u if ["k", "K", "KB", "kB", "kb", "m", "M", "MB", "mb"].contains(&u) => {
            return Err(format!(
                "'{text}' is ambiguous (1000 or 1024?): write {number}KiB or {number}MiB for powers of 1024, or the bytes with B"
            ))
        }
        _ => return Err(format!("'{text}' is not a size ({hint})")),
    };
    number.checked_mul(factor).ok_or_else(|| format!("'{text}' is too large"))
}

fn is_standard_method(m: &Method) -> bool {
    [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ]
    .contains(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(yaml: &str) -> Vec<String> {
        match Config::parse(yaml) {
            Ok(_) => vec![],
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::parse("upstream: 127.0.0.1:8081").unwrap();
        assert_eq!(c.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(c.metrics_listen, "127.0.0.1:8079".parse().unwrap());
        assert_eq!(c.redis.target, RedisTarget::Url("redis://127.0.0.1:6379".into()));
        assert_eq!(c.redis.key_prefix, "waitroom");
        assert_eq!(c.redis.timeout, Duration::from_millis(500));
        assert!(matches!(&c.identity, IdentityConfig::Header(h) if h == "x-user-id"));
        assert_eq!(c.token.header, "x-entry-token");
        assert_eq!(c.token.ttl, Duration::from_secs(300));
        let order = crate::paths::Rule::new(Method::POST, "/api/orders", crate::paths::PathMatch::Exact).unwrap();
        assert_eq!(c.protected, vec![order]);
        assert_eq!(c.admission.interval, Duration::from_millis(100));
        assert_eq!(c.admission.batch_size.get(), 10);
        assert_eq!(c.queue.capacity.get(), 100_000);
        assert_eq!(c.queue.retry_after, Duration::from_secs(30));
        assert_eq!(c.endpoints.prefix, "/queue");
        let tiers: Vec<(u64, u64)> =
            c.poll_after.iter().map(|t| (t.min_wait.as_secs(), t.poll_after.as_secs())).collect();
        assert_eq!(tiers, vec![(60, 10), (10, 5), (0, 2)]);
        assert_eq!(c.shutdown_grace, Duration::from_secs(10));
        assert!(!c.reload_watch);
        assert_eq!(
            c.limits,
            LimitsConfig {
                header_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(60),
                max_connections: 10_000,
                max_connections_per_address: 0,
                upstream_timeout: Duration::from_secs(30),
                max_request_head: 32 * 1024,
            }
        );
    }

    #[test]
    fn sizes_need_an_unambiguous_unit() {
        assert_eq!(parse_size("32KiB"), Ok(32768));
        assert_eq!(parse_size(" 512 B "), Ok(512));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert!(parse_size("32KB").unwrap_err().contains("ambiguous"));
        assert!(parse_size("32k").unwrap_err().contains("32KiB"));
        assert!(parse_size("32768").unwrap_err().contains("needs a unit"));
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("-1KiB").is_err());
        assert!(parse_size("99999999999999999999MiB").is_err());
        assert!(parse_size("18446744073709551615MiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn limits_that_would_break_serving_are_refused_with_their_path() {
        let got = problems(
            "upstream: a:1\nlimits: {header_timeout: 0s, idle_timeout: 50ms, upstream_timeout: 30d, \
             max_connections: 0, max_request_head: 100B}",
        );
        assert_eq!(
            got,
            vec![
                "limits.header_timeout: must be from 100ms to 24h",
                "limits.idle_timeout: must be from 100ms to 24h",
                "limits.upstream_timeout: must be from 100ms to 24h",
                "limits.max_connections: must be at least 1",
                "limits.max_request_head: must be from 1KiB to 512KiB",
            ]
        );
        let got = problems("upstream: a:1\nlimits: {max_request_head: 2MB, max_connections: 99999999999}");
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("limits.max_connections: is too large"), "{got:?}");
        assert!(got[1].starts_with("limits.max_request_head: '2MB' is ambiguous"), "{got:?}");
        assert!(problems("upstream: a:1\nlimits: {max_request_hed: 1KiB}")[0].starts_with("limits.max_request_hed: unknown key"));
    }

    #[test]
    fn the_connections_per_address_limit_is_off_at_zero_and_never_negative() {
        let c = Config::parse("upstream: a:1\nlimits: {max_connections_per_address: 100}").unwrap();
        assert_eq!(c.limits.max_connections_per_address, 100);
        assert_eq!(
            problems("upstream: a:1\nlimits: {max_connections_per_address: -1}"),
            vec!["limits.max_connections_per_address: must be 0 or more"]
        );
        let got = problems("upstream: a:1\nlimits: {max_connections_per_address: 99999999999}");
        assert_eq!(got, vec!["limits.max_connections_per_address: is too large"]);
    }

    #[test]
    fn the_shipped_proxy_yaml_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("proxy.yaml");
        Config::load(&path).unwrap();
    }

    #[test]
    fn every_semantic_problem_is_reported_with_its_path() {
        let got = problems(
            "upstream: nope\nlisten: 'x'\nadmission: {batch_size: 0, interval: 0s}\nqueue: {capacity: 0}\n\
             token: {ttl: 0s}\nprotected: [{method: FETCH, path: api}]\npoll_after: [{min_wait: 5s, poll_after: 1s}]",
        );
        let paths: Vec<&str> = got.iter().map(|l| l.split(':').next().unwrap()).collect();
        assert_eq!(
            paths,
            vec![
                "listen",
                "upstream",
                "token.ttl",
                "protected[0].method",
                "protected[0].path",
                "admission.interval",
                "admission.batch_size",
                "queue.capacity",
                "poll_after[0].min_wait"
            ],
            "{got:#?}"
        );
        assert!(got.contains(&"admission.batch_size: must be at least 1".to_string()));
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_their_path() {
        assert_eq!(
            problems("upstream: a:1\nadmission: {batch_sise: 3}"),
            vec![
                "admission.batch_sise: unknown key, did you mean `batch_size`? (known keys: `interval`, \
                 `batch_size`, `instant`, `max_active`, `adaptive`)"
            ]
        );
        let got = problems("upstream: a:1\nfoo: 1");
        assert!(got.len() == 1 && got[0].starts_with("foo: unknown key (known keys: `listen`, "), "{got:?}");
        assert_eq!(
            problems("upstream: a:1\nqueue: {capacity: lots}"),
            vec!["queue.capacity: expected a whole number, found string \"lots\""]
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_reported_together() {
        assert_eq!(
            problems("upstream: a:1\nadmission: {intervall: 1s, batch_size: 0}\nfoo: 1"),
            vec![
                "admission.intervall: unknown key, did you mean `interval`? (known keys: `interval`, \
                 `batch_size`, `instant`, `max_active`, `adaptive`)",
                "foo: unknown key (known keys: `listen`, `metrics_listen`, `upstream`, `redis`, \
                 `identity`, `token`, `protected`, `admission`, `queue`, `endpoints`, `poll_after`, \
                 `shutdown`, `reload`, `polling`, `abuse`, `page`, `limits`, `event`, `admin`, `bypass`, `mode`)",
                "admission.batch_size: must be at least 1",
            ]
        );
        // A rule cut for its bad method leaves the next one first in the list, but the problems
        // still name each rule by its place in the file.
        assert_eq!(
            problems("upstream: a:1\nprotected: [{method: [1], path: /a}, {method: FETCH, path: /x}, {path: /y}]"),
            vec![
                "protected[0].method: expected a string, found sequence",
                "protected[2].method: is required",
                "protected[1].method: 'FETCH' is not an HTTP method",
            ]
        );
        // The default that replaced a cut value is not checked against the file.
        assert_eq!(
            problems("upstream: a:1\npoll_after: [{min_wait: 5s}]"),
            vec!["poll_after[0].poll_after: is required"]
        );
    }

    #[test]
    fn missing_upstream_is_an_error() {
        assert_eq!(problems(""), vec!["upstream: is required (host:port of the order API)"]);
    }

    #[test]
    fn the_operator_endpoints_never_share_the_proxys_port() {
        // A shared port would serve /metrics' 405s to users, or the room to Prometheus.
        for (listen, metrics) in [("127.0.0.1:9000", "127.0.0.1:9000"), ("0.0.0.0:9000", "127.0.0.1:9000"), ("127.0.0.2:9000", "[::]:9000")] {
            assert_eq!(
                problems(&format!("upstream: a:1\nlisten: \"{listen}\"\nmetrics_listen: \"{metrics}\"")),
                vec![format!("metrics_listen: must not share its port with listen ({listen})")],
                "{listen} and {metrics}"
            );
        }
        for (listen, metrics) in [("127.0.0.1:9000", "127.0.0.1:9001"), ("127.0.0.1:9000", "127.0.0.2:9000"), ("0.0.0.0:9000", "[::1]:9000")] {
            assert_eq!(problems(&format!("upstream: a:1\nlisten: \"{listen}\"\nmetrics_listen: \"{metrics}\"")), Vec::<String>::new());
        }
    }

    #[test]
    fn durations_need_units() {
        assert_eq!(
            problems("upstream: a:1\ntoken: {ttl: '300'}"),
            vec!["token.ttl: '300' is not a duration (write a number with a unit: 100ms, 2s, 5m, 1h)"]
        );
    }

    #[test]
    fn redis_takes_exactly_one_topology() {
        let got = problems("upstream: a:1\nredis: {url: 'redis://a:1', cluster: ['redis://b:2']}");
        assert_eq!(got, vec!["redis: takes exactly one of url, cluster or sentinel"]);
        assert!(!problems("upstream: a:1\nredis: {url: 'http://x'}").is_empty());

        let c = Config::parse("upstream: a:1\nredis: {cluster: ['redis://b:2', 'redis://c:3'], read_from_replicas: true}")
            .unwrap();
        assert_eq!(c.redis.target, RedisTarget::Cluster(vec!["redis://b:2".into(), "redis://c:3".into()]));
        assert!(c.redis.read_from_replicas);
        let c = Config::parse("upstream: a:1\nredis: {sentinel: {master: m, addrs: ['redis://s:26379']}}").unwrap();
        assert_eq!(
            c.redis.target,
            RedisTarget::Sentinel {
                master: "m".into(),
                addrs: vec!["redis://s:26379".into()],
                auth: NodeAuth::default()
            }
        );
        assert_eq!(
            problems("upstream: a:1\nredis: {cluster: []}"),
            vec!["redis.cluster: needs at least one seed node"]
        );
        assert_eq!(
            problems("upstream: a:1\nredis: {sentinel: {master: '', addrs: ['unix:///tmp/s', 'x']}}"),
            vec![
                "redis.sentinel.master: must not be empty",
                "redis.sentinel.addrs[0]: 'unix:///tmp/s' must be a TCP address (redis://host:port)",
                "redis.sentinel.addrs[1]: 'x' is not a Redis URL (redis://host:port)",
            ]
        );
    }

    #[test]
    fn the_sentinel_primary_s_password_is_read_from_the_environment() {
        std::env::set_var("WAITROOM_CONFIG_TEST_PRIMARY_PW", "s3cret");
        std::env::set_var("WAITROOM_CONFIG_TEST_EMPTY_PW", "");
        let sentinel = |extra: &str| {
            format!("upstream: a:1\nredis: {{sentinel: {{master: m, addrs: ['redis://:pw@s:26379']{extra}}}}}")
        };
        let c = Config::parse(&sentinel(", password_env: WAITROOM_CONFIG_TEST_PRIMARY_PW, username: app")).unwrap();
        let RedisTarget::Sentinel { addrs, auth, .. } = &c.redis.target else { panic!("{:?}", c.redis.target) };
        assert_eq!(addrs, &["redis://:pw@s:26379"]);
        assert_eq!(auth.username.as_deref(), Some("app"));
        assert_eq!(auth.password.as_ref().map(Secret::expose), Some(&b"s3cret"[..]));
        assert!(!format!("{c:?}").contains("s3cret"), "the password never reaches a log line");
        for (extra, line) in [
            (", password_env: WAITROOM_CONFIG_TEST_UNSET_PW", "redis.sentinel.password_env: environment variable WAITROOM_CONFIG_TEST_UNSET_PW is not set"),
            (", password_env: WAITROOM_CONFIG_TEST_EMPTY_PW", "redis.sentinel.password_env: environment variable WAITROOM_CONFIG_TEST_EMPTY_PW is empty"),
            (", password_env: ' '", "redis.sentinel.password_env: must name an environment variable (or leave the key out)"),
            (", username: app", "redis.sentinel.username: needs redis.sentinel.password_env (a user logs in with a password)"),
        ] {
            assert_eq!(problems(&sentinel(extra)), vec![line], "{extra}");
        }
    }

    #[test]
    fn an_admin_token_with_whitespace_at_either_end_is_refused_without_showing_it() {
        let admin = |name: &str| format!("upstream: a:1\nadmin: {{token_env: {name}}}");
        std::env::set_var("WAITROOM_CONFIG_TEST_ADMIN_OK", "tok-3f1c");
        let c = Config::parse(&admin("WAITROOM_CONFIG_TEST_ADMIN_OK")).unwrap();
        assert_eq!(c.admin.token.as_ref().map(Secret::expose), Some(&b"tok-3f1c"[..]));
        for (i, value) in ["tok-3f1c\n", "tok-3f1c\r\n", " tok-3f1c", "\ttok-3f1c", "tok-3f1c\u{a0}", "\n"].iter().enumerate() {
            let name = format!("WAITROOM_CONFIG_TEST_ADMIN_WS{i}");
            std::env::set_var(&name, value);
            let got = problems(&admin(&name));
            assert_eq!(
                got,
                vec![format!("admin.token_env: environment variable {name} starts or ends with whitespace (a trailing newline?): remove it")],
                "{value:?}"
            );
            assert!(!got[0].contains("tok-3f1c"), "the token never reaches a message: {got:?}");
        }
        // Inside the token, whitespace is the operator's choice.
        std::env::set_var("WAITROOM_CONFIG_TEST_ADMIN_INNER", "tok 3f1c");
        assert!(problems(&admin("WAITROOM_CONFIG_TEST_ADMIN_INNER")).is_empty());
    }

    #[test]
    fn one_server_has_no_replicas_to_read_from() {
        let refused = "redis.read_from_replicas: needs replicas: redis.cluster or redis.sentinel (with url every call goes to that server)";
        for redis in ["{url: 'redis://a:1', read_from_replicas: true}", "{read_from_replicas: true}"] {
            assert_eq!(problems(&format!("upstream: a:1\nredis: {redis}")), vec![refused], "{redis}");
        }
        let c = Config::parse("upstream: a:1\nredis: {sentinel: {master: m, addrs: ['redis://s:26379']}, read_from_replicas: true}")
            .unwrap();
        assert!(c.redis.read_from_replicas);
    }

    #[test]
    fn abandon_after_must_cover_twice_the_longest_poll() {
        for short in ["5s", "19s", "19999ms"] {
            let got = problems(&format!("upstream: a:1\nqueue: {{abandon_after: {short}}}"));
            assert!(got[0].starts_with("queue.abandon_after"), "{short}: {got:?}");
        }
        assert!(problems("upstream: a:1\nqueue: {abandon_after: 20s}").is_empty());
        assert!(problems("upstream: a:1\nqueue: {abandon_after: 0s}").is_empty());
        // Told in whole seconds: a 1.5 s tier is a 2 s pollAfter, so 4 s is the floor.
        let tiers = "poll_after: [{min_wait: 0s, poll_after: 1500ms}]";
        assert!(!problems(&format!("upstream: a:1\n{tiers}\nqueue: {{abandon_after: 3s}}")).is_empty());
        assert!(problems(&format!("upstream: a:1\n{tiers}\nqueue: {{abandon_after: 4s}}")).is_empty());
    }

    #[test]
    fn protected_rules_take_a_match_and_any_case_of_method() {
        use crate::paths::{PathMatch, Rule};
        let c = Config::parse("upstream: a:1\nprotected: [{method: post, path: /api/orders/, match: prefix}]").unwrap();
        assert_eq!(c.protected, vec![Rule::new(Method::POST, "/api/orders", PathMatch::Prefix).unwrap()]);
        let got = problems(
            "upstream: a:1\nprotected: [{method: POST, path: /a, match: fuzzy}, {method: POST, path: '/a/%zz'}, {method: POST, path: /../x}]",
        );
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].starts_with("protected[0].match"), "{got:?}");
        assert!(got[1].starts_with("protected[1].path") && got[2].starts_with("protected[2].path"), "{got:?}");
    }

    #[test]
    fn a_claim_outlasts_the_upstream_timeout() {
        let got = problems("upstream: a:1\ntoken: {claim_timeout: 30s}");
        assert!(got.len() == 1 && got[0].starts_with("token.claim_timeout"), "{got:?}");
        assert!(problems("upstream: a:1\ntoken: {claim_timeout: 2s}\nlimits: {upstream_timeout: 1s}").is_empty());
    }

    #[test]
    fn values_that_would_stop_admission_are_refused() {
        for (yaml, key) in [
            ("admission: {interval: 200us}", "admission.interval"),
            ("admission: {interval: 25h}", "admission.interval"),
            ("admission: {batch_size: 10001}", "admission.batch_size"),
            ("token: {ttl: 25h}", "token.ttl"),
        ] {
            let got = problems(&format!("upstream: a:1\n{yaml}"));
            assert!(got.len() == 1 && got[0].starts_with(key), "{yaml}: {got:?}");
        }
        assert!(problems("upstream: a:1\nadmission: {interval: 1ms, batch_size: 10000}\ntoken: {ttl: 24h}").is_empty());
    }

    #[test]
    fn bypass_and_mode_problems_name_their_key() {
        std::env::set_var("WAITROOM_CONFIG_UNIT_BYPASS", "s3cret");
        std::env::set_var("WAITROOM_CONFIG_UNIT_EMPTY", "");
        std::env::set_var("WAITROOM_CONFIG_UNIT_NEWLINE", "s3cret\n");
        std::env::remove_var("WAITROOM_CONFIG_UNIT_UNSET");
        for (yaml, want) in [
            ("bypass: {header: {name: X-B, secret_env: WAITROOM_CONFIG_UNIT_UNSET}}", "bypass.header.secret_env: environment variable WAITROOM_CONFIG_UNIT_UNSET is not set"),
            ("bypass: {header: {name: X-B, secret_env: WAITROOM_CONFIG_UNIT_EMPTY}}", "bypass.header.secret_env: environment variable WAITROOM_CONFIG_UNIT_EMPTY is empty"),
            ("bypass: {header: {name: X-B}}", "bypass.header.secret_env: is required"),
            ("bypass: {header: {name: X-B, secret_env: WAITROOM_CONFIG_UNIT_NEWLINE}}", "bypass.header.secret_env: environment variable WAITROOM_CONFIG_UNIT_NEWLINE starts or ends with whitespace"),
            ("bypass: {header: {secret_env: WAITROOM_CONFIG_UNIT_BYPASS}}", "bypass.header.name: is required"),
            ("bypass: {header: {name: 'X B', secret_env: WAITROOM_CONFIG_UNIT_BYPASS}}", "bypass.header.name: 'X B' is not an HTTP header name"),
            ("bypass: {addresses: [10.0.0.0/8, 10.0.0.0/33]}", "bypass.addresses[1]: '10.0.0.0/33' is not a CIDR (e.g. 10.0.0.0/8)"),
            ("mode: rehearsal", "mode: unknown variant `rehearsal`, expected `active` or `shadow`"),
            ("admin: {listen: 'nowhere'}", "admin.listen"),
            ("admin: {listen: '127.0.0.1:8080'}", "admin.listen: must not share its port with listen (0.0.0.0:8080)"),
        ] {
            let got = problems(&format!("upstream: a:1\n{yaml}"));
            assert!(got.len() == 1 && got[0].starts_with(want), "{yaml}: {got:?}");
        }
        let c = Config::parse(
            "upstream: a:1\nmode: shadow\nbypass: {addresses: ['192.168.0.0/16'], header: {name: X-B, secret_env: WAITROOM_CONFIG_UNIT_BYPASS}}",
        )
        .unwrap();
        assert_eq!(c.mode, RoomMode::Shadow);
        assert_eq!(c.bypass.header.unwrap().secret.expose(), b"s3cret");
        assert_eq!(Config::parse("upstream: a:1").unwrap().mode, RoomMode::Active);
    }

    #[test]
    fn no_env_checks_everything_but_the_secrets() {
        std::env::remove_var("WAITROOM_CONFIG_UNIT_NOENV");
        let yaml = "upstream: a:1\nadmin: {token_env: WAITROOM_CONFIG_UNIT_NOENV}\n\
                    bypass: {header: {name: X-B, secret_env: WAITROOM_CONFIG_UNIT_NOENV}}\n\
                    identity: {jwt: {secret_env: WAITROOM_CONFIG_UNIT_NOENV}}";
        assert_eq!(problems(yaml).len(), 3);
        assert!(Config::parse_with(yaml, Path::new(""), Env::Skip).is_ok());
        // Everything else is still checked, names of variables included.
        let bad = format!("{yaml}\nqueue: {{capacity: 0}}\nadmin: {{token_env: ' '}}");
        assert!(Config::parse_with(&bad, Path::new(""), Env::Skip).is_err());
        let got = Config::parse_with("upstream: a:1\nqueue: {capacity: 0}", Path::new(""), Env::Skip).unwrap_err();
        assert_eq!(got.problems[0].path, "queue.capacity");
    }
}
