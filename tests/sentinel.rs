//! waitroom behind Redis Sentinel (contract section 7): one primary, one replica, three sentinels
//! (quorum 2) on free ports. Two proxies find the primary through the sentinels and, after a
//! failover, the new one by themselves, without a restart:
//!
//! 1. the primary is SIGKILLed: the sentinels promote the replica; measured from the kill and from
//!    the promotion to the first 200 from each proxy (the contract allows 10 s from promotion);
//! 2. a graceful `SENTINEL FAILOVER` while the old primary stays up (it is demoted to a replica, so
//!    a client that reconnected to the same address would now write to a replica). Each proxy
//!    keeps entering users until it has written `FOLLOWED_RUN` in a row to the new primary; that
//!    run must begin within 10 s of the promotion, for every proxy on its own.
//!
//! Users enqueued before each failover (and replicated, `WAIT 1`) keep their exact places. Before
//! the graceful failover the spare's replication is cut (its replication user switched off), so
//! users entered then are acknowledged by the primary and lost by the failover in every run;
//! those, and the enters the demoted primary took while failing over, must be told
//! NOT_IN_QUEUE by both proxies within 1 s and never shown another number (contract section 5).

mod common;
mod topology;

use common::*;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use topology::{cli, cli_as, info_field, wait_in_sync, Passwords, SentinelSet, Tally, NODE_PASSWORD_ENV};

/// A client that gives up on a request after 2 s, so a probe never hangs on a dead proxy path.
fn probe_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client")
}

