//! Real Redis topologies for the cluster, sentinel and chaos tests: a six-node Redis Cluster and a
//! sentinel-managed primary/replica set, each on free ports in temp dirs, every process killed on
//! Drop. Built from `common::RedisServer` where a plain `redis-server` will do; sentinels need a
//! config file of their own, so they get their own small process type here.
//!
//! Admin commands go through `redis-cli`, blocking: they are rare, short, and the same calls an
//! operator would type.
#![allow(dead_code)]

use crate::common::{free_port, RedisServer};
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `redis-cli -p <port> <args>`: stdout (raw replies, one per line), panicking if it cannot run.
pub fn cli(port: u16, args: &[&str]) -> String {
    cli_as(port, None, args)
}

/// [`cli`] logged in with `password` (of the default user), when there is one.
pub fn cli_as(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut command = Command::new("redis-cli");
    command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(password) = password {
        command.args(["-a", password, "--no-auth-warning"]);
    }
    let out = command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// One `field:value` of an INFO section.
pub fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    cli(port, &["INFO", section]).lines().find_map(|l| {
        l.trim_end()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::to_owned)
    })
}

/// Polls `cond` every 20 ms, blocking, until true or `timeout`; panics naming `what`.
pub fn wait_blocking(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---- Redis Cluster ------------------------------------------------------------------------------

/// Three primaries with a replica each.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

/// A line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    /// The primary's id, for a replica.
    pub replica_of: Option<String>,
    pub slots: Vec<(u16, u16)>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let started = Instant::now();
        let nodes: Vec<RedisServer> = (0..6).map(|_| start_cluster_node()).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = cli(nodes[0].port(), &args);
        assert!(
            out.contains("[OK] All 16384 slots covered"),
            "cluster create failed:\n{out}"
        );
        let cluster = Cluster { nodes };
        cluster.wait_settled(Duration::from_secs(20));
        println!("cluster of 6 nodes ready in {:?}", started.elapsed());
        cluster
    }

    /// Every node says ok and sees three primaries with slots and three replicas (gossip spreads
    /// the roles a moment after `--cluster create` returns), every replica is in sync, and every
    /// node's `CLUSTER SLOTS` lists a replica per range: Redis 7 leaves a replica out until gossip
    /// carried its replication offset, and a client that maps the slots before then never reads
    /// from it.
    pub fn wait_settled(&self, timeout: Duration) {
        wait_blocking("cluster settled", timeout, || {
            self.nodes.iter().all(|n| {
                let info = cli(n.port(), &["CLUSTER", "INFO"]);
                let lines = self.node_lines_from(n.port());
                info.contains("cluster_state:ok")
                    && lines
                        .iter()
                        .filter(|l| l.primary && !l.slots.is_empty())
                        .count()
                        == 3
                    && lines.iter().filter(|l| l.replica_of.is_some()).count() == 3
                    && slot_ranges_with_replicas(n.port()) == 3
            }) && self.node_lines().iter().filter(|l| !l.primary).all(|r| {
                info_field(r.port, "replication", "master_link_status").as_deref() == Some("up")
            })
        });
    }

    pub fn node(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("no node on that port")
    }

    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The overlay that points a proxy at this cluster instead of a single URL.
    pub fn yaml(&self) -> String {
        let seeds: Vec<String> = self.seeds().iter().map(|s| format!("\"{s}\"")).collect();
        format!("redis: {{url: ~, cluster: [{}]}}", seeds.join(", "))
    }

    pub fn node_lines(&self) -> Vec<NodeLine> {
        self.node_lines_from(self.nodes[0].port())
    }

    /// `CLUSTER NODES` as the node on `port` sees the cluster.
    pub fn node_lines_from(&self, port: u16) -> Vec<NodeLine> {
        let text = cli(port, &["CLUSTER", "NODES"]);
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(parse_node_line)
            .collect()
    }

    pub fn keyslot(&self, key: &str) -> u16 {
        cli(self.nodes[0].port(), &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("keyslot")
    }

    /// (primary, its replica) serving `slot`, as node 0 sees the cluster.
    pub fn shard_of(&self, slot: u16) -> (NodeLine, NodeLine) {
        let lines = self.node_lines();
        let primary = lines
            .iter()
            .find(|l| l.primary && l.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .unwrap_or_else(|| panic!("no primary serves slot {slot}: {lines:#?}"))
            .clone();
        let replica = lines
            .iter()
            .find(|l| l.replica_of.as_deref() == Some(primary.id.as_str()))
            .unwrap_or_else(|| panic!("primary {} has no replica: {lines:#?}", primary.port))
            .clone();
        (primary, replica)
    }

    /// `INFO commandstats` calls per command name, summed per role: (primaries, replicas).
    pub fn command_calls(&self, command: &str) -> (u64, u64) {
        let mut sums = (0, 0);
        for line in self.node_lines() {
            let calls = info_field(line.port, "commandstats", &format!("cmdstat_{command}"))
                .and_then(|v| {
                    v.split(',')
                        .find_map(|kv| kv.strip_prefix("calls=").map(str::to_owned))
                })
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            if line.primary {
                sums.0 += calls;
            } else {
                sums.1 += calls;
            }
        }
        sums
    }

    pub fn reset_stats(&self) {
        for n in &self.nodes {
            cli(n.port(), &["CONFIG", "RESETSTAT"]);
        }
    }
}

/// One cluster-enabled `redis-server`. The bus port defaults to port + 10000, which may be taken
/// or past 65535, so it is chosen here; but `RedisServer::start_with` retries a lost port race
/// with the same arguments, so a bus port someone took meanwhile would fail every retry. Each
/// attempt therefore gets a fresh bus port.
fn start_cluster_node() -> RedisServer {
    let mut last = String::new();
    for _ in 0..5 {
        let bus = free_port().to_string();
        let started = std::panic::catch_unwind(|| {
            RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--cluster-port",
                &bus,
                // Replicas sync at once instead of waiting 5 s for more to join.
                "--repl-diskless-sync-delay",
                "0",
                // By default a cluster refuses every slot (CLUSTERDOWN) from the moment a primary
                // is marked failed until its replica is promoted, so one room's lost primary would
                // take every room down for that second or two; a deployment of several rooms turns
                // this off too (docs/redis.md).
                "--cluster-require-full-coverage",
                "no",
            ])
        });
        match started {
            Ok(node) => return node,
            Err(why) => {
                last = why
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "panicked".into())
            }
        }
    }
    panic!("no cluster node started on five bus ports: {last}");
}

