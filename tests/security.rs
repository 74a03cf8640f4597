//! Nobody gets in where they do not belong (issue 7; contract sections 3, 8 and 9), checked from
//! the outside against a real Redis and the real binary:
//!
//! - verified identity: JWTs (HS256, RS256, ES256; bearer header or cookie) that are forged,
//!   expired beyond the leeway, for another audience or issuer, unsigned (`none`), signed with an
//!   algorithm the configuration does not list (algorithm confusion included), or that name no
//!   usable user are refused; the configuration errors of section 8 exit 2;
//! - enforced polling: early status calls get 429 TOO_EARLY, on-time ones do not, a refused call
//!   does not restart the clock, a null pollAfter enforces nothing, and enforcement costs no Redis
//!   round trip;
//! - anti-hoarding: the (N+1)th identity from one address in a minute is LIMITED, X-Forwarded-For
//!   is believed only from trusted proxies, and a new window starts afresh;
//! - token hygiene: tokens are bound to their user and never logged;
//! - limits on slow or huge requests.
//!
//! Key pairs are made per test with the `openssl` command line tool, so no private key is
//! committed.

mod common;

use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---- helpers --------------------------------------------------------------------------------

const SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";

fn now() -> i64 {
    jsonwebtoken::get_current_timestamp() as i64
}

fn sign(alg: Algorithm, key: &EncodingKey, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).expect("sign test token")
}

fn hs256(claims: &Value) -> String {
    hs256_jwt(SECRET, claims)
}

/// An unsigned token: header `{"alg":"none"}`, empty signature.
fn unsigned(claims: &Value) -> String {
    use base64_url as b64;
    format!(
        "{}.{}.",
        b64::encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64::encode(claims.to_string().as_bytes())
    )
}

/// Enough base64url for a JWT part, without another dependency.
mod base64_url {
    pub fn encode(bytes: &[u8]) -> String {
        const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
            for i in 0..=chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }
}

/// `openssl args...` in `dir`; panics with its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (needed to make test key pairs)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh key pair: (private key PEM, public key PEM).
struct KeyPair {
    private: String,
    public: String,
}

fn key_pair(kind: &str) -> KeyPair {
    let dir = tempfile::tempdir().unwrap();
    match kind {
        "rsa" => openssl(
            dir.path(),
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "key.pem",
            ],
        ),
        "ec" => openssl(
            dir.path(),
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                "key.pem",
            ],
        ),
        other => panic!("unknown key kind {other}"),
    }
    openssl(
        dir.path(),
        &["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"],
    );
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    KeyPair {
        private: read("key.pem"),
        public: read("pub.pem"),
    }
}

/// The same RSA public key as PKCS#1 (`BEGIN RSA PUBLIC KEY`).
fn rsa_pkcs1_public(private_pem: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key.pem"), private_pem).unwrap();
    openssl(
        dir.path(),
        &[
            "rsa",
            "-in",
            "key.pem",
            "-RSAPublicKey_out",
            "-out",
            "pub1.pem",
        ],
    );
    std::fs::read_to_string(dir.path().join("pub1.pem")).unwrap()
}

async fn enter_bearer(p: &Proxy, token: &str) -> Resp {
    send(p.client().post(p.url("/queue/enter")).bearer_auth(token)).await
}

/// Each `(what, jwt)`, presented as a bearer token to enter, is refused: 401 and an error body.
async fn assert_refused_bearers(p: &Proxy, cases: &[(&str, String)]) {
    for (what, jwt) in cases {
        assert_error(what, &enter_bearer(p, jwt).await, 401);
    }
}

async fn status_bearer(p: &Proxy, token: &str) -> Resp {
    send(p.client().get(p.url("/queue/status")).bearer_auth(token)).await
}

/// WAITING in a room that admits one user an hour (NO_ADMISSION) with one 2 s poll tier.
fn waiting(position: u64) -> Value {
    waiting_no_admission(position, 2, 2)
}

