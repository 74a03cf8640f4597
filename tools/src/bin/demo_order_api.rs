//! `demo-order-api`: the command line of the demo order backend (`waitroom_tools::demo_api`).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use tokio::net::TcpListener;
use tracing::info;
use waitroom_tools::demo_api::{self, MAX_DELAY_MS};
use waitroom_tools::service;

#[derive(Parser, Debug)]
#[command(
    name = "demo-order-api",
    about = "Demo order backend: a slot-limited order endpoint and an echo"
)]
struct Cli {
    /// Address to listen on (port 0 picks a free port; the line on stdout names it).
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,

    /// Orders processed at once, like the connections of a database pool; further orders queue.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    slots: u32,

    /// How long each order holds its slot, in milliseconds (changeable via PUT /admin/service-time).
    #[arg(long, alias = "service-time", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(0..=MAX_DELAY_MS))]
    service_time_ms: u64,

    /// Honour an order's `X-Demo-Delay-Ms` header (its own service time), for tests that script
    /// slow orders. Off by default: any user could otherwise make their order outlast the proxy's
    /// upstream timeout.
    #[arg(long)]
    client_delays: bool,

    /// Worker threads of the tokio runtime.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    service::init_logging();
    let threads = usize::from(cli.threads);
    service::serve_main("demo-order-api", threads, listen_and_serve(cli))
}

async fn listen_and_serve(cli: Cli) -> std::io::Result<()> {
    let listener = TcpListener::bind(cli.listen).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", cli.listen))
    })?;
    let local = listener.local_addr()?;
    // The real address, not the flag: with port 0 this is the only place the port shows up.
    println!("demo-order-api listening on {local}");
    info!(
        %local,
        slots = cli.slots,
        service_time_ms = cli.service_time_ms,
        client_delays = cli.client_delays,
        threads = cli.threads,
        "started"
    );
    let settings = demo_api::Settings {
        slots: cli.slots,
        service_time_ms: cli.service_time_ms,
        client_delays: cli.client_delays,
    };
    demo_api::serve(listener, settings).await;
    Ok(())
}
