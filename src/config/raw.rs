//! The user-facing shape of `proxy.yaml`. Durations and addresses stay strings here so that
//! [`Config::from_raw`] can report a bad one with its key path instead of a serde type error.
//!
//! These structs are also the source of the file's JSON Schema (`waitroom --print-schema`,
//! [`schema`]): each field's doc comment is what an editor shows for its key, so they speak to
//! operators; `#[schemars(with = ...)]` names what a text field holds (a duration, a size).
//! Adding a key is adding its field here, then regenerating `docs/proxy.schema.json`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema::kinds::{Algorithm, Duration, Match, Percent, Size, Time};

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
    /// Several rooms in one proxy, each with its own line, rate, tokens and schedule. Absent:
    /// one room, `default`, from the top-level keys. The top-level values of a room's keys are
    /// every room's defaults; a room's own keys replace them key by key.
    #[serde(default)]
    pub rooms: Option<Vec<Room>>,
}

/// One room of `rooms`: what it has of its own. Each key left out takes the top-level value;
/// a mapping given (`admission: {batch_size: 5}`) replaces only the keys it names.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Room {
    /// 1-32 of a-z, 0-9 and -, unique: names the room in Redis keys, metrics and the admin API.
    #[schemars(regex(pattern = r"^[a-z0-9-]{1,32}$"))]
    pub name: String,
    /// Only requests whose Host is this (case-insensitive, port ignored); unset: any host.
    #[serde(default)]
    pub host: Option<String>,
    /// This room's endpoints (its own prefix).
    #[serde(default)]
    pub endpoints: Option<Endpoints>,
    /// This room's protected requests.
    #[serde(default)]
    pub protected: Option<Vec<Route>>,
    /// How fast users leave this room's line.
    #[serde(default)]
    pub admission: Option<Admission>,
    /// This room's line.
    #[serde(default)]
    pub queue: Option<Queue>,
    /// This room's token lifetimes (the header is the proxy's).
    #[serde(default)]
    pub token: Option<RoomToken>,
    /// This room's poll tiers.
    #[serde(default)]
    pub poll_after: Option<Vec<Tier>>,
    /// This room's enforced polling.
    #[serde(default)]
    pub polling: Option<Polling>,
    /// This room's limits on identities per client address.
    #[serde(default)]
    pub abuse: Option<Abuse>,
    /// This room's scheduled event.
    #[serde(default)]
    pub event: Option<Event>,
    /// This room's waiting page.
    #[serde(default)]
    pub page: Option<Page>,
    /// Where this room's protected requests go, host:port; unset: the top-level upstream.
    #[serde(default)]
    pub upstream: Option<String>,
}

/// A room's `token`: the lifetimes; `token.header` and the rest are the proxy's.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoomToken {
    /// How long this room's tokens live.
    #[serde(default)]
    #[schemars(with = "Option<Duration>")]
    pub ttl: Option<String>,
    /// How long a claim on this room's tokens holds when nobody ends it.
    #[serde(default)]
    #[schemars(with = "Option<Duration>")]
    pub claim_timeout: Option<String>,
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
