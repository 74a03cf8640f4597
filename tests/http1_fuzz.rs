//! A differential fuzz target for the connection loop: arbitrary byte streams (several pipelined
//! requests built from hostile pieces, then mutated, then cut at arbitrary places and sent a
//! piece at a time) go to a proxy with the early path and to one without it
//! (`tests/differential`); the run fails at the first stream for which the client's answers, or
//! the requests the upstream receives and where each ends, differ.
//!
//! cargo-fuzz needs nightly and a libFuzzer build of the whole proxy around a real Redis, so this
//! is a test binary with its own generator instead:
//!
//!   cargo test --test http1_fuzz                          # 30 s (the suite's run)
//!   HTTP1_FUZZ_SECS=600 cargo test --test http1_fuzz -- --nocapture
//!   HTTP1_FUZZ_SEED=12345 HTTP1_FUZZ_SECS=1 ...           # replays one run's cases from its seed
//!
//! Each lane runs its own pair of proxies; `HTTP1_FUZZ_LANES` (default 2) sets how many.

mod common;
mod differential;

use common::{clock_seed, Rng};
use std::time::{Duration, Instant};

/// One request, built from pieces a client (or an attacker) sends. Two in five are a status or
/// an enter as a browser sends it, so the early path takes a good share of them.
fn request(rng: &mut Rng, prefix: &str, id: &str) -> Vec<u8> {
    if rng.chance(40) {
        let user = *rng.pick(&["u1", "u2", "u3", "new1"]);
        let head = if rng.chance(60) {
            format!("GET {prefix}/status HTTP/1.1\r\nHost: room\r\n{id}: {user}\r\n\r\n")
        } else {
            format!("POST {prefix}/enter HTTP/1.1\r\nHost: room\r\n{id}: {user}\r\nContent-Length: 0\r\n\r\n")
        };
        return head.into_bytes();
    }
    if rng.chance(15) {
        let head = "POST /api/catalog HTTP/1.1\r\nHost: room\r\n";
        let request = match rng.below(3) {
            0 => format!("{head}Content-Length: 5\r\n\r\nhello"),
            1 => format!("{head}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            _ => format!("GET /api/catalog?{} HTTP/1.1\r\nHost: room\r\n\r\n", rng.below(100)),
        };
        return request.into_bytes();
    }
    let method = *rng.pick(&["GET", "GET", "POST", "POST", "PUT", "get", "OPTIONS", "CONNECT"]);
    let targets = [
        format!("{prefix}/status"),
        format!("{prefix}/status"),
        format!("{prefix}/enter"),
        format!("{prefix}/enter"),
        format!("{prefix}/status?t=1"),
        format!("http://room{prefix}/status"),
        "/api/orders".to_owned(),
        "/api/catalog".to_owned(),
        "//api/orders".to_owned(),
        "*".to_owned(),
        format!("{prefix}/"),
        format!("{prefix}/event"),
    ];
    let target = rng.pick(&targets).clone();
    let version = *rng.pick(&["HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "HTTP/2.0"]);
    let sp = if rng.chance(5) { *rng.pick(&["  ", "\t", " \t"]) } else { " " };
    let eol = if rng.chance(10) { "\n" } else { "\r\n" };
    let mut head = format!("{method} {target}{sp}{version}{eol}");
    let mut body = Vec::new();
    let mut fields = Vec::new();
    if rng.chance(90) {
        fields.push("Host: room".to_owned());
    }
    if rng.chance(80) {
        fields.push(format!("{id}: {}", rng.pick(&["u1", "u2", "u3", "new1", "new2", ""])));
    }
    // The body's framing: none, a length, chunked, or something in between.
    match rng.below(8) {
        0 | 1 | 2 => {}
        3 => {
            let data = b"{}hello"[..rng.below(8)].to_vec();
            let declared = match rng.below(6) {
                0 => data.len() + 1,
                1 => data.len().saturating_sub(1),
                _ => data.len(),
            };
            fields.push(format!("Content-Length: {declared}"));
            body = data;
        }
        4 => {
            fields.push("Transfer-Encoding: chunked".to_owned());
            body = chunked(rng);
        }
        5 => {
            fields.push((*rng.pick(&["Content-Length: 0", "Content-Length: 00", "Content-Length: +2", "Content-Length: 2, 2"])).to_owned());
            fields.push((*rng.pick(&["Content-Length: 2", "Transfer-Encoding: chunked", "X-Other: 1"])).to_owned());
            body = if rng.chance(50) { b"{}".to_vec() } else { chunked(rng) };
        }
        6 => {
            let te = *rng.pick(&[
                "Transfer-Encoding: chunked, identity",
                "Transfer-Encoding: gzip, chunked",
                "Transfer-Encoding:  chunked ",
                "Transfer-Encoding: Chunked",
                "Transfer-Encoding : chunked",
                "Transfer-Encoding: xchunked",
                "transfer-encoding: chunked\r\nTransfer-Encoding: chunked",
            ]);
            fields.push(te.to_owned());
            body = chunked(rng);
        }
        _ => fields.push("Content-Length: 0".to_owned()),
    }
    for _ in 0..rng.below(4) {
        let field = match rng.below(14) {
            0 => "Connection: close".to_owned(),
            1 => "Connection: keep-alive".to_owned(),
            2 => "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABk".to_owned(),
            3 => "Connection: Upgrade\r\nUpgrade: websocket".to_owned(),
            4 => "Upgrade: h2c".to_owned(),
            5 => "Expect: 100-continue".to_owned(),
            6 => "Keep-Alive: timeout=5".to_owned(),
            7 => "X-Fold: a\r\n b".to_owned(),
            8 => "X-Nul: a\0b".to_owned(),
            9 => "X-Tab:\ta\tb".to_owned(),
            10 => format!("X-Long: {}", "x".repeat(rng.below(3000))),
            11 => "X-Entry-Token: 00000000-0000-4000-8000-000000000000".to_owned(),
            12 => "Host: other".to_owned(),
            _ => format!("X-Method-Override: {}", rng.pick(&["POST", "GET"])),
        };
        fields.push(field);
    }
    // Shuffled, so framing fields come in every order.
    for i in (1..fields.len()).rev() {
        fields.swap(i, rng.below(i + 1));
    }
    for field in fields {
        head.push_str(&field);
        head.push_str(eol);
    }
    head.push_str(eol);
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&body);
    bytes
}

fn chunked(rng: &mut Rng) -> Vec<u8> {
    let mut body = Vec::new();
    for _ in 0..rng.below(3) {
        let data = &b"abcdefghij"[..rng.below(10)];
        let size = if rng.chance(10) { data.len() + 1 } else { data.len() };
        let ext = if rng.chance(20) { ";x=y" } else { "" };
        body.extend_from_slice(format!("{size:x}{ext}\r\n").as_bytes());
        body.extend_from_slice(data);
        body.extend_from_slice(if rng.chance(5) { b"\n" } else { b"\r\n" });
    }
    body.extend_from_slice(match rng.below(10) {
        0 => b"0\r\nX-Trailer: 1\r\n\r\n",
        1 => b"0\r\n\n",
        2 => b"0\r\n",
        _ => b"0\r\n\r\n",
    });
    body
}

/// A stream of one to four requests, perhaps mutated, cut into segments.
fn case(rng: &mut Rng, prefix: &str, id: &str) -> Vec<Vec<u8>> {
    let mut stream = Vec::new();
    for _ in 0..1 + rng.below(4) {
        stream.extend(request(rng, prefix, id));
    }
    if rng.chance(25) {
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(stream.len() + 1);
            match rng.below(3) {
                0 if at < stream.len() => stream[at] ^= 1 << rng.below(8),
                1 if at < stream.len() => drop(stream.remove(at)),
                _ => stream.insert(at, *rng.pick(b"\r\n \t\0:0a;")),
            }
        }
    }
    if rng.chance(10) {
        stream.truncate(rng.below(stream.len() + 1));
    }
    let mut cuts: Vec<usize> = (0..rng.below(6)).map(|_| rng.below(stream.len() + 1)).collect();
    if rng.chance(5) {
        // A trickle: a byte at a time, up to a point.
        cuts.extend(0..stream.len().min(40));
    }
    cuts.push(0);
    cuts.push(stream.len());
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2).map(|w| stream[w[0]..w[1]].to_vec()).collect()
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_early_path_changes_nothing_any_stream_of_bytes_can_see() {
    let seconds = env_number("HTTP1_FUZZ_SECS", 30);
    let lanes = env_number("HTTP1_FUZZ_LANES", 2).max(1);
    let seed = env_number("HTTP1_FUZZ_SEED", 0);
    let seed = if seed != 0 {
        seed
    } else {
        clock_seed()
    };
    eprintln!("http1_fuzz: seed {seed}, {seconds} s, {lanes} lanes (HTTP1_FUZZ_SEED={seed} replays it)");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let runs = (0..lanes).map(|lane| async move {
        let pair = differential::Pair::start("").await;
        let (prefix, id) = (pair.early.proxy.endpoint_prefix(), pair.early.proxy.identity_header());
        let mut rng = Rng(seed.wrapping_add(lane.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
        let mut cases = 0u64;
        let mut forwarded = 0usize;
        let mut retried = 0usize;
        while Instant::now() < deadline {
            let segments = case(&mut rng, &prefix, &id);
            let (mut early, mut full) = pair.run(&segments).await;
            // A difference is tried again (both sides, the same bytes): a starved scheduler can
            // make one side meet a deadline the other does not, a real difference repeats.
            for _ in 0..2 {
                if early == full {
                    break;
                }
                retried += 1;
                eprintln!("lane {lane}, case {cases}: a difference, tried again\n{}", differential::describe(&segments, &early, &full));
                (early, full) = pair.run(&segments).await;
            }
            if early != full {
                return Err(format!(
                    "lane {lane}, case {cases} (seed {seed}): the two paths differ\n{}",
                    differential::describe(&segments, &early, &full)
                ));
            }
            forwarded += early.upstream.len();
            cases += 1;
        }
        let (early_answers, full_answers) = pair.early_answers();
        if full_answers != 0 {
            return Err(format!("lane {lane}: the proxy without the early path answered {full_answers} early"));
        }
        Ok((cases, early_answers, forwarded, retried))
    });
    let results = futures::future::join_all(runs).await;
    let mut total = (0, 0, 0, 0);
    for result in results {
        let (cases, early, forwarded, retried) = result.unwrap_or_else(|finding| panic!("{finding}"));
        total = (total.0 + cases, total.1 + early, total.2 + forwarded, total.3 + retried);
    }
    eprintln!(
        "http1_fuzz: {} cases, {} answered by the early path, {} requests at the upstreams, no difference \
         ({} tried again after a difference that did not repeat)",
        total.0, total.1, total.2, total.3
    );
    assert!(total.0 > 0 && total.1 > 0, "the run exercised nothing");
}
