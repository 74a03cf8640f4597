//! The `rooms` phase's part of the report (contract section 17, several rooms in one proxy): what
//! 49 idle rooms beside a busy one cost it, two rooms' crowds at once, and what an idle room costs
//! Redis. Its goals are judged in a full run only: the smoke mode's debug binaries on a shared
//! machine would fail them for reasons that have nothing to do with rooms.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use super::{agg, crowd_batch, crowd_share, f, fmt_num, ms, secs};
use crate::stats::median;
use crate::{ctx, Result};

/// The proxy with one room, and the same proxy with the 49 idle rooms beside it (run.sh's names).
const ALONE: &str = "rooms-1";
const BESIDE: &str = "rooms-50";

/// The paths measured both ways, in table order.
const PATHS: &[(&str, &str)] = &[
    ("status_one", "status, one waiting user (line of 100k)"),
    ("enter_new", "enter, new users"),
    ("protected", "protected forward (token check + consume)"),
];

/// "Within 5 %": the busy room's throughput beside the idle rooms against alone, and its p99.
const MIN_RPS_RATIO: f64 = 0.95;
const MAX_P99_RATIO: f64 = 1.05;
/// Each room of the crowd is adaptive with this target, and no user may be lost.
const CROWD_P95_MS: f64 = 300.0;
/// A room nobody uses costs each proxy at most this many Redis calls a second.
const IDLE_CALLS_PER_S: f64 = 5.0;

fn mark(judged: bool, ok: bool) -> &'static str {
    match (judged, ok) {
        (false, _) => "",
        (true, true) => " ✓",
        (true, false) => " ✗",
    }
}

/// Appends the phase's tables to `md` and its figures to `results` (nothing when it did not run).
pub fn section(raw: &[Value], dir: &Path, meta: &Value, md: &mut String, results: &mut serde_json::Map<String, Value>) -> Result<()> {
    let paths: Vec<&Value> = raw.iter().filter(|v| v["kind"] == "rooms" && v["round"].as_i64().unwrap_or(1) >= 1).collect();
    let idle: Vec<&Value> = raw.iter().filter(|v| v["kind"] == "rooms_idle").collect();
    let crowd = crowd_results(dir)?;
    if paths.is_empty() && idle.is_empty() && crowd.is_empty() {
        return Ok(());
    }
    let judged = meta["mode"] == "full";
    writeln!(md, "\n### Several rooms in one proxy\n").ok();
    if !judged {
        writeln!(md, "Smoke run: the goals are printed, not judged.\n").ok();
    }
    let mut out = serde_json::Map::new();
    if !paths.is_empty() {
        out.insert("paths".into(), busy_beside_idle(&paths, meta, judged, md));
    }
    if !crowd.is_empty() {
        out.insert("crowd".into(), two_crowds(&crowd, judged, md));
    }
    if !idle.is_empty() {
        out.insert("idle".into(), idle_cost(&idle, judged, md));
    }
    results.insert("rooms".into(), Value::Object(out));
    Ok(())
}