/// `waitroom --config <dir>/conf/proxy.yaml --check` run from another working directory, so a
/// relative key path can only resolve against the configuration's folder.
fn check_in_folder(yaml: &str, files: &[(&str, &str)], env: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");
    for (rel, contents) in files {
        let path = conf.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("proxy.yaml"), yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .arg("--config")
        .arg(conf.join("proxy.yaml"))
        .arg("--check")
        .env_remove("WAITROOM_JWT_SECRET")
        .envs(env.iter().copied())
        .current_dir(dir.path())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits, if needed, until the current one-minute window has at least `need` seconds left, so
/// a test that counts within one window never straddles two.
async fn with_window_left(redis: &RedisServer, need: u64) {
    minute_left(&mut redis.conn().await, need).await;
}

async fn now_ms(redis: &RedisServer) -> u64 {
    redis_now_ms(&mut redis.conn().await).await as u64
}

// ---- verified identity (section 8) ----------------------------------------------------------

fn hs256_room(redis: &RedisServer, api: &DemoApi) -> ProxyBuilder {
    Proxy::builder(&redis.url(), api.addr())
        .yaml(NO_ADMISSION)
        .yaml("poll_after: [{min_wait: 0s, poll_after: 2s}]")
        .yaml(
            "identity: {jwt: {from: authorization, algorithms: [HS256], secret_env: WAITROOM_JWT_SECRET, \
             claim: sub, issuer: 'https://id.example', audience: shop, leeway: 30s}}",
        )
        .env("WAITROOM_JWT_SECRET", SECRET)
}

fn claims(sub: Value) -> Value {
    json!({"sub": sub, "iss": "https://id.example", "aud": "shop", "exp": now() + 300})
}

#[tokio::test]
async fn hs256_jwts_are_verified() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let p = hs256_room(&redis, &api)
        .start_settled(&redis.conn().await)
        .await;

    let alice = hs256(&claims(json!("alice")));
    let bob = hs256(&claims(json!("bob")));
    for (what, jwt, position) in [
        ("valid token", &alice, 1),
        ("same user again", &alice, 1),
        ("another user", &bob, 2),
    ] {
        assert_answer(what, &enter_bearer(&p, jwt).await, 200, waiting(position));
    }
    // The X-User-Id header means nothing in JWT mode.
    let r = send(
        p.client()
            .post(p.url("/queue/enter"))
            .header("X-User-Id", "alice"),
    )
    .await;
    assert_error("no token, only the trusted header", &r, 401);

    let with = |key: &str, value: Value| {
        let mut c = claims(json!("carol"));
        if value.is_null() {
            c.as_object_mut().unwrap().remove(key);
        } else {
            c[key] = value;
        }
        c
    };
    let forged = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(b"not-the-secret-but-just-as-long!!!!").unwrap(),
        &claims(json!("carol")),
    );
    let mut tampered: Vec<String> = alice.split('.').map(str::to_owned).collect();
    tampered[1] = base64_url::encode(claims(json!("mallory")).to_string().as_bytes());
    let hs384 = sign(
        Algorithm::HS384,
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        &claims(json!("carol")),
    );
    let refused: Vec<(&str, String)> = vec![
        ("forged signature", forged),
        (
            "payload swapped under alice's signature",
            tampered.join("."),
        ),
        (
            "expired beyond the leeway",
            hs256(&with("exp", json!(now() - 120))),
        ),
        (
            "not valid before a minute from now",
            hs256(&with("nbf", json!(now() + 120))),
        ),
        ("wrong audience", hs256(&with("aud", json!("another-shop")))),
        (
            "wrong issuer",
            hs256(&with("iss", json!("https://evil.example"))),
        ),
        ("no issuer", hs256(&with("iss", Value::Null))),
        ("no audience", hs256(&with("aud", Value::Null))),
        ("alg none", unsigned(&claims(json!("carol")))),
        ("alg HS384 (not configured)", hs384),
        ("claim missing", hs256(&with("sub", Value::Null))),
        ("claim a number", hs256(&with("sub", json!(42)))),
        (
            "claim an object",
            hs256(&with("sub", json!({"id": "carol"}))),
        ),
        ("claim empty", hs256(&with("sub", json!("")))),
        ("exp not a number", hs256(&with("exp", json!("tomorrow")))),
        ("not a JWT", "hello".to_string()),
        ("two parts", "aGVsbG8.d29ybGQ".to_string()),
    ];
    for (what, token) in &refused {
        assert_error(what, &enter_bearer(&p, token).await, 401);
        assert_error(
            &format!("{what} (status)"),
            &status_bearer(&p, token).await,
            401,
        );
    }
    for (what, auth) in [
        ("Basic scheme", format!("Basic {alice}")),
        ("empty bearer", "Bearer ".into()),
    ] {
        let r = send(
            p.client()
                .post(p.url("/queue/enter"))
                .header("Authorization", auth),
        )
        .await;
        assert_error(what, &r, 401);
    }

    // Within the leeway an expired token still counts.
    let late = hs256(&with("exp", json!(now() - 10)));
    assert_answer(
        "expired within the leeway",
        &enter_bearer(&p, &late).await,
        200,
        waiting(3),
    );

    // The identity rules of section 3 apply to the claim's value.
    let long = hs256(&with("sub", json!("x".repeat(300))));
    assert_error("claim of 300 chars", &enter_bearer(&p, &long).await, 400);
    let accented = hs256(&with("sub", json!("caf\u{e9}")));
    assert_error(
        "claim outside printable ASCII",
        &enter_bearer(&p, &accented).await,
        400,
    );
    let max = hs256(&with("sub", json!("y".repeat(256))));
    assert_answer(
        "claim of 256 chars",
        &enter_bearer(&p, &max).await,
        200,
        waiting(4),
    );

    // The wrong method is answered before the identity is looked at.
    let r = send(p.client().get(p.url("/queue/enter"))).await;
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
}

