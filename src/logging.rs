//! Logs go to stderr through `tracing`: human-readable by default, one JSON object a line with
//! `WAITROOM_LOG_FORMAT=json`, filtered by `RUST_LOG` (default `info`). pingora logs through the
//! `log` crate; the bridge puts its lines in the same stream.
//!
//! Access lines use the target `waitroom::access`; `RUST_LOG=info,waitroom::access=off` silences
//! them. Entry tokens are never logged: pingora's debug and trace lines dump whole request
//! headers (the token header included, which must travel upstream), so pingora's targets are
//! capped at INFO whatever `RUST_LOG` says.
//!
//! Access lines are written to stderr in blocks, not one `write` a line: with the access log on
//! (the default) a line per request made every request pay a system call under stderr's lock. An
//! access line is appended to a buffer; the buffer goes out whole when it holds [`FLUSH_AT`]
//! bytes, every [`FLUSH_EVERY`] (a thread of its own), with the next line of any other target, and
//! before the process exits ([`flush`]). Lines stay
//! whole and in order: a block is taken and written under one lock, so two blocks never
//! interleave, and a writer that fills the buffer waits for the block before it (backpressure
//! rather than an unbounded buffer when stderr is slow).

use std::io::Write as _;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use tracing::Level;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// False for pingora's debug and trace events, which print request headers verbatim.
fn not_pingora_debug(meta: &tracing::Metadata<'_>) -> bool {
    !(meta.target().starts_with("pingora") && *meta.level() > Level::INFO)
}

/// A block goes out once the buffer holds this much.
const FLUSH_AT: usize = 32 * 1024;
/// ... and at least this often, so a quiet proxy's lines are never held back long.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// The process's one log stream, like stderr itself: a static because the tracing subscriber it
/// serves is process-wide too, and `flush` must reach it from the exit paths.
static SINK: LazyLock<Sink> = LazyLock::new(|| Sink { pending: Mutex::new(Vec::new()), out: Mutex::new(()) });

struct Sink {
    /// Lines not written yet.
    pending: Mutex<Vec<u8>>,
    /// Held while a block is taken and written, so blocks leave in the order they were taken.
    out: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sink {
    fn append(&self, line: &[u8]) {
        let full = {
            let mut pending = lock(&self.pending);
            pending.extend_from_slice(line);
            pending.len() >= FLUSH_AT
        };
        if full {
            self.flush();
        }
    }

    fn flush(&self) {
        let _out = lock(&self.out);
        let block = std::mem::take(&mut *lock(&self.pending));
        if !block.is_empty() {
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(&block);
            let _ = stderr.flush();
        }
    }
}

/// What the fmt layer writes each event to: one `write_all` of the whole formatted line. Access
/// lines wait in the buffer; any other line (rare, and read by operators and tests as it
/// happens) goes out at once, with the access lines before it, so the order holds.
struct Line {
    at_once: bool,
}

impl std::io::Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        SINK.append(bytes);
        if self.at_once {
            SINK.flush();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Lines;

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { at_once: true }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        Line { at_once: meta.target() != ACCESS }
    }
}

/// The access log's target.
pub const ACCESS: &str = "waitroom::access";

/// Writes out every line logged so far: call before the process exits.
pub fn flush() {
    SINK.flush();
}

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("WAITROOM_LOG_FORMAT").map(|v| v == "json").unwrap_or(false);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(Lines);
    let flusher = std::thread::Builder::new().name("waitroom-log".into()).spawn(|| loop {
        std::thread::sleep(FLUSH_EVERY);
        flush();
    });
    if let Err(error) = flusher {
        // Without the thread, lines still go out as the buffer fills and at exit.
        eprintln!("waitroom: could not start the log flusher: {error}");
    }
    let cap = filter_fn(not_pingora_debug);
    // With tracing-subscriber's `tracing-log` feature, `try_init` also installs the `log`
    // bridge; a second subscriber (tests that call init twice) is simply refused.
    let _ = if json {
        builder.json().flatten_event(true).finish().with(cap).try_init()
    } else {
        builder.with_ansi(false).finish().with(cap).try_init()
    };
}