fn busy_beside_idle(rows: &[&Value], meta: &Value, judged: bool, md: &mut String) -> Value {
    writeln!(
        md,
        "One busy room alone (`{ALONE}`), and the same room with 49 idle rooms configured before it (`{BESIDE}`): two proxies, each on a Redis of its own, interleaved, wrk -t2 -c64, medians of {} round(s); the ratios are taken per round, then their median.\n",
        meta["rounds"].as_u64().unwrap_or(1)
    )
    .ok();
    writeln!(md, "| path | alone req/s | beside 49 req/s | ratio | alone p50 / p99 | beside 49 p50 / p99 | p99 ratio | goal |").ok();
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---|").ok();
    let mut out = Vec::new();
    for (bench, what) in PATHS {
        let of = |target: &str| -> Vec<&Value> { rows.iter().copied().filter(|v| v["bench"] == *bench && v["target"] == target).collect() };
        let (alone, beside) = (of(ALONE), of(BESIDE));
        if alone.is_empty() || beside.is_empty() {
            continue;
        }
        let (a, b) = (agg(&alone), agg(&beside));
        // Rounds measured a few seconds apart share the machine's mood: pair them.
        let paired = |key: &str| -> f64 {
            let by_round = |rs: &[&Value]| -> BTreeMap<i64, f64> {
                rs.iter().filter_map(|v| Some((v["round"].as_i64()?, f(&v["wrk"], key)))).collect()
            };
            let (x, y) = (by_round(&alone), by_round(&beside));
            median(&y.iter().filter_map(|(r, b)| Some(b / x.get(r)?)).collect::<Vec<_>>())
        };
        let (rps_ratio, p99_ratio) = (paired("rps"), paired("p99_us"));
        writeln!(
            md,
            "| {what} | {} | {} | **{rps_ratio:.2}x**{} | {} / {} | {} / {} | {p99_ratio:.2}x{} | req/s >= {MIN_RPS_RATIO}x, p99 <= {MAX_P99_RATIO}x |",
            fmt_num(a.rps), fmt_num(b.rps), mark(judged, rps_ratio >= MIN_RPS_RATIO),
            ms(a.p50), ms(a.p99), ms(b.p50), ms(b.p99), mark(judged, p99_ratio <= MAX_P99_RATIO),
        )
        .ok();
        out.push(json!({
            "path": bench, "what": what, "rounds": b.rounds, "rps_ratio": rps_ratio, "p99_ratio": p99_ratio,
            "goal": {"rps_ratio": MIN_RPS_RATIO, "p99_ratio": MAX_P99_RATIO},
            "alone": {"rps": a.rps, "p50_us": a.p50, "p99_us": a.p99, "non2xx": a.non2xx, "errors": a.errors},
            "beside_idle": {"rps": b.rps, "p50_us": b.p50, "p99_us": b.p99, "non2xx": b.non2xx, "errors": b.errors},
        }));
    }
    Value::Array(out)
}

/// The two rooms' crowd results (`rooms/crowd-*.json`), in file name order.
fn crowd_results(dir: &Path) -> Result<Vec<Value>> {
    let Ok(entries) = std::fs::read_dir(dir.join("rooms")) else { return Ok(Vec::new()) };
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("crowd-") && n.ends_with(".json")))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).map_err(ctx("rooms crowd json"))?).map_err(ctx("rooms crowd json")))
        .collect()
}

fn two_crowds(crowd: &[Value], judged: bool, md: &mut String) -> Value {
    let users: u64 = crowd.iter().filter_map(|v| v["users"].as_u64()).sum();
    writeln!(
        md,
        "\nA crowd of {users} arriving within a second, split over {} rooms of one proxy by their capacity, at once; each room adaptive (`target_p95: {CROWD_P95_MS:.0}ms`) up to its own batch, in front of its own demo order API (200 ms an order).\n",
        crowd.len()
    )
    .ok();
    writeln!(md, "| room | users | admission, at most | order API (capacity) | ordered / lost | done in (ideal N/rate) | order latency p50 / p95 / p99 | throughput, share of capacity: whole run / 10–90 % of orders | batch after 10 s: mean / min / max | goal |").ok();
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|").ok();
    let mut out = Vec::new();
    for v in crowd {
        let l = &v["order_latency_ms"];
        let (p95, lost) = (f(l, "p95"), v["lost"].as_u64());
        let ok = p95 <= CROWD_P95_MS && lost == Some(0);
        let rate = f(&v["throughput"], "ideal_rate");
        let share = |k: &str| crowd_share(v, k);
        let batch = crowd_batch(v);
        writeln!(
            md,
            "| {} | {} | {} per {} ms | {:.0} slots ({:.0} orders/s) | {} / {} | {:.1} s ({:.1} s) | {} / {} / {} | {} / {} | {batch} | p95 <= {CROWD_P95_MS:.0} ms, none lost{} |",
            v["label"].as_str().unwrap_or("?"),
            v["users"],
            v["admission"]["batch_size"], v["admission"]["interval_ms"],
            // The demo API serves an order in 200 ms, so its slots are its rate / 5.
            rate / 5.0, rate,
            v["completed"], v["lost"],
            f(v, "completion_s"), f(v, "ideal_s"),
            secs(f(l, "p50")), secs(p95), secs(f(l, "p99")),
            share("share"), share("steady_share"),
            mark(judged, ok),
        )
        .ok();
        out.push(json!({
            "room": v["label"], "users": v["users"], "completed": v["completed"], "lost": v["lost"],
            "ideal_rate": rate, "admission": v["admission"], "completion_s": v["completion_s"],
            "order_latency_ms": l, "throughput": v["throughput"], "batch": v["batch"]["after_10s"],
            "goal": {"order_p95_ms": CROWD_P95_MS, "lost": 0}, "met": ok,
        }));
    }
    Value::Array(out)
}

