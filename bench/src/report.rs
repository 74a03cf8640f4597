//! `report`: a run's raw measurements (`raw.jsonl`, one JSON object a line, written by
//! `bench/run.sh`; `crowd-*.json` from `wrbench crowd`; `meta.json`) turned into medians and
//! ratios: a Markdown table on stdout (and `table.md`), `results.json`, and SVG charts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};

use crate::charts;
use crate::stats::median;
use crate::{ctx, Result};

mod rooms;

#[derive(Args)]
pub struct ReportArgs {
    /// The run's folder (holds raw.jsonl, meta.json, crowd-*.json).
    #[arg(long)]
    dir: PathBuf,
}

/// The paths, in table order: (key, what it is).
const BENCHES: &[(&str, &str)] = &[
    ("status_one", "status, one waiting user (line of 100k)"),
    ("status_many", "status, 10k users cycling (line of 100k)"),
    ("enter_requeue", "enter, already waiting (line of 100k)"),
    ("enter_new", "enter, new users"),
    ("pass", "pass-through GET"),
    ("protected", "protected forward (token check + consume)"),
];

/// What a path is measured against besides nginx `proxy_pass`, whose rate moves with the backend
/// behind it: the fastest anything could do the same work on this machine. A path waitroom
/// answers itself is bounded by nginx answering by itself; one it forwards, by pingora's
/// smallest forwarder; a protected order, by waitroom's own pass-through, so that its ratio is
/// what the token's check and spending cost.
struct Bound {
    bench: &'static str,
    /// The bound's target in raw.jsonl and the bench it ran.
    target: &'static str,
    of: &'static str,
    label: &'static str,
    /// The ratio to the bound to reach (issue 41); none for a path that has no goal of its own.
    goal: Option<f64>,
}

const BOUNDS: &[Bound] = &[
    Bound { bench: "status_one", target: "nginx-return", of: "status_one", label: "nginx `return 200`", goal: Some(1.0) },
    Bound { bench: "status_many", target: "nginx-return", of: "status_many", label: "nginx `return 200`", goal: Some(1.0) },
    Bound { bench: "enter_requeue", target: "nginx-return", of: "enter_requeue", label: "nginx `return 200`", goal: None },
    Bound { bench: "enter_new", target: "nginx-return", of: "enter_new", label: "nginx `return 200`", goal: Some(0.5) },
    Bound { bench: "pass", target: "forwarder", of: "pass", label: "pingora's smallest forwarder", goal: Some(0.95) },
    Bound { bench: "protected", target: "waitroom", of: "pass", label: "waitroom's pass-through", goal: Some(0.6) },
];

/// RSS per connection with 10,000 of them open (issue 41). Held polls are measured by
/// bench/held-rss.sh, which judges its own goal.
const IDLE_CONN_GOAL_KB: f64 = 3.0;
const MEMORY_GOAL_CONNS: f64 = 10_000.0;

/// ✓ or ✗ when the run can judge (a full run), else nothing: the smoke mode's rounds are too few
/// and too short, often on debug builds.
fn verdict(judged: bool, met: Option<bool>) -> &'static str {
    match (judged, met) {
        (true, Some(true)) => " ✓",
        (true, Some(false)) => " ✗",
        _ => "",
    }
}

/// Issue 9's goal for the adaptive room: order p95 within the controller's target while the
/// backend keeps completing most of its capacity, without giving up FIFO or losing anybody.
struct CrowdGoal {
    label: &'static str,
    order_p95_ms: f64,
    steady_share: f64,
}

const ADAPTIVE_GOAL: CrowdGoal = CrowdGoal { label: "room-adaptive", order_p95_ms: 300.0, steady_share: 0.9 };

fn f(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        "–".into()
    } else if x >= 100.0 {
        format!("{:.0}", x)
    } else if x >= 10.0 {
        format!("{:.1}", x)
    } else {
        format!("{:.2}", x)
    }
}