#[tokio::test]
async fn the_jwt_can_come_in_a_cookie() {
    let (redis, _api, builder) = quiet_builder("poll_after: [{min_wait: 0s, poll_after: 2s}]");
    let p = builder
        .yaml("identity: {jwt: {from: 'cookie:wr_id', secret_env: SHOP_JWT_KEY}}")
        .env("SHOP_JWT_KEY", SECRET)
        .start_settled(&redis.conn().await)
        .await;
    let token = hs256(&json!({"sub": "alice", "exp": now() + 300}));
    let enter = |cookie: String| {
        send(
            p.client()
                .post(p.url("/queue/enter"))
                .header("Cookie", cookie),
        )
    };
    assert_answer(
        "cookie",
        &enter(format!("theme=dark; wr_id={token}; lang=en")).await,
        200,
        waiting(1),
    );
    let r = send(
        p.client()
            .get(p.url("/queue/status"))
            .header("Cookie", format!("wr_id={token}")),
    )
    .await;
    assert_answer("status by cookie", &r, 200, waiting(1));
    assert_error(
        "another cookie's name",
        &enter(format!("wr_idx={token}")).await,
        401,
    );
    assert_refused_bearers(&p, &[("bearer instead of the cookie", token.clone())]).await;
    let forged = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(b"x".repeat(40).as_slice()).unwrap(),
        &json!({"sub": "alice"}),
    );
    assert_error(
        "forged cookie",
        &enter(format!("wr_id={forged}")).await,
        401,
    );
}

/// `claims` signed with `alg` by the PEM private key `pem` (RSA for RS256, EC for ES256).
fn sign_pem(alg: Algorithm, pem: &str, claims: &Value) -> String {
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()),
        _ => EncodingKey::from_rsa_pem(pem.as_bytes()),
    };
    sign(alg, &key.unwrap(), claims)
}

/// Algorithm confusion: an HS256 token whose HMAC key is the public key the proxy holds.
fn keyed_with_public(public_pem: &str, claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(public_pem.as_bytes()).unwrap(),
        claims,
    )
}

/// A settled NO_ADMISSION room (one 2 s poll tier) that accepts `alg` JWTs verified with
/// `keys.public` (a PEM file next to its config) and `jwt_extra` (more `identity.jwt` keys); its
/// first user enters with `claims` signed by `keys.private`, at position 1, and the same claims
/// signed by another key pair or HS256-keyed with the public key are refused.
async fn key_room(
    alg: Algorithm,
    jwt_extra: &str,
    keys: &KeyPair,
    claims: &Value,
) -> (RedisServer, DemoApi, Proxy) {
    let (redis, api, builder) = quiet_builder("poll_after: [{min_wait: 0s, poll_after: 2s}]");
    let builder = builder
        .yaml(&format!(
            "identity: {{jwt: {{algorithms: [{alg:?}], public_key_file: keys/jwt.pem, {jwt_extra}}}}}"
        ))
        .file("keys/jwt.pem", &keys.public);
    let proxy = start_settled(&redis, &builder).await;
    let jwt = sign_pem(alg, &keys.private, claims);
    assert_answer(
        &format!("{alg:?}"),
        &enter_bearer(&proxy, &jwt).await,
        200,
        waiting(1),
    );
    // The same claims from another key pair of the same kind, and HS256 keyed with the public key
    // the proxy holds (algorithm confusion), are refused.
    let other = key_pair(if alg == Algorithm::ES256 { "ec" } else { "rsa" });
    assert_refused_bearers(
        &proxy,
        &[
            ("another key pair", sign_pem(alg, &other.private, claims)),
            (
                "HS256 keyed with the public key",
                keyed_with_public(&keys.public, claims),
            ),
        ],
    )
    .await;
    (redis, api, proxy)
}

#[tokio::test]
async fn rs256_accepts_only_tokens_signed_by_the_private_key() {
    let keys = key_pair("rsa");
    let c = json!({"uid": "alice", "sub": "ignored", "exp": now() + 300});
    let (_redis, _api, p) = key_room(Algorithm::RS256, "claim: uid", &keys, &c).await;
    let rsa = |pem: &str, c: &Value| sign_pem(Algorithm::RS256, pem, c);
    assert_refused_bearers(
        &p,
        &[
            ("HS256 when only RS256 is configured", hs256(&c)),
            ("alg none", unsigned(&c)),
            (
                "the configured claim is missing",
                rsa(&keys.private, &json!({"sub": "alice", "exp": now() + 300})),
            ),
            (
                "expired",
                rsa(&keys.private, &json!({"uid": "bob", "exp": now() - 120})),
            ),
        ],
    )
    .await;
    // No exp at all: section 8 does not require one.
    let forever = rsa(&keys.private, &json!({"uid": "bob"}));
    assert_answer("no exp", &enter_bearer(&p, &forever).await, 200, waiting(2));

    // A PKCS#1 public key works as well as SPKI.
    let (code, err) = check_in_folder(
        "upstream: 127.0.0.1:1\nidentity: {jwt: {algorithms: [RS256], public_key_file: keys/jwt.pem}}\n",
        &[("keys/jwt.pem", &rsa_pkcs1_public(&keys.private))],
        &[],
    );
    assert_eq!(code, 0, "{err}");
}

