//! `callgrind`: reads one callgrind dump (the format of `callgrind_out`, `positions: line`,
//! `events: Ir`) and prints the instructions per request, the top functions by self cost, the
//! cost by area (allocator, memcpy, tokio, pingora, ...) and how often a few functions were called
//! per request (malloc, free, the socket calls). `callgrind_annotate` 3.19 lumps a dump taken
//! after `--zero` into the thread's entry function, hence this reader.

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::{ctx, Result};

#[derive(Args)]
pub struct CgArgs {
    /// The dump.
    #[arg(long)]
    file: PathBuf,
    /// Requests the dump holds.
    #[arg(long)]
    requests: u64,
    #[arg(long, default_value_t = 25)]
    top: usize,
    /// Also list who calls functions whose name contains this (inclusive cost of those calls).
    #[arg(long)]
    callers_of: Option<String>,
    /// Extra fields for the JSON line, as a JSON object.
    #[arg(long, default_value = "{}")]
    extra: String,
}

/// Strips a legacy Rust symbol hash (`::h0123456789abcdef`).
fn clean(name: &str) -> String {
    let n = name.trim();
    match n.rfind("::h") {
        Some(i) if n.len() - i == 19 && n[i + 3..].chars().all(|c| c.is_ascii_hexdigit()) => n[..i].to_string(),
        _ => n.to_string(),
    }
}

/// The area a function belongs to, from its name.
fn area(name: &str) -> &'static str {
    let n = name.trim_start_matches('<');
    let has = |s: &str| n.contains(s);
    if ["malloc", "free", "realloc", "calloc", "memalign", "unlink_chunk", "sysmalloc", "mi_", "_mi_", "__rust_alloc", "__rust_dealloc", "__rdl_", "tcache"]
        .iter()
        .any(|p| has(p))
    {
        "allocator"
    } else if ["memcpy", "memmove", "memset", "memcmp", "bcmp", "strlen"].iter().any(|p| has(p)) {
        "memcpy/memset/memcmp"
    } else if ["send", "recv", "write", "read", "epoll", "close", "accept", "getpeername", "getsockopt", "setsockopt", "clock_gettime", "futex", "syscall", "__libc", "sched_yield", "nanosleep", "mprotect", "writev"]
        .iter()
        .any(|p| n == *p || n.starts_with(&format!("{p}@")) || n.starts_with("__libc_") || (n.len() < 24 && !n.contains("::") && has(p)))
    {
        "syscall wrappers (libc)"
    } else if n.starts_with("tokio") {
        "tokio"
    } else if n.starts_with("pingora") {
        "pingora"
    } else if n.starts_with("redis") || n.starts_with("combine") {
        "redis client"
    } else if n.starts_with("http") || n.starts_with("httparse") || n.starts_with("bytes") || n.starts_with("hyper") {
        "http / bytes"
    } else if n.starts_with("prometheus") {
        "prometheus"
    } else if n.starts_with("tracing") {
        "tracing"
    } else if n.starts_with("serde") {
        "serde / json"
    } else if n.starts_with("waitroom") {
        "waitroom"
    } else if n.starts_with("hashbrown") || n.starts_with("core::hash") || n.starts_with("std::collections") || has("sip::") {
        "hash maps"
    } else if n.starts_with("core") || n.starts_with("alloc") || n.starts_with("std") {
        "std / core"
    } else {
        "other"
    }
}

