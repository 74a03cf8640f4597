//! What the tools' servers and command lines share: the process around them (logging, the tokio
//! runtime, the exit code) and the accept loop. Kept here so that a change to how a tool starts or
//! survives an accept error is made once, not once per binary.

use std::future::Future;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tracing_subscriber::EnvFilter;

/// Logs to stderr, so that stdout carries only the "listening on" line a script may wait for.
/// `RUST_LOG` chooses the level, `info` by default.
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only help a human at a terminal; in a test's captured log they are noise.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Runs `main` on a multi-thread tokio runtime (`threads` workers, or tokio's default with `None`)
/// and returns its exit code; a runtime that cannot start is reported on stderr as `name: ...`.
pub fn block_on_main(
    name: &str,
    threads: Option<usize>,
    main: impl Future<Output = ExitCode>,
) -> ExitCode {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        builder.worker_threads(threads);
    }
    match builder.enable_all().build() {
        Ok(runtime) => runtime.block_on(main),
        Err(e) => {
            eprintln!("{name}: cannot start the tokio runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// [`block_on_main`] for a server: its error, if it stops with one, goes to stderr as `name: ...`.
pub fn serve_main(
    name: &str,
    threads: usize,
    serve: impl Future<Output = std::io::Result<()>>,
) -> ExitCode {
    block_on_main(name, Some(threads), async {
        match serve.await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name}: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Accepts on `listener` until the process ends, serving each connection on its own task with
/// `connection(Arc::clone(&shared), stream, peer)`.
///
/// A failed accept (typically EMFILE under a connection flood) goes to `accept_failed`, which the
/// caller writes so that the log line names its module; then a short pause: accepting again at once
/// would spin a core, and the pause lets in-flight connections close and free descriptors.
pub async fn accept_forever<S, F>(
    listener: TcpListener,
    shared: Arc<S>,
    connection: impl Fn(Arc<S>, TcpStream, SocketAddr) -> F,
    accept_failed: impl Fn(&std::io::Error),
) where
    F: Future<Output = ()> + Send + 'static,
{
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(connection(Arc::clone(&shared), stream, peer));
            }
            Err(e) => {
                accept_failed(&e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
