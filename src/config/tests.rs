use std::path::Path;

use http::Method;

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
             `shutdown`, `reload`, `polling`, `abuse`, `page`, `limits`, `event`, `admin`, `bypass`, `mode`, `rooms`)",
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

const TWO_ROOMS: &str = r#"
upstream: 127.0.0.1:8081
admission: { interval: 200ms, batch_size: 10 }
token: { ttl: 5m }
rooms:
  - name: sneakers
    host: Shop.Example.com
    endpoints: { prefix: /drops/sneakers/queue }
    protected:
      - { method: POST, path: /api/drops/sneakers/orders }
    admission: { batch_size: 5 }
    token: { ttl: 2m }
  - name: console
    endpoints: { prefix: /drops/console/queue }
    protected:
      - { method: POST, path: /api/drops/console/orders }
    upstream: "127.0.0.1:8082"
"#;

#[test]
fn without_rooms_the_top_level_is_the_one_room() {
    assert!(Config::parse("upstream: 127.0.0.1:8081").unwrap().rooms.is_empty());
}

#[test]
fn a_room_replaces_the_top_level_key_by_key() {
    let c = Config::parse(TWO_ROOMS).unwrap();
    let names: Vec<&str> = c.rooms.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["sneakers", "console"]);
    let (sneakers, console) = (&c.rooms[0], &c.rooms[1]);
    assert_eq!(sneakers.host.as_deref(), Some("shop.example.com"));
    assert_eq!(sneakers.config.admission.batch_size.get(), 5);
    assert_eq!(sneakers.config.admission.interval, Duration::from_millis(200), "the top level's interval");
    assert_eq!(sneakers.config.token.ttl, Duration::from_secs(120));
    assert_eq!(sneakers.config.endpoints.prefix, "/drops/sneakers/queue");
    assert_eq!(sneakers.config.upstream, "127.0.0.1:8081");
    assert_eq!(console.host, None);
    assert_eq!(console.config.admission.batch_size.get(), 10);
    assert_eq!(console.config.token.ttl, Duration::from_secs(300));
    assert_eq!(console.config.upstream, "127.0.0.1:8082");
    assert_eq!(console.config.protected[0].path(), "/api/drops/console/orders");
}

#[test]
fn room_problems_are_named_where_the_room_wrote_them() {
    let got = problems(
        r#"
upstream: 127.0.0.1:8081
rooms:
  - { name: Sneakers!, endpoints: { prefix: /a } }
  - { name: b, endpoints: { prefix: /b }, admission: { batch_size: 0 } }
  - { name: b, endpoints: { prefix: /c }, listen: "0.0.0.0:1" }
"#,
    );
    assert!(got.iter().any(|p| p.starts_with("rooms[0].name: `Sneakers!` is not a room name")), "{got:?}");
    assert!(got.iter().any(|p| p.starts_with("rooms[1].admission.batch_size:")), "{got:?}");
    assert!(got.iter().any(|p| p.starts_with("rooms[2].name: `b` names two rooms")), "{got:?}");
    assert!(got.iter().any(|p| p.starts_with("rooms[2].listen")), "a proxy-wide key in a room: {got:?}");
    assert!(problems("upstream: a:1\nrooms: []").iter().any(|p| p.starts_with("rooms: lists no room")));
}

#[test]
fn rooms_that_could_claim_one_request_are_refused_naming_both() {
    let two = |a: &str, b: &str| {
        problems(&format!("upstream: 127.0.0.1:8081\nrooms:\n  - {{ name: one, {a} }}\n  - {{ name: two, {b} }}\n"))
    };
    let same_prefix = two("endpoints: { prefix: /q }, protected: []", "endpoints: { prefix: /q }, protected: []");
    assert!(same_prefix.iter().any(|p| p.starts_with("rooms[1].endpoints.prefix: `/q` overlaps room `one`")), "{same_prefix:?}");
    let inside = two("endpoints: { prefix: /q }, protected: []", "endpoints: { prefix: /q/two }, protected: []");
    assert!(inside.iter().any(|p| p.contains("overlaps room `one`'s prefix `/q`")), "{inside:?}");
    let rules = two(
        "endpoints: { prefix: /q1 }, protected: [{ method: POST, path: /api, match: prefix }]",
        "endpoints: { prefix: /q2 }, protected: [{ method: POST, path: /api/orders }]",
    );
    assert!(rules.iter().any(|p| p.starts_with("rooms[1].protected: POST /api/orders overlaps room `one`'s rule POST /api")), "{rules:?}");
    let rule_over_endpoints = two(
        "endpoints: { prefix: /q1 }, protected: [{ method: GET, path: /q2, match: prefix }]",
        "endpoints: { prefix: /q2 }, protected: []",
    );
    assert!(rule_over_endpoints.iter().any(|p| p.contains("room `one`'s rule GET /q2 matches room `two`'s endpoints")), "{rule_over_endpoints:?}");
    // Other hosts: the same prefix is two rooms' own.
    let hosts = two(
        "host: a.example, endpoints: { prefix: /q }, protected: []",
        "host: b.example, endpoints: { prefix: /q }, protected: []",
    );
    assert_eq!(hosts, Vec::<String>::new());
    // Different methods on one path do not overlap.
    let methods = two(
        "endpoints: { prefix: /q1 }, protected: [{ method: POST, path: /api/orders }]",
        "endpoints: { prefix: /q2 }, protected: [{ method: PUT, path: /api/orders }]",
    );
    assert_eq!(methods, Vec::<String>::new());
}