/// How many ranges of `CLUSTER SLOTS` on `port` name a replica besides the primary.
pub fn slot_ranges_with_replicas(port: u16) -> usize {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"));
    let Ok(mut conn) = client.and_then(|c| c.get_connection()) else {
        return 0;
    };
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut conn)
        .unwrap_or_default();
    // Each range: start, end, the primary, then its replicas.
    ranges.iter().filter(|r| r.len() >= 4).count()
}

fn parse_node_line(line: &str) -> NodeLine {
    let f: Vec<&str> = line.split_whitespace().collect();
    let port = f[1]
        .split('@')
        .next()
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("bad CLUSTER NODES line: {line}"));
    let primary = f[2].split(',').any(|flag| flag == "master");
    let slots = f
        .iter()
        .skip(8)
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|n| (n, n)),
        })
        .collect();
    NodeLine {
        id: f[0].to_owned(),
        port,
        primary,
        replica_of: (f[3] != "-").then(|| f[3].to_owned()),
        slots,
    }
}

// ---- Sentinel ----------------------------------------------------------------------------------

pub const MASTER: &str = "mymaster";

/// The variable a proxy in front of a [`SentinelSet::start_as`] set reads the nodes' password
/// from (`redis.sentinel.password_env`).
pub const NODE_PASSWORD_ENV: &str = "WAITROOM_TEST_NODE_PASSWORD";

/// Passwords of a protected sentinel set: the primary's and the replica's `requirepass` (and
/// `masterauth`), and the sentinels' own `requirepass`.
#[derive(Clone)]
pub struct Passwords {
    pub node: String,
    pub sentinel: String,
}

/// A `redis-server sentinel.conf --sentinel` process.
pub struct SentinelProc {
    pub port: u16,
    /// Its own `requirepass`, if any.
    pub password: Option<String>,
    child: Child,
    _dir: tempfile::TempDir,
}

impl SentinelProc {
    pub fn start(primary_port: u16) -> SentinelProc {
        SentinelProc::start_as(primary_port, None)
    }

    /// A sentinel that monitors a primary wanting `passwords.node` and wants
    /// `passwords.sentinel` itself (from clients and from the other sentinels alike).
    pub fn start_as(primary_port: u16, passwords: Option<&Passwords>) -> SentinelProc {
        let dir = tempfile::Builder::new()
            .prefix("waitroom-sentinel")
            .tempdir()
            .expect("tempdir");
        for _ in 0..5 {
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 5000\n\
                     sentinel parallel-syncs {MASTER} 1\n{auth}",
                    dir = dir.path().display(),
                    auth = passwords.map_or(String::new(), |p| format!(
                        "sentinel auth-pass {MASTER} {node}\nrequirepass {own}\nsentinel sentinel-pass {own}\n",
                        node = p.node,
                        own = p.sentinel
                    )),
                ),
            )
            .expect("write sentinel.conf");
            let log = std::fs::File::create(dir.path().join("sentinel.log")).expect("log");
            let mut child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("spawn sentinel");
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break; // lost the port race: try another
                }
                let password = passwords.map(|p| p.sentinel.clone());
                if cli_as(port, password.as_deref(), &["PING"]).trim() == "PONG" {
                    return SentinelProc {
                        port,
                        password,
                        child,
                        _dir: dir,
                    };
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("sentinel did not start");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The primary's port as this sentinel names it.
    pub fn primary_port(&self) -> Option<u16> {
        let out = cli_as(self.port, self.password.as_deref(), &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]);
        out.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }

    /// `SENTINEL MASTER` as a map (num-slaves, num-other-sentinels, flags, ...).
    pub fn master_info(&self) -> HashMap<String, String> {
        let out = cli_as(self.port, self.password.as_deref(), &["SENTINEL", "MASTER", MASTER]);
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].to_owned(), c[1].to_owned()))
            .collect()
    }
}