/// Increase per second of a cumulative count over a trailing window of `window` seconds.
fn rate_over(pts: &[(f64, f64)], window: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for i in 0..pts.len() {
        while j < i && pts[i].0 - pts[j + 1].0 >= window {
            j += 1;
        }
        let dt = pts[i].0 - pts[j].0;
        if i > j && dt > 0.0 {
            out.push((pts[i].0, (pts[i].1 - pts[j].1) / dt));
        }
    }
    out
}

/// `10 (0.0 s) → 9 (2.3 s) → ...`: each value of `[[t, batch], ...]` from the sample that first
/// showed it.
fn batch_changes(samples: &[Value]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut last = None;
    for s in samples {
        let (Some(t), Some(b)) = (s[0].as_f64(), s[1].as_u64()) else { continue };
        if last != Some(b) {
            out.push(format!("{b} ({t:.1} s)"));
            last = Some(b);
        }
    }
    out.join(" → ")
}

fn secs(ms: f64) -> String {
    if !ms.is_finite() {
        "–".into()
    } else if ms >= 10_000.0 {
        format!("{:.0} s", ms / 1000.0)
    } else if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{:.0} ms", ms)
    }
}

fn ms(us: f64) -> String {
    if us.is_finite() {
        format!("{:.2} ms", us / 1000.0)
    } else {
        "–".into()
    }
}

/// Medians over the rounds of one (bench, target): req/s, p50 and p99 (us), non-2xx and errors.
#[derive(Clone, Copy)]
struct Agg {
    rps: f64,
    p50: f64,
    p99: f64,
    non2xx: f64,
    errors: f64,
    rounds: usize,
}

fn agg(rows: &[&Value]) -> Agg {
    let w = |k: &str| rows.iter().map(|r| f(&r["wrk"], k)).collect::<Vec<_>>();
    Agg {
        rps: median(&w("rps")),
        p50: median(&w("p50_us")),
        p99: median(&w("p99_us")),
        non2xx: w("non2xx").iter().sum(),
        errors: w("errors").iter().sum(),
        rounds: rows.len(),
    }
}

