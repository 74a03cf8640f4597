//! `identity-front`: the command line of the local identity front (`waitroom_tools::identity_front`).

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use http::header::HeaderName;
use tokio::net::TcpListener;
use waitroom_tools::identity_front::{self, FrontSettings};
use waitroom_tools::service;

#[derive(Parser, Debug)]
#[command(
    name = "identity-front",
    about = "For a developer's machine: gives each browser a random user id (a cookie) and \
             forwards to waitroom with the identity header set, so the waiting page can be tried \
             in a browser"
)]
struct Cli {
    /// Address to listen on; loopback only (port 0 picks a free port; the line on stdout names it).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,

    /// The proxy's `listen` address, host:port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    proxy: String,

    /// The proxy's `identity.header`.
    #[arg(long, default_value = "X-User-Id")]
    header: HeaderName,

    /// The proxy's `endpoints.prefix`, only for the URL printed at start.
    #[arg(long, default_value = "/queue")]
    prefix: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = identity_front::check_listen(cli.listen) {
        eprintln!("identity-front: {e}");
        return ExitCode::from(2);
    }
    service::init_logging();
    service::serve_main("identity-front", 1, listen_and_serve(cli))
}

async fn listen_and_serve(cli: Cli) -> std::io::Result<()> {
    let listener = TcpListener::bind(cli.listen).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", cli.listen))
    })?;
    let local = listener.local_addr()?;
    // The real address, not the flag: with port 0 this is the only place the port shows up.
    println!(
        "identity-front listening on {local}: open http://{local}{}/ (forwarding to {} with {})",
        cli.prefix.trim_end_matches('/'),
        cli.proxy,
        cli.header
    );
    let settings = FrontSettings {
        proxy: cli.proxy,
        header: cli.header,
    };
    identity_front::serve(listener, settings).await;
    Ok(())
}