impl Drop for SentinelProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One primary, one replica, three sentinels (quorum 2).
pub struct SentinelSet {
    /// Replaced as failovers happen; index 0 is the first primary.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<SentinelProc>,
    pub passwords: Option<Passwords>,
}

impl SentinelSet {
    pub fn start() -> SentinelSet {
        SentinelSet::start_as(None)
    }

    /// With `passwords`, the nodes and the sentinels want theirs. The password is set once each
    /// node has started (the harness's readiness probe speaks no AUTH), on the primary before the
    /// replica syncs, so the replica's `masterauth` is what lets it in.
    pub fn start_as(passwords: Option<Passwords>) -> SentinelSet {
        let started = Instant::now();
        let node_password = passwords.as_ref().map(|p| p.node.clone());
        let mut auth: Vec<&str> = Vec::new();
        if let Some(password) = &node_password {
            // masterauth on the primary too: a failover demotes it to a replica.
            auth = vec!["--masterauth", password.as_str()];
        }
        let require = |server: &RedisServer| {
            if let Some(password) = &node_password {
                let out = cli(server.port(), &["CONFIG", "SET", "requirepass", password]);
                assert_eq!(out.trim(), "OK", "requirepass: {out}");
            }
        };
        let mut args = vec!["--repl-diskless-sync-delay", "0"];
        args.extend(&auth);
        let primary = RedisServer::start_with(&args);
        require(&primary);
        let primary_port = primary.port().to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &primary_port, "--repl-diskless-sync-delay", "0"];
        args.extend(&auth);
        let replica = RedisServer::start_with(&args);
        wait_in_sync(replica.port(), Duration::from_secs(10));
        require(&replica);
        let sentinels: Vec<SentinelProc> = (0..3)
            .map(|_| SentinelProc::start_as(primary.port(), passwords.as_ref()))
            .collect();
        // Failover needs every sentinel to know the replica and the other two (hello messages
        // every 2 s on the primary).
        wait_blocking(
            "sentinels see each other and the replica",
            Duration::from_secs(20),
            || {
                sentinels.iter().all(|s| {
                    let m = s.master_info();
                    m.get("num-slaves").map(String::as_str) == Some("1")
                        && m.get("num-other-sentinels").map(String::as_str) == Some("2")
                })
            },
        );
        println!(
            "primary, replica and 3 sentinels ready in {:?}",
            started.elapsed()
        );
        SentinelSet {
            servers: vec![primary, replica],
            sentinels,
            passwords,
        }
    }

    /// The overlay that points a proxy at these sentinels; with passwords, the sentinels' is in
    /// their URLs and the nodes' is read from [`NODE_PASSWORD_ENV`] (the proxy's environment).
    pub fn yaml(&self) -> String {
        let addrs: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| match &s.password {
                Some(password) => format!("\"redis://:{password}@127.0.0.1:{}\"", s.port),
                None => format!("\"{}\"", s.url()),
            })
            .collect();
        let login = match self.passwords {
            Some(_) => format!(", password_env: {NODE_PASSWORD_ENV}"),
            None => String::new(),
        };
        format!(
            "redis: {{url: ~, sentinel: {{master: {MASTER}, addrs: [{}]{login}}}}}",
            addrs.join(", ")
        )
    }

    /// The primary as the first sentinel that answers names it.
    pub fn named_primary(&self) -> Option<u16> {
        self.sentinels.iter().find_map(SentinelProc::primary_port)
    }

    pub fn server(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .expect("no server on that port")
    }
}

/// Until a replica's link to its primary is up.
pub fn wait_in_sync(replica_port: u16, timeout: Duration) {
    wait_blocking("replica in sync", timeout, || {
        info_field(replica_port, "replication", "master_link_status").as_deref() == Some("up")
    });
}

/// Tallies request outcomes by label, for the figures a test prints.
#[derive(Debug, Default, Clone)]
pub struct Tally(pub std::collections::BTreeMap<String, u64>);

impl Tally {
    pub fn add(&mut self, label: impl Into<String>) {
        *self.0.entry(label.into()).or_default() += 1;
    }
    pub fn get(&self, label: &str) -> u64 {
        self.0.get(label).copied().unwrap_or(0)
    }
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
}