pub fn run(a: ReportArgs) -> Result<()> {
    let raw_text = std::fs::read_to_string(a.dir.join("raw.jsonl")).map_err(ctx("raw.jsonl"))?;
    let raw: Vec<Value> = raw_text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("raw.jsonl: {e}: {l}")))
        .collect::<Result<_>>()?;
    let meta: Value = std::fs::read_to_string(a.dir.join("meta.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let charts_dir = a.dir.join("charts");
    std::fs::create_dir_all(&charts_dir).map_err(ctx("charts dir"))?;

    let kind = |k: &'static str| raw.iter().filter(move |v| v["kind"] == k);
    let mut md = String::new();
    let mut results = serde_json::Map::new();
    results.insert("meta".into(), meta.clone());

    // ---------------- paths vs nginx ----------------
    // Round 0 is the warm-up of a full run: never counted.
    let wrk_rows: Vec<&Value> = kind("wrk").filter(|v| v["round"].as_i64().unwrap_or(1) >= 1).collect();
    let targets: BTreeSet<String> =
        wrk_rows.iter().filter_map(|v| v["target"].as_str().map(String::from)).collect();
    let get = |bench: &str, target: &str| -> Option<Agg> {
        let rows: Vec<&Value> =
            wrk_rows.iter().copied().filter(|v| v["bench"] == bench && v["target"] == target).collect();
        (!rows.is_empty()).then(|| agg(&rows))
    };
    let by_round = |bench: &str, t: &str| -> BTreeMap<i64, f64> {
        wrk_rows
            .iter()
            .filter(|v| v["bench"] == bench && v["target"] == t)
            .filter_map(|v| Some((v["round"].as_i64()?, f(&v["wrk"], "rps"))))
            .collect()
    };
    // Ratio per round (target round i / base round i), then the median: pairs measured a few
    // seconds apart share the machine's mood. A protected order's base is the pass bench's round
    // i, minutes earlier: the same round, not the same minute.
    let ratio_to = |bench: &str, target: &str, base_bench: &str, base: &str| -> f64 {
        let b = by_round(base_bench, base);
        let ratios: Vec<f64> = by_round(bench, target).iter().filter_map(|(r, x)| Some(x / b.get(r)?)).collect();
        median(&ratios)
    };
    let paired = |bench: &str, target: &str| ratio_to(bench, target, bench, "nginx");
    let judged = meta["mode"] == "full";

    let paths_start = md.len();
    writeln!(md, "### Paths against their bounds and against nginx `proxy_pass` (wrk -t2 -c64, medians of {} round(s))\n", meta["rounds"].as_u64().unwrap_or(1)).ok();
    // The machine's mood: the 1-minute load average when each run started (the benchmark's own
    // processes count in it: wrk, the proxy, Redis and the API keep two cores busy).
    let mut loads: Vec<f64> = wrk_rows.iter().filter_map(|v| v["load"].as_f64()).collect();
    loads.sort_by(f64::total_cmp);
    if !loads.is_empty() {
        writeln!(
            md,
            "1-minute load average at the start of each wrk run: {:.2} to {:.2} (median {:.2}); before the first: {}.\n",
            loads[0],
            loads[loads.len() - 1],
            median(&loads),
            meta["load_start"].as_f64().map(|l| format!("{l:.2}")).unwrap_or_else(|| "?".into())
        )
        .ok();
    }
    results.insert("load".into(), json!({"min": loads.first(), "max": loads.last(), "median": median(&loads)}));
    writeln!(md, "| path | bound | bound req/s | waitroom req/s | ratio to the bound | goal | nginx `proxy_pass` req/s | ratio to `proxy_pass` | nginx p50 / p99 | waitroom p50 / p99 | waitroom non-2xx |").ok();
    writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|").ok();
    let mut paths_json = Vec::new();
    let mut chart_cats = Vec::new();
    let (mut c_ng_rps, mut c_bd_rps, mut c_wr_rps, mut c_ng_p99, mut c_wr_p99, mut c_ng_p50, mut c_wr_p50) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for (bench, what) in BENCHES {
        let (Some(n), Some(w)) = (get(bench, "nginx"), get(bench, "waitroom")) else { continue };
        let ratio = paired(bench, "waitroom");
        let bound = BOUNDS.iter().find(|b| b.bench == *bench);
        // Missing in a run made before the bounds were measured, or with --paths leaving out pass.
        let bound_agg = bound.and_then(|b| get(b.of, b.target));
        let bound_ratio = match (bound, bound_agg) {
            (Some(b), Some(_)) => ratio_to(bench, "waitroom", b.of, b.target),
            _ => f64::NAN,
        };
        let goal = bound.and_then(|b| b.goal);
        let met = goal.filter(|_| bound_ratio.is_finite()).map(|g| bound_ratio >= g);
        let goal_s = goal.map(|g| format!(">= {g:?}x")).unwrap_or_default();
        let bound_ratio_s = if bound_ratio.is_finite() { format!("**{bound_ratio:.2}x**") } else { "–".into() };
        writeln!(
            md,
            "| {what} | {} | {} | {} | {bound_ratio_s}{} | {goal_s} | {} | {:.2}x | {} / {} | {} / {} | {} |",
            bound.map_or("–", |b| b.label),
            fmt_num(bound_agg.map_or(f64::NAN, |a| a.rps)),
            fmt_num(w.rps),
            verdict(judged, met),
            fmt_num(n.rps), ratio, ms(n.p50), ms(n.p99), ms(w.p50), ms(w.p99), w.non2xx + w.errors
        )
        .ok();
        paths_json.push(json!({
            "path": bench, "what": what, "ratio": ratio, "rounds": w.rounds,
            "bound": bound.map(|b| json!({
                "what": b.label, "target": b.target, "bench": b.of, "rps": bound_agg.map(|a| a.rps),
                "ratio": bound_ratio, "goal": b.goal, "met": met, "judged": judged,
            })),
            "nginx": {"rps": n.rps, "p50_us": n.p50, "p99_us": n.p99, "non2xx": n.non2xx, "errors": n.errors},
            "waitroom": {"rps": w.rps, "p50_us": w.p50, "p99_us": w.p99, "non2xx": w.non2xx, "errors": w.errors},
        }));
        chart_cats.push(bench.to_string());
        c_ng_rps.push(n.rps);
        c_bd_rps.push(bound_agg.map_or(f64::NAN, |a| a.rps));
        c_wr_rps.push(w.rps);
        c_ng_p99.push(n.p99 / 1000.0);
        c_wr_p99.push(w.p99 / 1000.0);
        c_ng_p50.push(n.p50 / 1000.0);
        c_wr_p50.push(w.p50 / 1000.0);
    }
    results.insert("paths".into(), Value::Array(paths_json));
    // A run without the paths phase (say, only the crowd) gets no empty table.
    if chart_cats.is_empty() {
        md.truncate(paths_start);
    } else {
        writeln!(
            md,
            "\nThe bounds ran in the same rounds as waitroom (a protected order's: the pass bench's rounds). {}",
            if judged { "Goals are judged on the ratio to the bound." } else { "Goals are judged in a full run only." }
        )
        .ok();
    }
    if !chart_cats.is_empty() {
        charts::bars(
            &charts_dir.join("throughput.svg"),
            "Requests per second: nginx proxy_pass, the path's bound, waitroom (wrk -t2 -c64)",
            "req/s",
            &chart_cats,
            &[("nginx proxy_pass".into(), c_ng_rps), ("bound".into(), c_bd_rps), ("waitroom".into(), c_wr_rps)],
        )?;
        charts::bars(
            &charts_dir.join("latency.svg"),
            "Latency per path at saturation (wrk -t2 -c64): p50 and p99",
            "ms",
            &chart_cats,
            &[
                ("nginx p50".into(), c_ng_p50),
                ("waitroom p50".into(), c_wr_p50),
                ("nginx p99".into(), c_ng_p99),
                ("waitroom p99".into(), c_wr_p99),
            ],
        )?;
    }

    // Other waitroom builds or settings measured side by side (access log on, variants).
    let others: Vec<&String> =
        targets.iter().filter(|t| !["nginx", "waitroom"].contains(&t.as_str()) && !BOUNDS.iter().any(|b| b.target == t.as_str())).collect();
    if !others.is_empty() {
        writeln!(md, "\n### Variants, same run (ratio vs nginx; change vs the default waitroom)\n").ok();
        writeln!(md, "| variant | path | req/s | ratio vs nginx | vs waitroom | p99 |").ok();
        writeln!(md, "|---|---|---:|---:|---:|---:|").ok();
        let mut variants_json = Vec::new();
        for t in &others {
            for (bench, what) in BENCHES {
                let (Some(v), Some(w)) = (get(bench, t), get(bench, "waitroom")) else { continue };
                let ratio = paired(bench, t);
                let vs = v.rps / w.rps - 1.0;
                writeln!(md, "| {t} | {what} | {} | {:.2}x | {:+.1} % | {} |", fmt_num(v.rps), ratio, vs * 100.0, ms(v.p99)).ok();
                variants_json.push(json!({"variant": t, "path": bench, "rps": v.rps, "ratio": ratio, "vs_waitroom": vs, "p99_us": v.p99}));
            }
        }
        results.insert("variants".into(), Value::Array(variants_json));
    }

    // ---------------- Redis ceiling ----------------
    let redis_rows: Vec<&Value> = kind("redis").collect();
    if !redis_rows.is_empty() {
        writeln!(md, "\n### The Redis ceiling (redis-benchmark -c64) and waitroom's share of it\n").ok();
        writeln!(md, "| command | -P1 req/s | -P16 req/s | waitroom path | waitroom req/s | waitroom / -P1 | waitroom / -P16 |").ok();
        writeln!(md, "|---|---:|---:|---|---:|---:|---:|").ok();
        let mut redis_json = Vec::new();
        let cmds: BTreeSet<String> = redis_rows.iter().filter_map(|v| v["cmd"].as_str().map(String::from)).collect();
        for cmd in cmds {
            let at = |p: i64| {
                median(
                    &redis_rows
                        .iter()
                        .filter(|v| v["cmd"] == cmd.as_str() && v["pipeline"].as_i64() == Some(p))
                        .map(|v| f(v, "rps"))
                        .collect::<Vec<_>>(),
                )
            };
            let (p1, p16) = (at(1), at(16));
            let path = redis_rows.iter().find(|v| v["cmd"] == cmd.as_str()).and_then(|v| v["path"].as_str()).unwrap_or("");
            let w = get(path, "waitroom").map(|a| a.rps).unwrap_or(f64::NAN);
            writeln!(md, "| {cmd} | {} | {} | {path} | {} | {} | {} |", fmt_num(p1), fmt_num(p16), fmt_num(w), fmt_num(w / p1), fmt_num(w / p16)).ok();
            redis_json.push(json!({"cmd": cmd, "p1": p1, "p16": p16, "path": path, "waitroom_rps": w, "ratio_p1": w / p1, "ratio_p16": w / p16}));
        }
        results.insert("redis_ceiling".into(), Value::Array(redis_json));
    }

    // ---------------- growth ----------------
    let growth: Vec<&Value> = kind("growth").collect();
    if !growth.is_empty() {
        let sizes: BTreeSet<i64> = growth.iter().filter_map(|v| v["size"].as_i64()).collect();
        let benches: BTreeSet<String> = growth.iter().filter_map(|v| v["bench"].as_str().map(String::from)).collect();
        writeln!(md, "\n### Growth: latency with the line at different lengths (wrk -t2 -c64, medians)\n").ok();
        let head: Vec<String> = sizes.iter().map(|s| format!("{} waiting: p50 / p99 (req/s)", charts::human(*s as f64))).collect();
        writeln!(md, "| path | {} | p99 largest / smallest | goal |", head.join(" | ")).ok();
        writeln!(md, "|---|{}---:|---:|", "---:|".repeat(sizes.len())).ok();
        let mut growth_json = Vec::new();
        let mut lines = Vec::new();
        for bench in &benches {
            let mut cells = Vec::new();
            let mut p99s = Vec::new();
            let mut pts = Vec::new();
            for size in &sizes {
                let rows: Vec<&Value> = growth.iter().copied().filter(|v| v["bench"] == bench.as_str() && v["size"].as_i64() == Some(*size)).collect();
                let a = agg(&rows);
                cells.push(format!("{} / {} ({})", ms(a.p50), ms(a.p99), fmt_num(a.rps)));
                p99s.push(a.p99);
                pts.push((*size as f64, a.p99 / 1000.0));
                growth_json.push(json!({"bench": bench, "size": size, "rps": a.rps, "p50_us": a.p50, "p99_us": a.p99, "non2xx": a.non2xx}));
            }
            let ratio = p99s.last().copied().unwrap_or(f64::NAN) / p99s.first().copied().unwrap_or(f64::NAN);
            let mark = if ratio <= 1.5 { "✓" } else { "✗" };
            writeln!(md, "| {bench} | {} | **{:.2}x** {mark} | <= 1.5x |", cells.join(" | "), ratio).ok();
            lines.push((format!("{bench} p99"), pts));
        }
        results.insert("growth".into(), Value::Array(growth_json));
        charts::lines(&charts_dir.join("growth.svg"), "p99 latency against the length of the line", "users waiting", "p99 (ms)", &lines, true)?;
    }

    // ---------------- memory ----------------
    let mut mem_json = Vec::new();
    let mem_rows: Vec<&Value> = kind("memory").collect();
    let rss_rows: Vec<&Value> = kind("rss").collect();
    if !mem_rows.is_empty() || !rss_rows.is_empty() {
        writeln!(md, "\n### Memory\n").ok();
        writeln!(md, "| what | value | goal |").ok();
        writeln!(md, "|---|---:|---|").ok();
    }
    for v in &mem_rows {
        let users = f(v, "users");
        let per = (f(v, "after") - f(v, "before")) / users;
        writeln!(md, "| Redis memory per waiting user (INFO used_memory delta over {} users, ids `u1` to `u{}`: seed-queue's) | {:.1} bytes | |", charts::human(users), users, per).ok();
        mem_json.push(json!({"what": "redis_bytes_per_waiting_user", "users": users, "value": per}));
    }
    for v in &rss_rows {
        let conns = f(v, "conns");
        let opened = v["idle"]["opened"].as_f64().unwrap_or(f64::NAN);
        let before = f(v, "before_kb");
        let after = f(v, "after_kb");
        let target = v["target"].as_str().unwrap_or("?");
        let per_conn = (after - before) / opened.max(1.0);
        // The goal is the proxy's, at 10,000 connections; nginx is there to compare with.
        let (goal_s, met) = if target == "nginx" {
            (String::new(), None)
        } else {
            let at_scale = opened >= MEMORY_GOAL_CONNS;
            let goal_s = format!("<= {IDLE_CONN_GOAL_KB} kB per connection at 10,000{}", if at_scale { "" } else { " (not judged: fewer connections)" });
            (goal_s, Some(per_conn <= IDLE_CONN_GOAL_KB).filter(|_| at_scale))
        };
        writeln!(
            md,
            "| {target} RSS: idle {} kB, with {} idle keep-alive connections {} kB ({:.1} MB) | **{:.1} kB per connection**{} | {goal_s} |",
            fmt_num(before), fmt_num(opened), fmt_num(after), after / 1024.0, per_conn, verdict(judged, met)
        )
        .ok();
        mem_json.push(json!({"what": "rss_idle_connections", "target": target, "conns": conns, "opened": opened, "before_kb": before, "after_kb": after, "per_conn_kb": per_conn, "goal_kb": (target != "nginx").then_some(IDLE_CONN_GOAL_KB), "met": met, "judged": judged}));
    }
    results.insert("memory".into(), Value::Array(mem_json));

    // ---------------- crowd ----------------
    let mut crowd: Vec<Value> = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&a.dir)
        .map_err(ctx("run dir"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("crowd-") && n.ends_with(".json")))
        .collect();
    entries.sort();
    for p in entries {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).map_err(ctx("crowd json"))?).map_err(ctx("crowd json"))?;
        crowd.push(v);
    }
    // Scenario order: as run.sh ran them (its order file), else by name.
    if let Some(order) = meta["crowd_order"].as_array() {
        let pos = |l: &str| order.iter().position(|o| o.as_str() == Some(l)).unwrap_or(usize::MAX);
        crowd.sort_by_key(|v| pos(v["label"].as_str().unwrap_or("")));
    }
    if !crowd.is_empty() {
        let users = crowd[0]["users"].as_u64().unwrap_or(0);
        writeln!(md, "\n### The crowd: {} users arriving within a second, demo order API with 20 slots x 200 ms (100 orders/s)\n", users).ok();
        writeln!(md, "| scenario | ordered / lost | done in (ideal N/rate) | order latency p50 / p95 / p99 | throughput, share of capacity: whole run / 10–90 % of orders | batch in force after 10 s: mean / min / max | backend peak in flight / waiting | FIFO inversions (beyond 11 s) | polls per user | ETA error mean / p95 abs |").ok();
        writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|").ok();
        let mut q_lines = Vec::new();
        let mut a_lines = Vec::new();
        let mut z_lines = Vec::new();
        let mut b_lines = Vec::new();
        let mut batch_lines = Vec::new();
        let mut p95_lines = Vec::new();
        let mut traces = Vec::new();
        for v in &crowd {
            let l = &v["order_latency_ms"];
            let mode = v["mode"].as_str().unwrap_or("");
            let eta = if mode == "room" {
                format!("{:+.1} s / {:.1} s", f(&v["eta_error_s"], "mean_signed"), f(&v["eta_error_s"]["abs"], "p95"))
            } else {
                "–".into()
            };
            let share = |k: &str| crowd_share(v, k);
            let batch = crowd_batch(v);
            writeln!(
                md,
                "| {} | {} / {} | {:.1} s ({:.0} s) | {} / {} / {} | {} / {} | {} | {} / {} | {} ({:.3} % of pairs) ({}) | {:.1} | {} |",
                v["label"].as_str().unwrap_or("?"),
                v["completed"], v["lost"],
                f(v, "completion_s"), f(v, "ideal_s"),
                secs(f(l, "p50")), secs(f(l, "p95")), secs(f(l, "p99")),
                share("share"), share("steady_share"),
                batch,
                v["backend"]["peak_in_flight"], v["backend"]["peak_waiting"],
                v["fifo"]["inversions"], f(&v["fifo"], "inversion_fraction") * 100.0, v["fifo"]["inversions_beyond_slack"],
                f(v, "polls_per_user"),
                eta,
            )
            .ok();
            let series = v["series"].as_array().cloned().unwrap_or_default();
            let label = v["label"].as_str().unwrap_or("?").to_string();
            if mode == "room" {
                // As an admission rate, so that 100 per second and 10 per 100 ms sit on one scale
                // (and next to the backend's 100 orders/s); the raw batch when the interval is
                // unknown.
                let per_s = v["admission"]["interval_ms"].as_f64().filter(|ms| *ms > 0.0).map_or(1.0, |ms| 1000.0 / ms);
                let pts: Vec<(f64, f64)> = series.iter().filter(|s| s["batch"].is_number()).map(|s| (f(s, "t"), f(s, "batch") * per_s)).collect();
                if !pts.is_empty() {
                    batch_lines.push((label.clone(), pts));
                }
                p95_lines.push((label.clone(), series.iter().filter(|s| s["order_p95_ms"].is_number()).map(|s| (f(s, "t"), f(s, "order_p95_ms"))).collect::<Vec<_>>()));
                if let Some(first) = v["batch"]["first_10s"].as_array().filter(|a| !a.is_empty()) {
                    traces.push((label.clone(), batch_changes(first)));
                }
            }
            q_lines.push((label.clone(), series.iter().map(|s| (f(s, "t"), f(s, "queue"))).collect::<Vec<_>>()));
            b_lines.push((label.clone(), series.iter().map(|s| (f(s, "t"), f(s, "backend_waiting"))).collect::<Vec<_>>()));
            let pts: Vec<(f64, f64)> = series.iter().map(|s| (f(s, "t"), f(s, "admitted"))).collect();
            a_lines.push((label.clone(), rate_over(&pts, 5.0)));
            // The first seconds, sample by sample: how bursty the admissions are.
            let zoom: Vec<(f64, f64)> = pts
                .windows(2)
                .filter(|w| w[1].0 <= 15.0 && w[1].0 > w[0].0)
                .map(|w| (w[1].0, (w[1].1 - w[0].1) / (w[1].0 - w[0].0)))
                .collect();
            z_lines.push((label, zoom));
        }
        charts::lines(&charts_dir.join("crowd_queue.svg"), "The crowd: users waiting over time (room: its line; no room: orders waiting at the API or for a connection)", "seconds since the first arrival", "users waiting", &q_lines, false)?;
        charts::lines(&charts_dir.join("crowd_admissions.svg"), "The crowd: admissions per second (5 s average; no room: orders let into the API)", "seconds since the first arrival", "users per second", &a_lines, false)?;
        charts::lines(&charts_dir.join("crowd_admissions_zoom.svg"), "The crowd: admissions per second, first 15 s, per sample (burstiness)", "seconds since the first arrival", "users per second", &z_lines, false)?;
        charts::lines(&charts_dir.join("crowd_backend_waiting.svg"), "The crowd: orders queued inside the order API (waiting for one of its 20 slots)", "seconds since the first arrival", "orders waiting", &b_lines, false)?;
        if !batch_lines.is_empty() {
            charts::lines(&charts_dir.join("crowd_batch.svg"), "The crowd: batch in force over time, as users admitted per second (batch / interval)", "seconds since the first arrival", "users per second", &batch_lines, false)?;
        }
        if !p95_lines.is_empty() {
            charts::lines(&charts_dir.join("crowd_order_p95.svg"), "The crowd: order latency p95 of the orders completed in the last second (rooms)", "seconds since the first arrival", "p95 (ms)", &p95_lines, false)?;
        }
        if !traces.is_empty() {
            writeln!(md, "\nBatch in force during the first 10 s (value from the time it was first sampled; samples every 250 ms):\n").ok();
            for (label, trace) in &traces {
                writeln!(md, "- {label}: {trace}").ok();
            }
        }
        if let Some(v) = crowd.iter().find(|v| v["label"] == ADAPTIVE_GOAL.label) {
            let g = &ADAPTIVE_GOAL;
            let p95 = f(&v["order_latency_ms"], "p95");
            let steady = f(&v["throughput"], "steady_share");
            let beyond = v["fifo"]["inversions_beyond_slack"].as_u64();
            let lost = v["lost"].as_u64();
            let mark = |ok: bool| if ok { "✓" } else { "✗" };
            writeln!(
                md,
                "\nIssue 9's goal for {}: order p95 {} (<= {:.0} ms) {}; backend at {:.0} % of capacity from 10 to 90 % of the orders (>= {:.0} %) {}, {:.0} % over the whole run; FIFO inversions beyond the slack: {} {}; users lost: {} {}.",
                g.label,
                secs(p95), g.order_p95_ms, mark(p95 <= g.order_p95_ms),
                steady * 100.0, g.steady_share * 100.0, mark(steady >= g.steady_share),
                f(&v["throughput"], "share") * 100.0,
                v["fifo"]["inversions_beyond_slack"], mark(beyond == Some(0)),
                v["lost"], mark(lost == Some(0)),
            )
            .ok();
        }
        // Keep the big per-sample series out of the summary JSON's crowd table but in the file.
        results.insert("crowd".into(), Value::Array(crowd));
    }

    rooms::section(&raw, &a.dir, &meta, &mut md, &mut results)?;

    // ---------------- callgrind ----------------
    if let Ok(text) = std::fs::read_to_string(a.dir.join("callgrind.json")) {
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            results.insert("callgrind".into(), v);
        }
    }

    let results = Value::Object(results);
    std::fs::write(a.dir.join("results.json"), serde_json::to_string_pretty(&results).map_err(ctx("json"))?)
        .map_err(ctx("results.json"))?;
    std::fs::write(a.dir.join("table.md"), &md).map_err(ctx("table.md"))?;
    print!("{md}");
    Ok(())
}

/// A crowd's throughput figure `key` as a share of its capacity, or a dash when it has none.
fn crowd_share(crowd: &Value, key: &str) -> String {
    let x = f(&crowd["throughput"], key);
    if x.is_finite() { format!("{:.0} %", x * 100.0) } else { "–".into() }
}

/// A crowd's batch in force after its first 10 s: mean / min / max. A run shorter than the
/// settling time (the smoke mode's) has nothing after it: the whole run's figures then, marked.
fn crowd_batch(crowd: &Value) -> String {
    match (&crowd["batch"]["after_10s"], &crowd["batch"]["overall"]) {
        (b, _) if b.is_object() => format!("{:.1} / {} / {}", f(b, "mean"), b["min"], b["max"]),
        (_, b) if b.is_object() => format!("{:.1} / {} / {} (whole run)", f(b, "mean"), b["min"], b["max"]),
        _ => "–".into(),
    }
}