#[tokio::test]
async fn es256_accepts_only_tokens_signed_by_the_private_key() {
    let keys = key_pair("ec");
    let rsa = key_pair("rsa");
    let c = json!({"sub": "alice", "aud": ["shop", "other"], "exp": now() + 300});
    let (_redis, _api, p) = key_room(Algorithm::ES256, "audience: shop", &keys, &c).await;
    let es = |pem: &str, c: &Value| sign_pem(Algorithm::ES256, pem, c);
    assert_refused_bearers(
        &p,
        &[
            (
                "RS256 when only ES256 is configured",
                sign_pem(Algorithm::RS256, &rsa.private, &c),
            ),
            (
                "wrong audience",
                es(
                    &keys.private,
                    &json!({"sub": "bob", "aud": "elsewhere", "exp": now() + 300}),
                ),
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn jwt_configuration_errors_exit_2_naming_the_key() {
    let rsa = key_pair("rsa");
    let ec = key_pair("ec");
    let base = "upstream: 127.0.0.1:1\n";
    /// (what, proxy.yaml, files next to it, environment)
    type Case<'a> = (
        &'a str,
        String,
        Vec<(&'a str, &'a str)>,
        Vec<(&'a str, &'a str)>,
    );
    let cases: Vec<Case> = vec![
        (
            "secret_env unset",
            format!("{base}identity: {{jwt: {{secret_env: WAITROOM_JWT_SECRET}}}}"),
            vec![],
            vec![],
        ),
        (
            "secret_env absent",
            format!("{base}identity: {{jwt: {{algorithms: [HS256]}}}}"),
            vec![],
            vec![],
        ),
        (
            "secret_env empty",
            format!("{base}identity: {{jwt: {{secret_env: WAITROOM_JWT_SECRET}}}}"),
            vec![],
            vec![("WAITROOM_JWT_SECRET", "")],
        ),
        (
            "no key file",
            format!("{base}identity: {{jwt: {{algorithms: [RS256], public_key_file: keys/missing.pem}}}}"),
            vec![],
            vec![],
        ),
        (
            "no public_key_file",
            format!("{base}identity: {{jwt: {{algorithms: [ES256]}}}}"),
            vec![],
            vec![],
        ),
        (
            "garbage key",
            format!("{base}identity: {{jwt: {{algorithms: [RS256], public_key_file: k.pem}}}}"),
            vec![("k.pem", "not a key")],
            vec![],
        ),
        (
            "EC key for RS256",
            format!("{base}identity: {{jwt: {{algorithms: [RS256], public_key_file: k.pem}}}}"),
            vec![("k.pem", &ec.public)],
            vec![],
        ),
        (
            "RSA key for ES256",
            format!("{base}identity: {{jwt: {{algorithms: [ES256], public_key_file: k.pem}}}}"),
            vec![("k.pem", &rsa.public)],
            vec![],
        ),
        (
            "a private key",
            format!("{base}identity: {{jwt: {{algorithms: [RS256], public_key_file: k.pem}}}}"),
            vec![("k.pem", &rsa.private)],
            vec![],
        ),
    ];
    for (what, yaml, files, env) in &cases {
        let (code, err) = check_in_folder(yaml, files, env);
        assert_eq!(code, 2, "{what}: exit code; stderr {err}");
        let wanted = if yaml.contains("RS256") || yaml.contains("ES256") {
            "identity.jwt.public_key_file: "
        } else {
            "identity.jwt.secret_env: "
        };
        assert!(
            err.lines().any(|l| l.starts_with(wanted)),
            "{what}: want a line starting {wanted:?}, got {err}"
        );
    }

    let more: Vec<(&str, String, &str)> = vec![
        (
            "header and jwt",
            format!("{base}identity: {{header: X-User-Id, jwt: {{secret_env: S}}}}"),
            "identity: ",
        ),
        (
            "unknown algorithm",
            format!("{base}identity: {{jwt: {{algorithms: [none], secret_env: S}}}}"),
            "identity.jwt.algorithms[0]: ",
        ),
        (
            "no algorithm",
            format!("{base}identity: {{jwt: {{algorithms: [], secret_env: S}}}}"),
            "identity.jwt.algorithms: ",
        ),
        (
            "bad from",
            format!("{base}identity: {{jwt: {{from: query, secret_env: S}}}}"),
            "identity.jwt.from: ",
        ),
        (
            "empty claim",
            format!("{base}identity: {{jwt: {{claim: '', secret_env: S}}}}"),
            "identity.jwt.claim: ",
        ),
        (
            "bad leeway",
            format!("{base}identity: {{jwt: {{leeway: soon, secret_env: S}}}}"),
            "identity.jwt.leeway: ",
        ),
        (
            "unknown key",
            format!("{base}identity: {{jwt: {{secret_env: S, algo: HS256}}}}"),
            "identity.jwt.algo: ",
        ),
    ];
    for (what, yaml, wanted) in &more {
        let (code, err) = check_in_folder(yaml, &[], &[("S", SECRET)]);
        assert_eq!(code, 2, "{what}: exit code; stderr {err}");
        assert!(
            err.lines().any(|l| l.starts_with(wanted)),
            "{what}: want {wanted:?}, got {err}"
        );
    }

    // Valid files: the key path is relative to the configuration's folder, not the working
    // directory, and HS256 + ES256 may be listed together.
    let yaml = format!(
        "{base}identity: {{jwt: {{algorithms: [HS256, ES256], secret_env: S, public_key_file: keys/jwt.pem, \
         issuer: me, audience: shop, leeway: 0s}}}}"
    );
    let (code, err) = check_in_folder(&yaml, &[("keys/jwt.pem", &ec.public)], &[("S", SECRET)]);
    assert_eq!(code, 0, "{err}");
}

#[tokio::test]
async fn trusted_header_mode_warns_on_a_non_loopback_listener() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let open = Proxy::builder(&redis.url(), api.addr())
        .listen_ip([0, 0, 0, 0].into())
        .start()
        .await;
    let warning = |logs: &str| {
        logs.lines()
            .any(|l| l.contains("WARN") && l.contains("trusted-header mode"))
    };
    assert!(warning(&open.logs()), "no warning in:\n{}", open.logs());
    let local = Proxy::builder(&redis.url(), api.addr()).start().await;
    assert!(
        !warning(&local.logs()),
        "loopback needs no warning:\n{}",
        local.logs()
    );
}

#[tokio::test]
async fn a_duplicated_identity_header_is_refused() {
    let (_redis, _api, p) = quiet_room("{}").await;
    let r = send(
        p.client()
            .post(p.url("/queue/enter"))
            .header("X-User-Id", "mallory")
            .header("X-User-Id", "alice"),
    )
    .await;
    assert_error("two identity headers", &r, 400);
}

// ---- enforced polling (section 9) -----------------------------------------------------------

/// One 2 s poll tier, enforced with 20 % grace.
const POLLING: &str =
    "poll_after: [{min_wait: 0s, poll_after: 2s}]\npolling: {enforce: true, grace: 20%}";

fn polling_room(redis: &RedisServer, api: &DemoApi, admission: &str) -> ProxyBuilder {
    Proxy::builder(&redis.url(), api.addr())
        .yaml(admission)
        .yaml(POLLING)
}

#[tokio::test]
async fn early_polls_are_refused_and_on_time_polls_are_not() {
    let (_redis, _api, p) = quiet_room(POLLING).await;
    let too_early = |r: u64| json!({"status": "TOO_EARLY", "retryAfter": r});

    // pollAfter 2 s, grace 20 %: on time 1.6 s after the answer that set the clock.
    let entered = Instant::now();
    assert_answer("enter", &p.enter("alice").await, 200, waiting(1));
    let r = p.status("alice").await;
    assert_answer("at once", &r, 429, too_early(2));
    assert_eq!(r.header("retry-after"), Some("2"));

    // 1 s in: 0.6 s left, rounded up to 1. This refused call must not restart the clock...
    tokio::time::sleep(Duration::from_millis(1000).saturating_sub(entered.elapsed())).await;
    let r = p.status("alice").await;
    assert_answer("1 s in", &r, 429, too_early(1));
    assert_eq!(r.header("retry-after"), Some("1"));

    // ... so 1.7 s after enter is on time (a restarted clock would refuse until 2.6 s).
    tokio::time::sleep(Duration::from_millis(1700).saturating_sub(entered.elapsed())).await;
    let on_time = Instant::now();
    assert_answer("on time", &p.status("alice").await, 200, waiting(1));
    // That answer carried pollAfter again, so the clock starts anew.
    assert_answer("right after", &p.status("alice").await, 429, too_early(2));
    tokio::time::sleep(Duration::from_millis(1700).saturating_sub(on_time.elapsed())).await;
    assert_answer("on time again", &p.status("alice").await, 200, waiting(1));

    // A user with no clock (never told to wait) is not refused; enter itself is never refused.
    assert_answer(
        "stranger",
        &p.status("bob").await,
        200,
        json!({"status": "NOT_IN_QUEUE", "pollAfter": null}),
    );
    assert_answer("enter again", &p.enter("alice").await, 200, waiting(1));

    let too_early_count = p
        .metric(r#"waitroom_status_total{status="TOO_EARLY"}"#)
        .await;
    assert_eq!(too_early_count, Some(3.0), "{}", p.metrics().await);
}

#[tokio::test]
async fn a_null_poll_after_enforces_nothing() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let p = polling_room(&redis, &api, "admission: {interval: 100ms, batch_size: 10}")
        .start()
        .await;

    for i in 0..5 {
        let r = p.status("nobody").await;
        assert_answer(
            &format!("NOT_IN_QUEUE #{i}"),
            &r,
            200,
            json!({"status": "NOT_IN_QUEUE", "pollAfter": null}),
        );
    }
    let entered = Instant::now();
    let r = p.enter("alice").await;
    assert_eq!(r.status, 200, "{}", r.body);
    tokio::time::sleep(Duration::from_millis(1700).saturating_sub(entered.elapsed())).await;
    // Admitted meanwhile: READY carries a null pollAfter, and from then on nothing is refused.
    for i in 0..5 {
        let body = p.status("alice").await.json();
        assert_eq!(body["status"], "READY", "status #{i}: {body}");
        assert_eq!(body["pollAfter"], Value::Null);
    }
}

/// The commands clients sent to Redis (seen with `redis-cli MONITOR`) that name `user` or its
/// keys while `work` runs.
async fn commands_naming<F: std::future::Future<Output = ()>>(
    redis: &RedisServer,
    user: &str,
    work: F,
) -> Vec<String> {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "monitor"])
        .stdout(log.reopen().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("run redis-cli monitor");
    // What MONITOR has written so far holds `text` (within 5 s).
    let log_path = log.path().to_owned();
    let shows = |text: String| {
        let path = log_path.clone();
        wait_until(
            Duration::from_secs(5),
            Duration::from_millis(10),
            move || {
                let (path, text) = (path.clone(), text.clone());
                async move {
                    std::fs::read_to_string(path)
                        .unwrap_or_default()
                        .contains(&text)
                }
            },
        )
    };
    let started = shows("OK".into()).await;
    assert!(started, "redis-cli monitor did not start");
    work.await;
    // An ECHO through the same server marks the end: once MONITOR shows it, all before it is in.
    let marker = format!("end-of-{user}");
    let _: String = redis::cmd("ECHO")
        .arg(&marker)
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    let ended = shows(marker.clone()).await;
    let _ = monitor.kill();
    let _ = monitor.wait();
    assert!(ended, "MONITOR did not show the marker");
    let needle = format!(":{user}\"");
    std::fs::read_to_string(log.path())
        .unwrap()
        .lines()
        // Commands a script runs inside Redis show as `[0 lua]`: not round trips.
        .filter(|l| !l.contains(" lua]"))
        .filter(|l| l.contains(&needle) || l.contains(&format!("\"{user}\"")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn enforcement_costs_no_redis_round_trip() {
    let (redis, _api, p) = quiet_room(POLLING).await;
    // Load the scripts into Redis first, so no NOSCRIPT retry is counted.
    p.enter("warm-up").await;
    p.status("warm-up").await;

    let seen = commands_naming(&redis, "alice", async {
        assert_eq!(p.enter("alice").await.status, 200);
        assert_eq!(p.status("alice").await.status, 429);
        assert_eq!(p.status("alice").await.status, 429);
        assert_eq!(p.status("nobody-else").await.status, 200);
    })
    .await;
    // One script call per request: enter, then each status call, refused or not.
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert!(
        seen.iter()
            .all(|l| l.contains("\"EVALSHA\"") || l.contains("\"evalsha\"")),
        "{seen:#?}"
    );
}

// ---- per-address identity limit (section 9) -------------------------------------------------

fn limited(r: &Resp, ctx: &str) -> u64 {
    assert_eq!(r.status, 429, "{ctx}: {}", r.body);
    let body = r.json();
    let secs = body["retryAfter"]
        .as_u64()
        .unwrap_or_else(|| panic!("{ctx}: {body}"));
    assert_eq!(
        body,
        json!({"status": "LIMITED", "retryAfter": secs}),
        "{ctx}"
    );
    assert_eq!(
        r.header("retry-after"),
        Some(secs.to_string().as_str()),
        "{ctx}"
    );
    assert!((1..=60).contains(&secs), "{ctx}: retryAfter {secs}");
    secs
}

#[tokio::test]
async fn the_per_address_limit_counts_distinct_identities_per_minute() {
    let (redis, _api, p) = quiet_room("abuse: {identities_per_address: 3}").await;
    with_window_left(&redis, 20).await;
    for (i, user) in ["u1", "u2", "u3"].iter().enumerate() {
        assert_eq!(
            p.enter(user).await.status,
            200,
            "{user} is identity #{}",
            i + 1
        );
    }
    let before_ms = now_ms(&redis).await;
    let secs = limited(&p.enter("u4").await, "the 4th identity");
    // Seconds to the end of Redis's current minute, rounded up.
    let left = (60_000 - before_ms % 60_000).div_ceil(1000);
    assert!(
        secs == left || secs + 1 == left,
        "retryAfter {secs}, window ends in {left} s"
    );
    limited(&p.enter("u5").await, "the 5th identity");
    // Identities already counted still enter, even once they have left the line.
    let _: i64 = redis::cmd("ZREM")
        .arg(keys(&p).queue)
        .arg("u1")
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    let r = p.enter("u1").await;
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (200, json!("WAITING")),
        "u1 again: {}",
        r.body
    );
    assert_eq!(p.enter("u2").await.status, 200, "u2, still waiting");
    assert_eq!(
        p.metric(r#"waitroom_enter_total{result="limited"}"#).await,
        Some(2.0)
    );
    // Status is never limited.
    assert_eq!(p.status("u9").await.status, 200);
}

/// The reset at the next window, without waiting for a minute to pass: each identity is counted
/// with Redis's minute, so a full count for the previous minute (seeded here) limits nobody now,
/// and the same count for the current minute does.
#[tokio::test]
async fn the_per_address_counter_starts_afresh_each_minute() {
    let (redis, _api, p) = quiet_room("abuse: {identities_per_address: 2}").await;
    with_window_left(&redis, 10).await;
    let window = now_ms(&redis).await / 60_000;
    let key = keys(&p).abuse_counter("127.0.0.1");
    let mut conn = redis.conn().await;
    let _: i64 = redis::cmd("ZADD")
        .arg(&key)
        .arg(window - 1)
        .arg("old-1")
        .arg(window - 1)
        .arg("old-2")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        p.enter("new-1").await.status,
        200,
        "last minute's full counter limits nobody now"
    );
    assert_eq!(p.enter("new-2").await.status, 200);
    limited(&p.enter("new-3").await, "this minute's counter is full");
    let counted: Vec<String> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(window)
        .arg(window)
        .arg("BYSCORE")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(counted.len(), 2, "{counted:?}");
    let ttl: i64 = redis::cmd("TTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (1..=120).contains(&ttl),
        "the counter goes by itself: ttl {ttl}"
    );
}

#[tokio::test]
async fn x_forwarded_for_is_believed_only_from_trusted_proxies() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let enter_from = |p: &Proxy, user: &str, xff: Option<&str>| {
        let mut req = p
            .client()
            .post(p.url("/queue/enter"))
            .header("X-User-Id", user);
        if let Some(xff) = xff {
            req = req.header("X-Forwarded-For", xff);
        }
        send(req)
    };
    with_window_left(&redis, 20).await;

    // (what, user, X-Forwarded-For, LIMITED?) in order, against a room trusting 127.0.0.1 (the
    // test's own address: the forwarded address counts) and one trusting nobody (X-Forwarded-For
    // is ignored and every enter counts against 127.0.0.1).
    type Case = (&'static str, &'static str, Option<&'static str>, bool);
    let trusting: &[Case] = &[
        ("1st from .5", "a1", Some("203.0.113.5"), false),
        ("2nd from .5", "a2", Some("203.0.113.5"), false),
        (
            "3rd identity from 203.0.113.5",
            "a3",
            Some("203.0.113.5"),
            true,
        ),
        // A client cannot pick its address by writing to the left of the chain.
        (
            "prepended address",
            "a3",
            Some("198.51.100.1, 203.0.113.5"),
            true,
        ),
        // Another address is not affected, nor the proxy's own.
        ("another address", "a3", Some("203.0.113.6"), false),
        ("no header", "a4", None, false),
        (
            "trusted hops are skipped",
            "a5",
            Some("203.0.113.6, 127.0.0.1"),
            false,
        ),
        (
            "3rd identity from 203.0.113.6",
            "a6",
            Some("203.0.113.6"),
            true,
        ),
    ];
    let untrusting: &[Case] = &[
        ("1st from 127.0.0.1", "b1", Some("192.0.2.1"), false),
        ("2nd from 127.0.0.1", "b2", Some("192.0.2.2"), false),
        ("XFF from an untrusted peer", "b3", Some("192.0.2.3"), true),
    ];
    for (abuse, cases) in [
        (
            "abuse: {identities_per_address: 2, trusted_proxies: ['127.0.0.1/32']}",
            trusting,
        ),
        ("abuse: {identities_per_address: 2}", untrusting),
    ] {
        let builder = Proxy::builder(&redis.url(), api.addr())
            .yaml(NO_ADMISSION)
            .yaml(abuse);
        let p = start_settled(&redis, &builder).await;
        for &(what, user, xff, is_limited) in cases {
            let r = enter_from(&p, user, xff).await;
            if is_limited {
                limited(&r, what);
            } else {
                assert_eq!(r.status, 200, "{what}: {}", r.body);
            }
        }
    }
}

// ---- entry tokens: bound to their user, never logged ----------------------------------------

async fn order(p: &Proxy, user: &str, token_header: Option<&str>, query: &str) -> Resp {
    let mut req = p
        .client()
        .post(p.url(&format!("/api/orders{query}")))
        .header("X-User-Id", user)
        .header("content-type", "application/json")
        .body(r#"{"item":"widget"}"#);
    if let Some(t) = token_header {
        req = req.header("X-Entry-Token", t);
    }
    send(req).await
}

#[tokio::test]
async fn entry_tokens_are_bound_to_their_user_and_never_logged() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    // Debug logs: the most the proxy ever writes, and still no token in them.
    let debug = Proxy::builder(&redis.url(), api.addr()).env("RUST_LOG", "debug");
    let p = debug
        .yaml("admission: {interval: 50ms, batch_size: 10}")
        .start()
        .await;
    let alice = p.until_ready("alice", Duration::from_secs(10)).await;
    let bob = p.until_ready("bob", Duration::from_secs(10)).await;

    assert_error(
        "bob with alice's token",
        &order(&p, "bob", Some(&alice), "").await,
        403,
    );
    assert_error("no token", &order(&p, "alice", None, "").await, 403);
    // Never in a query string: a token there is not looked at.
    let r = order(
        &p,
        "alice",
        None,
        &format!("?token={alice}&X-Entry-Token={alice}"),
    )
    .await;
    assert_error("token in the query string", &r, 403);
    // The last character changed, never kept: a token ending in '0' once made this alice's own
    // token (one run in sixteen), and the order went through.
    let last = if alice.ends_with('0') { '1' } else { '0' };
    let almost = format!("{}{last}", &alice[..alice.len() - 1]);
    assert_ne!(almost, alice);
    assert_error(
        "one character off",
        &order(&p, "alice", Some(&almost), "").await,
        403,
    );
    assert_eq!(
        api.stats().await["completed"].as_u64().unwrap_or(0),
        0,
        "none of these reached the upstream"
    );
    // Bob's attempt did not spend it: alice's order goes through, then the token is spent.
    assert_eq!(order(&p, "alice", Some(&alice), "").await.status, 201);
    assert_error("spent", &order(&p, "alice", Some(&alice), "").await, 403);
    assert_eq!(order(&p, "bob", Some(&bob), "").await.status, 201);
    // A request that fails (the client hangs up mid-body) gets an error line from pingora: the
    // URL it names carries no query string.
    let mut s = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    let request = format!(
        "POST /echo?entry_token={bob} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"
    );
    s.write_all(request.as_bytes()).await.unwrap();
    drop(s);
    let failed = wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { p.logs().contains("Fail to proxy") },
    )
    .await;
    assert!(
        failed,
        "no error line for the broken request:\n{}",
        p.logs()
    );

    // Everything the proxy said, at debug level, mentions neither token.
    let logs = p.logs();
    assert!(
        logs.contains("/api/orders"),
        "the access log is there:\n{logs}"
    );
    for (who, token) in [("alice", &alice), ("bob", &bob)] {
        assert!(
            !logs.contains(token.as_str()),
            "{who}'s token is in the logs:\n{logs}"
        );
        assert!(
            !logs.contains(&token[..8]),
            "part of {who}'s token is in the logs"
        );
    }
}

#[tokio::test]
async fn bearer_jwts_are_never_logged() {
    let redis = RedisServer::start();
    let api = DemoApi::start(&[]);
    let p = hs256_room(&redis, &api)
        .env("RUST_LOG", "debug")
        .start_settled(&redis.conn().await)
        .await;
    let good = hs256(&claims(json!("alice")));
    let bad = hs256(
        &json!({"sub": "bob", "iss": "https://id.example", "aud": "shop", "exp": now() - 999}),
    );
    assert_eq!(enter_bearer(&p, &good).await.status, 200);
    assert_eq!(enter_bearer(&p, &bad).await.status, 401);
    // Lines reach stderr through the log writer's buffer, a moment after the answer.
    let logged = wait_until(Duration::from_secs(5), Duration::from_millis(20), || async {
        p.logs().contains("/queue/enter")
    })
    .await;
    let logs = p.logs();
    assert!(logged, "{logs}");
    for token in [&good, &bad] {
        let signature = token.rsplit('.').next().unwrap();
        assert!(!logs.contains(signature), "a JWT is in the logs:\n{logs}");
    }
}

// ---- slow or huge requests (issue 7) --------------------------------------------------------

#[tokio::test]
async fn the_proxys_own_endpoints_refuse_large_bodies() {
    let (_redis, _api, p) = quiet_room("{}").await;
    let enter = |body: Vec<u8>| {
        send(
            p.client()
                .post(p.url("/queue/enter"))
                .header("X-User-Id", "alice")
                .body(body),
        )
    };

    assert_error("9000-byte enter", &enter(vec![b'x'; 9000]).await, 413);
    assert_eq!(
        enter(vec![b'x'; 8192]).await.status,
        200,
        "8 KiB is still fine"
    );
    assert_eq!(
        enter(b"{}".to_vec()).await.status,
        200,
        "a small body is ignored"
    );
    // A chunked body is counted as it comes.
    let chunk = "1000\r\n".to_string() + &"y".repeat(0x1000) + "\r\n";
    let raw = format!(
        "GET /queue/status HTTP/1.1\r\nHost: x\r\nX-User-Id: alice\r\nTransfer-Encoding: chunked\r\n\r\n{}{}{}0\r\n\r\n",
        chunk, chunk, chunk
    );
    let answer = raw_request(p.addr(), raw.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "chunked 12 KiB status: {answer}"
    );
    // The method is checked first, whatever the body.
    let r = send(
        p.client()
            .get(p.url("/queue/enter"))
            .header("X-User-Id", "alice")
            .body(vec![b'x'; 20_000]),
    )
    .await;
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    // Bodies to the upstream are the upstream's business.
    let r = send(p.client().post(p.url("/echo")).body(vec![b'z'; 100_000])).await;
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(200)]);
}

#[tokio::test]
async fn a_request_body_that_stalls_is_cut_off() {
    let (_redis, _api, p) = quiet_room("{}").await;
    let mut s = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    let started = Instant::now();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    // The rest never comes: the proxy gives up after its 10 s body read timeout.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf)).await;
    let waited = started.elapsed();
    assert!(read.is_ok(), "the connection was still open after 30 s");
    assert!(
        waited >= Duration::from_secs(9),
        "cut off too early, after {waited:?}"
    );
    assert!(waited < Duration::from_secs(20), "cut off after {waited:?}");
    let answer = String::from_utf8_lossy(&buf);
    // 408 since section 16: a body that stops arriving is a timeout, not a malformed request.
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.ends_with(r#"{"error":"the request body did not arrive in time"}"#), "{answer}");
    assert!(p.is_running());
}
