//! `idle`: opens `--conns` keep-alive connections, sends one request on each (so every
//! connection is a served HTTP connection waiting for its next request, as a poller's is between
//! polls), prints one JSON line when all are open, and holds them until `--hold-s` has passed or
//! a SIGTERM comes. `bench/run.sh` reads the proxy's VmRSS in between.

use std::time::Duration;

use clap::Args;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::fire::Conn;
use crate::Result;

#[derive(Args)]
pub struct IdleArgs {
    #[arg(long)]
    addr: String,
    #[arg(long)]
    conns: usize,
    #[arg(long, default_value = "/")]
    path: String,
    /// `Name: value`, repeatable; `{n}` is the connection's number (1-based, modulo `--users`).
    #[arg(long = "header")]
    headers: Vec<String>,
    #[arg(long, default_value_t = 1)]
    users: u64,
    /// Connections being opened at once.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    #[arg(long, default_value_t = 50)]
    hold_s: u64,
}

pub async fn run(a: IdleArgs) -> Result<()> {
    let gate = std::sync::Arc::new(Semaphore::new(a.concurrency.max(1)));
    let mut opening = JoinSet::new();
    for i in 0..a.conns {
        let n = (i as u64 % a.users.max(1)) + 1;
        let mut req = format!("GET {} HTTP/1.1\r\nHost: bench\r\n", a.path);
        for h in &a.headers {
            req.push_str(&h.replace("{n}", &n.to_string()));
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        let addr = a.addr.clone();
        let gate = gate.clone();
        opening.spawn(async move {
            let _permit = gate.acquire().await.map_err(|e| e.to_string())?;
            let mut conn = Conn::connect(&addr).await?;
            let status = conn.roundtrip(req.as_bytes()).await?;
            Ok::<_, String>((conn, status))
        });
    }
    let mut held = Vec::with_capacity(a.conns);
    let mut failed = 0usize;
    let mut first_error = None;
    let mut non_2xx = 0usize;
    while let Some(joined) = opening.join_next().await {
        match joined {
            Ok(Ok((conn, status))) => {
                if !(200..300).contains(&status) {
                    non_2xx += 1;
                }
                held.push(conn);
            }
            Ok(Err(e)) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({"opened": held.len(), "failed": failed, "non2xx": non_2xx, "first_error": first_error})
    );
    // Hold until told (SIGTERM / SIGINT) or the time is up.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(a.hold_s)) => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(held);
    Ok(())
}