fn idle_cost(rows: &[&Value], judged: bool, md: &mut String) -> Value {
    let first = rows.first().copied().unwrap_or(&Value::Null);
    writeln!(
        md,
        "\nRedis calls of rooms nobody uses: a proxy with only idle rooms, alone on a Redis of its own, counted over {:.0} s from {:.0} s after it was ready (a room goes quiet 5 s after the proxy starts). Sent by the proxy: `MONITOR`'s lines other than those from scripts; all commands: `INFO commandstats`, where a script counts once for itself and once for each command it runs (less the benchmark's own `CONFIG` and `INFO`).\n",
        f(first, "seconds"),
        f(first, "settle_s"),
    )
    .ok();
    writeln!(md, "| rooms | sent by the proxy: calls/s per room | by command (calls/s per room) | all commands/s per room | goal |").ok();
    writeln!(md, "|---:|---:|---|---:|---|").ok();
    let goal = format!("<= {IDLE_CALLS_PER_S:.0} sent per room");
    let mut out = Vec::new();
    // (rooms, calls sent per second) of each proxy, for the cost of one room more.
    let mut sent_rates = Vec::new();
    let sizes: BTreeSet<u64> = rows.iter().filter_map(|v| v["rooms"].as_u64()).collect();
    for n in sizes {
        let Some(v) = rows.iter().find(|v| v["rooms"].as_u64() == Some(n)) else { continue };
        let per = |calls: f64| calls / n as f64 / f(v, "seconds");
        let (sent, all) = (per(f(v, "proxy_calls")), per(f(v, "all_calls")));
        sent_rates.push((n as f64, f(v, "proxy_calls") / f(v, "seconds")));
        let by_command = |counts: &Value| -> Vec<(String, f64)> {
            let mut v: Vec<(String, f64)> = counts
                .as_object()
                .map(|m| m.iter().map(|(k, c)| (k.clone(), per(c.as_f64().unwrap_or(0.0)))).collect())
                .unwrap_or_default();
            v.sort_by(|a, b| b.1.total_cmp(&a.1));
            v
        };
        let listed: Vec<String> = by_command(&v["sent"]).iter().map(|(k, c)| format!("{k} {}", fmt_num(*c))).collect();
        writeln!(md, "| {n} | **{}**{} | {} | {} | {goal} |", fmt_num(sent), mark(judged, sent <= IDLE_CALLS_PER_S), listed.join(", "), fmt_num(all)).ok();
        out.push(json!({
            "rooms": n, "seconds": v["seconds"], "sent_per_room_s": sent, "all_per_room_s": all,
            "script_calls": v["script_calls"], "sent": v["sent"], "commands": v["commands"], "goal": IDLE_CALLS_PER_S,
        }));
    }
    // What the proxy sends whatever its rooms (its connections' keepalive PINGs) weighs on one
    // room alone; the calls each room adds are the contract's cost of a room.
    let mut added = Value::Null;
    if let (Some(&(n0, r0)), Some(&(n1, r1))) = (sent_rates.first(), sent_rates.last()) {
        if n1 > n0 {
            let per_room = (r1 - r0) / (n1 - n0);
            writeln!(
                md,
                "| each room added ({n0:.0} to {n1:.0}) | **{}**{} | besides, {}/s a proxy sends whatever its rooms | | {goal} |",
                fmt_num(per_room),
                mark(judged, per_room <= IDLE_CALLS_PER_S),
                fmt_num(r0 - per_room * n0),
            )
            .ok();
            added = json!({"from": n0, "to": n1, "sent_per_room_s": per_room, "proxy_base_s": r0 - per_room * n0});
        }
    }
    json!({"proxies": out, "each_room_added": added})
}