/// Every 50 ms, on every proxy, a status of `known` and an enter of a fresh user, until both
/// answer 200 on every proxy. Returns when each proxy recovered and the failures seen.
async fn probe_until_recovered(
    proxies: &[&Proxy],
    known: &str,
    tag: &str,
) -> (Vec<Instant>, Tally) {
    let client = probe_client();
    let mut recovered: Vec<Option<Instant>> = vec![None; proxies.len()];
    let mut failures = Tally::default();
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut n = 0;
    while recovered.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "proxies did not recover within 40 s: {:?}",
            failures.0
        );
        for (i, proxy) in proxies.iter().enumerate() {
            if recovered[i].is_some() {
                continue;
            }
            n += 1;
            let sent = Instant::now();
            let status = client
                .get(proxy.url("/queue/status"))
                .header("X-User-Id", known)
                .send()
                .await
                .map(|r| r.status().as_u16());
            let enter = client
                .post(proxy.url("/queue/enter"))
                .header("X-User-Id", format!("{tag}-probe-{n}"))
                .send()
                .await
                .map(|r| r.status().as_u16());
            match (&status, &enter) {
                (Ok(200), Ok(200)) => recovered[i] = Some(sent),
                _ => {
                    for r in [status, enter] {
                        match r {
                            Ok(200) => {}
                            Ok(code) => failures.add(code.to_string()),
                            Err(_) => failures.add("transport error"),
                        }
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (
        recovered.into_iter().map(Option::unwrap).collect(),
        failures,
    )
}

/// The contract's bound: a proxy finds the new primary within this long of its promotion.
const FOLLOW_BOUND: Duration = Duration::from_secs(10);
/// Acknowledged enters in a row found on the new primary that show a proxy writes there now.
const FOLLOWED_RUN: usize = 10;

/// What one proxy's enters showed from the promotion on.
#[derive(Debug, Default, Clone)]
struct Follow {
    /// Sent time of the first of the current run of acknowledged enters on the new primary.
    since: Option<Instant>,
    /// Length of that run (an enter acknowledged but missing there starts it again).
    run: usize,
    /// Enters sent after the promotion that the proxy acknowledged but the new primary lacks.
    lost_after_promotion: usize,
    /// Sent time of the first acknowledged enter found on the new primary: from then on this
    /// proxy talks to it.
    first_on_new: Option<Instant>,
    failed: Tally,
}

/// Whether `user` is in the line on `server`. The sentinels kill a promoted node's client
/// connections (`CLIENT KILL TYPE normal` in the failover), so a dropped connection is opened
/// again.
async fn on_primary(
    server: &RedisServer,
    conn: &mut Option<redis::aio::MultiplexedConnection>,
    queue: &str,
    user: &str,
) -> bool {
    for _ in 0..5 {
        if conn.is_none() {
            *conn = Some(server.conn().await);
        }
        let got: redis::RedisResult<Option<u64>> = redis::cmd("ZSCORE")
            .arg(queue)
            .arg(user)
            .query_async(conn.as_mut().unwrap())
            .await;
        match got {
            Ok(score) => return score.is_some(),
            Err(_) => *conn = None,
        }
    }
    panic!("ZSCORE on the new primary {} kept failing", server.port());
}

/// Enters fresh users on every proxy, every 20 ms, until `promoted` is set and every proxy has
/// written `FOLLOWED_RUN` in a row to `new_primary` (or `FOLLOW_BOUND` + 5 s have passed since the
/// promotion; 30 s at most before it). Every enter sent after the promotion and acknowledged is
/// looked up on the new primary at once: there is no replication lag to wait for on a primary.
/// Returns every acknowledged enter (proxy, user, sent) and each proxy's `Follow`.
async fn write_until_followed(
    proxies: &[&Proxy],
    tag: &str,
    promoted: &OnceLock<Instant>,
    new_primary: &RedisServer,
) -> (Vec<(usize, String, Instant)>, Vec<Follow>) {
    let client = probe_client();
    let queue = keys(&proxies[0]).queue;
    let mut on_new = None;
    let mut acked = Vec::new();
    let mut follow = vec![Follow::default(); proxies.len()];
    let mut n = 0;
    let cap = Instant::now() + Duration::from_secs(30);
    loop {
        match promoted.get() {
            None if Instant::now() >= cap => break,
            Some(p)
                if p.elapsed() >= FOLLOW_BOUND + Duration::from_secs(5)
                    || follow.iter().all(|f| f.run >= FOLLOWED_RUN) =>
            {
                break
            }
            _ => {}
        }
        for (i, proxy) in proxies.iter().enumerate() {
            n += 1;
            let user = format!("{tag}-{n}");
            let sent = Instant::now();
            let r = client
                .post(proxy.url("/queue/enter"))
                .header("X-User-Id", &user)
                .send()
                .await
                .map(|r| r.status().as_u16());
            let after_promotion = promoted.get().is_some_and(|p| sent >= *p);
            match r {
                Ok(200) => {
                    acked.push((i, user.clone(), sent));
                    if after_promotion {
                        let f = &mut follow[i];
                        if on_primary(new_primary, &mut on_new, &queue, &user).await {
                            f.first_on_new.get_or_insert(sent);
                            f.since.get_or_insert(sent);
                            f.run += 1;
                        } else {
                            f.since = None;
                            f.run = 0;
                            f.lost_after_promotion += 1;
                        }
                    }
                }
                Ok(code) if after_promotion => follow[i].failed.add(code.to_string()),
                Err(_) if after_promotion => follow[i].failed.add("transport error"),
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (acked, follow)
}

/// Polls the sentinels (blocking redis-cli, on a blocking thread) until they name `not` no more.
async fn wait_promotion(set: &SentinelSet, not: u16) -> (Instant, u16) {
    let ports: Vec<(u16, Option<String>)> =
        set.sentinels.iter().map(|s| (s.port, s.password.clone())).collect();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let named = ports.iter().find_map(|(p, password)| {
                cli_as(
                    *p,
                    password.as_deref(),
                    &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", topology::MASTER],
                )
                .lines()
                .nth(1)
                .and_then(|l| l.trim().parse::<u16>().ok())
            });
            if let Some(port) = named.filter(|p| *p != not) {
                return (Instant::now(), port);
            }
            assert!(Instant::now() < deadline, "no promotion within 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    })
    .await
    .expect("promotion watcher")
}

async fn replicate(primary: &RedisServer) {
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut primary.conn().await)
        .await
        .expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged the writes");
}

async fn assert_places(proxies: &[&Proxy], places: &[(String, u64)]) {
    for (i, (user, place)) in places.iter().enumerate() {
        let r = proxies[i % proxies.len()].status(user).await;
        assert_eq!(r.status, 200, "{user}: {}", r.body);
        assert_eq!(
            r.json()["position"].as_u64(),
            Some(*place),
            "{user} kept the place: {}",
            r.body
        );
    }
}

/// The user the spare replica authenticates as to its primary: switching it off (and killing
/// its connection) cuts replication while the spare stays up, answering the sentinels, a replica
/// that lags from then on.
const REPL_USER: &str = "repl";
const REPL_PASS: &str = "repl-secret";

/// One status answer to a lost user: which proxy, when sent and answered, HTTP status, body.
#[derive(Debug, Clone)]
struct Asked {
    proxy: usize,
    user: String,
    sent: Instant,
    got: Instant,
    code: u16,
    body: serde_json::Value,
}

/// Asks every proxy the status of each of `users` every 100 ms until `stop`.
async fn poll_lost(
    urls: Vec<String>,
    users: Vec<String>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<Asked> {
    let client = probe_client();
    let mut asked = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for (proxy, url) in urls.iter().enumerate() {
            for user in &users {
                let sent = Instant::now();
                let r = client.get(url).header("X-User-Id", user).send().await;
                let (code, body) = match r {
                    Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or_default()),
                    Err(_) => (0, serde_json::Value::Null),
                };
                asked.push(Asked { proxy, user: user.clone(), sent, got: Instant::now(), code, body });
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    asked
}

/// Contract section 5 for users a failover lost (`places`: each one's place on the old
/// primary), from what `poll_lost` heard, per proxy, counted from the proxy's first write to the
/// new primary (`Follow::first_on_new`, "the switch"): a WAITING answer only ever shows the
/// user's own old place, never another number; the user is told NOT_IN_QUEUE within 1 s of the
/// switch, and WAITING never again once told (nor at all from 1 s after the switch).
/// Returns the problems (another number shown, an answer outside the contract), the breaches of
/// the 1 s bound (told late, or WAITING again after being told), per proxy the latest delay from its switch to NOT_IN_QUEUE, and each
/// proxy's answers to one lost user as (ms from the switch, code, status, position), to show.
fn judge_lost(
    asked: &[Asked],
    places: &std::collections::HashMap<String, u64>,
    follow: &[Follow],
) -> (Vec<String>, Vec<String>, Vec<Option<Duration>>, Vec<Vec<(i64, u16, String, Option<u64>)>>) {
    let mut wrong = Vec::new();
    let mut late = Vec::new();
    let mut told_in = vec![Some(Duration::ZERO); follow.len()];
    let mut timelines = vec![Vec::new(); follow.len()];
    for (i, f) in follow.iter().enumerate() {
        let Some(switched) = f.first_on_new else {
            wrong.push(format!("proxy {i} never wrote to the new primary"));
            continue;
        };
        let ms = |t: Instant| {
            if t >= switched { (t - switched).as_millis() as i64 } else { -((switched - t).as_millis() as i64) }
        };
        for (user, place) in places {
            let mine = || asked.iter().filter(|a| a.proxy == i && &a.user == user);
            if timelines[i].is_empty() {
                timelines[i] = mine()
                    .map(|a| (ms(a.sent), a.code, a.body["status"].as_str().unwrap_or("-").to_owned(), a.body["position"].as_u64()))
                    .collect();
            }
            let told = mine().find(|a| a.sent >= switched && a.body["status"] == "NOT_IN_QUEUE");
            for a in mine() {
                let status = a.body["status"].as_str().unwrap_or("-");
                let position = a.body["position"].as_u64();
                let when = format!("sent {} ms from the switch", ms(a.sent));
                match (a.code, status) {
                    (200, "WAITING") if position != Some(*place) => wrong.push(format!(
                        "proxy {i}: {user} (place {place} on the old primary) shown position {position:?}, {when}"
                    )),
                    (200, "WAITING") if told.is_some_and(|t| a.sent > t.got) => {
                        late.push(format!("proxy {i}: {user} told NOT_IN_QUEUE, then WAITING (own old place) again, {when}"))
                    }
                    (200, "WAITING") if a.sent > switched + Duration::from_secs(1) => {
                        late.push(format!("proxy {i}: {user} still WAITING (own old place), {when}"))
                    }
                    (200, "WAITING") | (200, "NOT_IN_QUEUE") | (503, _) | (0, _) => {}
                    (code, _) => wrong.push(format!("proxy {i}: {user}: {code} {}, {when}", a.body)),
                }
            }
            let Some(told) = told else {
                late.push(format!("proxy {i}: {user} not told NOT_IN_QUEUE while polled after the switch"));
                told_in[i] = None;
                continue;
            };
            let took = told.got.saturating_duration_since(switched);
            if took > Duration::from_secs(1) {
                late.push(format!("proxy {i}: {user} told NOT_IN_QUEUE only {took:?} after the switch"));
            }
            told_in[i] = told_in[i].map(|t| t.max(took));
        }
    }
    (wrong, late, told_in, timelines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_follow_the_sentinels_through_failovers() {
    let t0 = Instant::now();
    let mut set = SentinelSet::start();
    let api = DemoApi::start(&[]);
    let builder = Proxy::builder(&set.servers[0].url(), api.addr())
        .yaml(&set.yaml())
        .yaml("admission: {interval: 1h, batch_size: 1}");
    // The first tick admits from the empty line at start; with the schedule set nobody is
    // admitted again during the test, so places stay exactly as entered.
    let first = set.servers[0].port();
    let a = builder.start_settled(&set.servers[0].conn().await).await;
    let b = builder.start().await;
    let proxies = [&a, &b];
    // A spare behind the replica (chained): once the replica is promoted, the spare is its
    // replica, which the graceful failover of phase 2 needs. The sentinels do not see it before.
    let replicated_from = set.servers[1].port();
    let acl = cli(replicated_from, &["ACL", "SETUSER", REPL_USER, "on", &format!(">{REPL_PASS}"), "+@all", "~*"]);
    assert_eq!(acl.trim(), "OK", "ACL SETUSER: {acl}");
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &replicated_from.to_string(),
        "--masteruser",
        REPL_USER,
        "--masterauth",
        REPL_PASS,
    ]);
    wait_in_sync(replica.port(), Duration::from_secs(10));

    let mut places: Vec<(String, u64)> = Vec::new();
    for i in 0..100 {
        let user = format!("s-{i:03}");
        let r = proxies[i % 2].enter(&user).await;
        assert_eq!(
            r.json()["position"].as_u64(),
            Some(i as u64 + 1),
            "{user}: {}",
            r.body
        );
        places.push((user, i as u64 + 1));
    }
    replicate(&set.servers[0]).await;

    // 1. SIGKILL the primary.
    let old = set.named_primary().expect("a primary");
    assert_eq!(old, first);
    let killed = Instant::now();
    set.server(old).crash();
    let promotion = wait_promotion(&set, old);
    let probing = probe_until_recovered(&proxies, &places[0].0, "kill");
    let ((promoted, new_port), (recovered, failures)) = tokio::join!(promotion, probing);
    let last = *recovered.iter().max().unwrap();
    println!(
        "sentinel, primary SIGKILLed: promoted after {:?}; proxies answer 200 again after {:?} from the kill, \
         {:?} from the promotion; failed probe requests {} {:?}",
        promoted - killed,
        recovered.iter().map(|r| *r - killed).collect::<Vec<_>>(),
        recovered.iter().map(|r| r.saturating_duration_since(promoted)).collect::<Vec<_>>(),
        failures.total(),
        failures.0
    );
    assert!(
        last - killed < Duration::from_secs(30),
        "recovered {:?} after the kill",
        last - killed
    );
    assert!(
        last.saturating_duration_since(promoted) < Duration::from_secs(10),
        "the contract: the new primary is found within 10 s of its promotion"
    );
    assert_places(&proxies, &places).await;
    assert!(
        wait_until(
            Duration::from_secs(3),
            Duration::from_millis(50),
            || async { a.readyz().await == 200 && b.readyz().await == 200 }
        )
        .await
    );

    // 2. A graceful failover: the current primary stays up and becomes a replica.
    // Phase 1's probes entered behind the first 100, so these places are whatever enter says.
    for i in 100..120 {
        let user = format!("s-{i:03}");
        let r = proxies[i % 2].enter(&user).await;
        assert_eq!(r.status, 200, "{user}: {}", r.body);
        places.push((user, r.json()["position"].as_u64().expect("position")));
    }
    replicate(set.server(new_port)).await;
    // The spare, soon promoted, lags from here on: its replication is cut (it stays up and
    // answers the sentinels). Users entered now are acknowledged by the primary and lost by the
    // failover, every run; each proxy answers their status once, so both have learned their
    // numbers, which the new primary hands to newcomers.
    assert_eq!(new_port, replicated_from);
    // Once cut, the spare drops out of its primary's INFO: the sentinels must have found it
    // there before, or they have no replica to promote (NOGOODSLAVE).
    let spare = format!("127.0.0.1:{}", replica.port());
    topology::wait_blocking("the sentinels know the spare", Duration::from_secs(20), || {
        set.sentinels.iter().all(|s| {
            let replicas = cli(s.port, &["SENTINEL", "REPLICAS", topology::MASTER]);
            let mut lines = replicas.lines().map(str::trim);
            replicas.contains(&spare) && lines.any(|l| l == "slave")
        })
    });
    cli(new_port, &["ACL", "SETUSER", REPL_USER, "off"]);
    cli(new_port, &["CLIENT", "KILL", "USER", REPL_USER]);
    topology::wait_blocking("the spare's replication cut", Duration::from_secs(5), || {
        topology::info_field(replica.port(), "replication", "master_link_status").as_deref() == Some("down")
    });
    let mut gone: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for i in 0..10 {
        let user = format!("gone-{i:02}");
        let r = proxies[i % 2].enter(&user).await;
        assert_eq!(r.status, 200, "{user}: {}", r.body);
        let place = r.json()["position"].as_u64().expect("position");
        for proxy in proxies {
            assert_waiting_at(&proxy.status(&user).await, place);
        }
        gone.insert(user, place);
    }
    let stop_polling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let polling = tokio::spawn(poll_lost(
        proxies.iter().map(|p| p.url("/queue/status")).collect(),
        gone.keys().cloned().collect(),
        stop_polling.clone(),
    ));
    // NOGOODSLAVE until the sentinel has found the spare in the new primary's INFO and heard
    // from it; INPROG while it still counts the first failover as in progress.
    let leader = set.sentinels[0].port;
    let mut reply = String::new();
    topology::wait_blocking(
        "SENTINEL FAILOVER accepted",
        Duration::from_secs(15),
        || {
            reply = cli(leader, &["SENTINEL", "FAILOVER", topology::MASTER]);
            reply.trim() == "OK" || !(reply.contains("NOGOODSLAVE") || reply.contains("INPROG"))
        },
    );
    assert_eq!(reply.trim(), "OK", "SENTINEL FAILOVER: {reply}");
    let asked = Instant::now();
    let promoted_at = OnceLock::new();
    let promotion = async {
        let promotion = wait_promotion(&set, new_port).await;
        promoted_at.set(promotion.0).expect("set once");
        promotion
    };
    let writing = write_until_followed(&proxies, "graceful", &promoted_at, &replica);
    let ((promoted, third), (acked, follow)) = tokio::join!(promotion, writing);
    assert_eq!(third, replica.port());
    // Which acknowledged enters reached the new primary? The demoted one keeps taking writes
    // until the sentinels reconfigure it (seconds later); what it took then is lost.
    let queue = keys(&a).queue;
    let mut on_new = replica.conn().await;
    let mut lost = 0;
    let mut lost_users = Vec::new();
    for (_, user, _) in &acked {
        let score: Option<u64> = redis::cmd("ZSCORE")
            .arg(&queue)
            .arg(user)
            .query_async(&mut on_new)
            .await
            .expect("ZSCORE");
        if score.is_none() {
            lost += 1;
            lost_users.push(user.clone());
        }
    }
    // Polled on for 3 s after both proxies followed: the 1 s bound is seen, and how late a
    // proxy that misses it tells.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_polling.store(true, std::sync::atomic::Ordering::Relaxed);
    let heard = polling.await.expect("poller");
    let mut lost_gone = Vec::new();
    for user in gone.keys() {
        let score: Option<u64> =
            redis::cmd("ZSCORE").arg(&queue).arg(user).query_async(&mut on_new).await.expect("ZSCORE");
        if score.is_none() {
            lost_gone.push(user.clone());
        }
    }
    assert_eq!(lost_gone.len(), gone.len(), "the lagging spare lost every user entered after the cut");
    let (mut wrong, late, told_in, timelines) = judge_lost(&heard, &gone, &follow);
    wrong.extend(late);
    println!(
        "sentinel, lagged replica promoted: {} users lost by the cut, polled {} times on both proxies; told \
         NOT_IN_QUEUE at the latest {told_in:?} after each proxy's first write to the new primary",
        gone.len(),
        heard.len()
    );
    assert!(
        wrong.is_empty(),
        "users lost by the failover (contract section 5): {wrong:#?}\none lost user's answers per proxy \
         (ms from the proxy's first write to the new primary, code, status, position): {timelines:?}\n\
         the proxies' Redis connections:\n{}",
        proxies
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.logs()
                    .lines()
                    .filter(|l| l.contains("primary") || l.contains("redis connection"))
                    .map(|l| format!("proxy {i}: {l}\n"))
                    .collect::<Vec<_>>()
            })
            .collect::<String>()
    );
    // The enters the demoted primary took while failing over are lost too (how many varies,
    // none in some runs): asked now, long after both proxies followed, each of them and of the
    // users lost by the cut is told NOT_IN_QUEUE by both at their first status that Redis
    // answers, within 1 s.
    for user in lost_users.iter().chain(gone.keys()) {
        for (i, proxy) in proxies.iter().enumerate() {
            let asked = Instant::now();
            let r = loop {
                let r = proxy.status(user).await;
                if r.status != 503 || asked.elapsed() > Duration::from_secs(1) {
                    break r;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert_answer(&format!("proxy {i}: {user}, lost by the failover"), &r, 200, not_in_queue());
            assert!(asked.elapsed() <= Duration::from_secs(1), "proxy {i}: {user} told only after {:?}", asked.elapsed());
        }
    }
    println!(
        "sentinel: {} enters lost by the demoted primary and the {} lost by the cut, each told NOT_IN_QUEUE by both proxies",
        lost_users.len(),
        gone.len()
    );
    let moved: Vec<Option<Duration>> = follow
        .iter()
        .map(|f| f.since.map(|t| t.saturating_duration_since(promoted)))
        .collect();
    println!(
        "sentinel, graceful failover (old primary demoted, still up): promoted {:?} after SENTINEL FAILOVER; \
         each proxy writes only to the new primary from {moved:?} after the promotion on; \
         {} enters acknowledged while failing over, {lost} of them by the demoted primary (lost); \
         per proxy after the promotion (run on the new primary, acknowledged there but lost, failed): {:?}",
        promoted - asked,
        acked.len(),
        follow
            .iter()
            .map(|f| (f.run, f.lost_after_promotion, &f.failed.0))
            .collect::<Vec<_>>()
    );
    for (i, f) in follow.iter().enumerate() {
        assert!(
            f.run >= FOLLOWED_RUN,
            "proxy {i} never wrote {FOLLOWED_RUN} enters in a row to the new primary within \
             {FOLLOW_BOUND:?} + 5 s of the promotion: {f:?}\n{}",
            proxies[i].logs()
        );
        assert!(
            moved[i].is_some_and(|m| m < FOLLOW_BOUND),
            "the contract: proxy {i} follows the new primary within 10 s of the promotion, took {:?}",
            moved[i]
        );
    }
    assert_places(&proxies, &places).await;
    assert!(a.is_running() && b.is_running(), "no restart");
    set.servers.push(replica);
    println!(
        "proxies_follow_the_sentinels_through_failovers: {:?}",
        t0.elapsed()
    );
}

/// Section 7 with passwords: the nodes want one (`requirepass`), the sentinels another. The proxy
/// asks the sentinels with the credentials of their URLs and logs in to the primary with the
/// password `password_env` names, and to the replica promoted once the primary is killed. Without
/// the primary's password, or with a wrong sentinel password, it never gets in (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_for_the_primary_and_for_the_sentinels() {
    let passwords = Passwords { node: "node-secret".into(), sentinel: "sentinel-secret".into() };
    let mut set = SentinelSet::start_as(Some(passwords.clone()));
    let api = DemoApi::start(&[]);
    let room = |yaml: &str| {
        Proxy::builder(&set.servers[0].url(), api.addr())
            .yaml(yaml)
            .yaml("admission: {interval: 100ms, batch_size: 10}")
            .env(NODE_PASSWORD_ENV, &passwords.node)
    };
    let proxy = room(&set.yaml()).start().await;
    let ready = proxy.until_readyz(200, Duration::from_secs(10)).await;
    assert!(ready, "ready through the sentinels:\n{}", proxy.logs());
    let token = proxy.until_ready("pw-user", Duration::from_secs(10)).await;
    let order = proxy.order("pw-user", Some(&token)).await;
    assert_eq!(order.status, 201, "the token admitted through the primary buys: {}", order.body);

    // The sentinels answer, the primary refuses a proxy that has not its password; a wrong
    // sentinel password gets no answer from the sentinels at all.
    let no_login = room(&set.yaml()).yaml("redis: {sentinel: {password_env: ~}}").start().await;
    let wrong_sentinel = room(&set.yaml().replace(":sentinel-secret@", ":wrong@")).start().await;
    for (what, refused) in [("no primary password", &no_login), ("wrong sentinel password", &wrong_sentinel)] {
        let r = refused.enter("pw-refused").await;
        assert_eq!(r.status, 503, "{what}: {}\n{}", r.body, refused.logs());
        assert_eq!(refused.readyz().await, 503, "{what}");
    }
    assert!(
        no_login.logs().contains("NOAUTH") || no_login.logs().contains("Authentication required"),
        "the primary's refusal is logged:\n{}",
        no_login.logs()
    );

    // Killed: the replica the sentinels promote wants the same password, and gets it.
    let old = set.named_primary().expect("a primary");
    set.server(old).crash();
    let (promoted, new_port) = wait_promotion(&set, old).await;
    assert_ne!(new_port, old);
    let (recovered, failures) = probe_until_recovered(&[&proxy], "pw-user", "pw").await;
    println!(
        "sentinel with passwords: recovered {:?} after the promotion; failed probes {:?}",
        recovered[0].saturating_duration_since(promoted),
        failures.0
    );
    proxy.until_ready("pw-after", Duration::from_secs(10)).await;
    let logs = proxy.logs();
    for refusal in ["NOAUTH", "WRONGPASS", "Authentication required", "invalid password"] {
        assert!(!logs.contains(refusal), "every login succeeded ({refusal}):\n{logs}");
    }
}

/// `calls` of a command in `INFO commandstats` of the server on `port` (0 before its first).
fn calls(port: u16, command: &str) -> u64 {
    info_field(port, "commandstats", &format!("cmdstat_{command}"))
        .and_then(|v| v.split(',').find_map(|kv| kv.strip_prefix("calls=").map(str::to_owned)))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `read_from_replicas` behind sentinels: a status (which only reads, without abandonment and
/// enforced polling) runs on the replica the sentinels name, as EVALSHA_RO, and answers as the
/// primary would; when the replica dies, the primary answers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_read_from_the_replica_and_fall_back_to_the_primary() {
    let mut set = SentinelSet::start();
    let api = DemoApi::start(&[]);
    let proxy = Proxy::builder(&set.servers[0].url(), api.addr())
        .yaml(&set.yaml())
        // The first tick admits from the empty line at start; nobody is admitted after it.
        .yaml("redis: {read_from_replicas: true}\nadmission: {interval: 1h, batch_size: 1}")
        .start_settled(&set.servers[0].conn().await)
        .await;
    assert!(proxy.until_readyz(200, Duration::from_secs(10)).await, "{}", proxy.logs());
    let users: Vec<String> = (0..10).map(|i| format!("ro-{i}")).collect();
    for (i, user) in users.iter().enumerate() {
        let r = proxy.enter(user).await;
        assert_eq!(r.json()["position"].as_u64(), Some(i as u64 + 1), "{user}: {}", r.body);
    }
    replicate(&set.servers[0]).await;
    let (primary, replica) = (set.servers[0].port(), set.servers[1].port());
    // Waiting users' statuses are mostly answered without Redis (README, "Polls that never reach
    // Redis"); a user who never entered is looked up every time.
    let statuses = |n: usize| {
        let proxy = &proxy;
        async move {
            for k in 0..n {
                let r = proxy.status(&format!("ghost-{k}")).await;
                assert_eq!(r.status, 200, "{}", r.body);
                assert_eq!(r.json()["status"], "NOT_IN_QUEUE", "{}", r.body);
            }
        }
    };
    // The replica's connection opens in the background, after the first calls.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while calls(replica, "evalsha_ro") == 0 {
        assert!(std::time::Instant::now() < deadline, "no status reached the replica:\n{}", proxy.logs());
        statuses(1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Scripts and transactions the primary runs: a status there is one of them, and so are the
    // proxy's own background reads (the room's numbers, its state), a few a second.
    let on_primary = || calls(primary, "evalsha") + calls(primary, "exec") + calls(primary, "evalsha_ro");
    const N: u64 = 100;
    let (replica_before, primary_before) = (calls(replica, "evalsha_ro"), on_primary());
    statuses(N as usize).await;
    let (replica_after, primary_after) = (calls(replica, "evalsha_ro"), on_primary());
    set.server(replica).crash();
    statuses(N as usize).await;
    let primary_fallback = on_primary() - primary_after;
    println!(
        "sentinel read_from_replicas: {N} statuses: EVALSHA_RO on the replica {}, scripts and \
         transactions on the primary {} (background included); {N} more with the replica killed: \
         on the primary {primary_fallback}",
        replica_after - replica_before,
        primary_after - primary_before
    );
    assert_eq!(replica_after - replica_before, N, "every status on the replica");
    assert!(primary_after - primary_before < N, "the statuses did not go to the primary as well");
    assert!(primary_fallback >= N, "with the replica gone, the primary answered every status");
    // Those who did enter kept their places throughout.
    for (i, user) in users.iter().enumerate() {
        let r = proxy.status(user).await;
        assert_eq!(r.json()["position"].as_u64(), Some(i as u64 + 1), "{user}: {}", r.body);
    }
    assert!(proxy.is_running());
}