pub fn run(a: CgArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file).map_err(ctx("callgrind dump"))?;
    let mut names: HashMap<String, String> = HashMap::new();
    let mut resolve = |spec: &str| -> String {
        let spec = spec.trim();
        if let Some(rest) = spec.strip_prefix('(') {
            if let Some(end) = rest.find(')') {
                let id = rest[..end].to_string();
                let name = rest[end + 1..].trim();
                if name.is_empty() {
                    return names.get(&id).cloned().unwrap_or_else(|| format!("({id})"));
                }
                let name = clean(name);
                names.insert(id, name.clone());
                return name;
            }
        }
        clean(spec)
    };
    let mut current = String::new();
    let mut callee = String::new();
    let mut skip_next = false;
    let mut self_cost: HashMap<String, u64> = HashMap::new();
    let mut calls: HashMap<String, u64> = HashMap::new();
    let mut total = 0u64;
    let mut callers: HashMap<String, (u64, u64)> = HashMap::new();
    let mut pending_caller: Option<u64> = None;
    for line in text.lines() {
        let Some(first) = line.chars().next() else { continue };
        if let Some(rest) = line.strip_prefix("fn=") {
            current = resolve(rest);
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            callee = resolve(rest);
        } else if let Some(rest) = line.strip_prefix("calls=") {
            let n: u64 = rest.split_whitespace().next().and_then(|t| t.parse().ok()).unwrap_or(0);
            *calls.entry(callee.clone()).or_default() += n;
            skip_next = true;
            pending_caller = a.callers_of.as_deref().filter(|c| callee.contains(c)).map(|_| n);
        } else if first.is_ascii_digit() || first == '+' || first == '-' || first == '*' {
            if skip_next {
                skip_next = false;
                if let Some(n) = pending_caller.take() {
                    let cost: u64 = line.split_whitespace().nth(1).and_then(|t| t.parse().ok()).unwrap_or(0);
                    let e = callers.entry(current.clone()).or_default();
                    e.0 += n;
                    e.1 += cost;
                }
                continue;
            }
            let cost: u64 = line.split_whitespace().nth(1).and_then(|t| t.parse().ok()).unwrap_or(0);
            *self_cost.entry(current.clone()).or_default() += cost;
            total += cost;
        } else if let Some(rest) = line.strip_prefix("summary:") {
            let _ = rest;
        }
    }
    let n = a.requests.max(1) as f64;
    let mut top: Vec<(&String, &u64)> = self_cost.iter().collect();
    top.sort_by(|x, y| y.1.cmp(x.1));
    let mut areas: HashMap<&'static str, u64> = HashMap::new();
    for (name, cost) in &self_cost {
        *areas.entry(area(name)).or_default() += cost;
    }
    let mut areas: Vec<(&str, u64)> = areas.into_iter().collect();
    areas.sort_by(|x, y| y.1.cmp(&x.1));
    let per_call = |pred: &dyn Fn(&str) -> bool| -> f64 {
        calls.iter().filter(|(k, _)| pred(k)).map(|(_, v)| *v).sum::<u64>() as f64 / n
    };
    let mallocs = per_call(&|k| matches!(k, "malloc" | "calloc" | "realloc" | "posix_memalign" | "mi_malloc" | "mi_zalloc" | "mi_realloc" | "mi_malloc_aligned" | "mi_zalloc_aligned" | "mi_realloc_aligned"));
    let frees = per_call(&|k| matches!(k, "free" | "mi_free" | "cfree"));
    let syscalls: Vec<(String, f64)> = ["send", "sendto", "sendmsg", "write", "writev", "recv", "recvfrom", "read", "readv", "epoll_wait", "epoll_ctl", "getpeername", "futex", "clock_gettime", "accept4", "close"]
        .iter()
        .map(|s| (s.to_string(), per_call(&|k| k == *s || k.starts_with(&format!("{s}@")))))
        .filter(|(_, v)| *v >= 0.01)
        .collect();
    let extra: serde_json::Value = serde_json::from_str(&a.extra).map_err(ctx("--extra"))?;
    let out = json!({
        "extra": extra,
        "requests": a.requests,
        "instructions": total,
        "per_request": total as f64 / n,
        "mallocs_per_request": mallocs,
        "frees_per_request": frees,
        "calls_per_request": syscalls.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "areas": areas.iter().map(|(k, v)| json!({"area": k, "share": *v as f64 / total.max(1) as f64, "per_request": *v as f64 / n})).collect::<Vec<_>>(),
        "top": top.iter().take(a.top).map(|(k, v)| json!({"function": k, "share": **v as f64 / total.max(1) as f64, "per_request": **v as f64 / n})).collect::<Vec<_>>(),
    });
    println!("{}", serde_json::to_string(&out).map_err(ctx("json"))?);
    eprintln!("      {:.0} instructions/request, {:.1} mallocs, {:.1} frees per request", total as f64 / n, mallocs, frees);
    eprintln!("      calls per request: {}", syscalls.iter().map(|(k, v)| format!("{k} {v:.2}")).collect::<Vec<_>>().join(", "));
    eprintln!("      by area: {}", areas.iter().map(|(k, v)| format!("{k} {:.1} %", 100.0 * *v as f64 / total.max(1) as f64)).collect::<Vec<_>>().join(", "));
    for (name, cost) in top.iter().take(a.top) {
        let short: String = name.chars().take(140).collect();
        eprintln!("      {:5.1} %  {:7.0}/req  {}", 100.0 * **cost as f64 / total.max(1) as f64, **cost as f64 / n, short);
    }
    if let Some(target) = &a.callers_of {
        let mut list: Vec<(&String, &(u64, u64))> = callers.iter().collect();
        list.sort_by(|x, y| y.1 .1.cmp(&x.1 .1));
        eprintln!("      callers of *{target}*: calls/req, instructions/req");
        for (name, (count, cost)) in list.iter().take(a.top) {
            let short: String = name.chars().take(140).collect();
            eprintln!("      {:6.2} {:7.0}  {}", *count as f64 / n, *cost as f64 / n, short);
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct CgTableArgs {
    /// summary.jsonl files of bench/callgrind.sh runs; a column each (named by its folder).
    files: Vec<PathBuf>,
}

/// Prints instructions (and mallocs) per request by path and process, one column per run.
pub fn table(a: CgTableArgs) -> Result<()> {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut cols: Vec<(String, HashMap<(String, String), (f64, f64)>)> = Vec::new();
    for f in &a.files {
        let name = f.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("?").to_string();
        let text = std::fs::read_to_string(f).map_err(ctx("summary"))?;
        let mut map = HashMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).map_err(ctx("summary line"))?;
            let key = (
                v["extra"]["path"].as_str().unwrap_or("?").to_string(),
                v["extra"]["process"].as_str().unwrap_or("?").to_string(),
            );
            if !rows.contains(&key) {
                rows.push(key.clone());
            }
            map.insert(key, (v["per_request"].as_f64().unwrap_or(0.0), v["mallocs_per_request"].as_f64().unwrap_or(0.0)));
        }
        cols.push((name, map));
    }
    let head: Vec<String> = cols.iter().map(|(n, _)| format!("{n}: instructions (mallocs) / request")).collect();
    println!("| path | process | {} |", head.join(" | "));
    println!("|---|---|{}", "---:|".repeat(cols.len()));
    for key in &rows {
        let cells: Vec<String> = cols
            .iter()
            .map(|(_, m)| m.get(key).map(|(i, m)| format!("{:.1}k ({:.0})", i / 1000.0, m)).unwrap_or_else(|| "–".into()))
            .collect();
        println!("| {} | {} | {} |", key.0, key.1, cells.join(" | "));
    }
    Ok(())
}
