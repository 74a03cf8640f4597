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
//!
//! An access line is not a tracing event: [`access`] asks tracing's filter whether the line is
//! wanted, then formats it itself, in the very shape the subscriber would (see [`Access`]).

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// What the fmt layer writes each event to: one `write_all` of the whole formatted line, which
/// goes out at once (operators and tests read these as they happen), after the access lines
/// before it, so the order holds.
struct Line;

impl std::io::Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        SINK.append(bytes);
        SINK.flush();
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
        Line
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
    JSON.store(json, Ordering::Relaxed);
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

/// The process's access-line format: the tracing subscriber's (`init`), kept here because
/// access lines bypass it.
static JSON: AtomicBool = AtomicBool::new(false);

/// One request's access line. Written by [`access`] straight into the log buffer, in the exact
/// shape the tracing subscriber gives an event (text or JSON, see the tests): a tracing event
/// cost a status poll about 13k instructions of formatting (callgrind: 56.9k with the access log
/// on against 43.7k off), most of it `core::fmt` and the styling the text format runs through
/// even without colours. The filter is still tracing's: `RUST_LOG=info,waitroom::access=off`
/// turns the lines off.
pub struct Access<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub endpoint: &'a str,
    /// Written as `duration_ms`, to the microsecond.
    pub duration: Duration,
    pub user: &'a str,
    pub error: Option<String>,
}

/// Logs `line` when `RUST_LOG` lets `waitroom::access` INFO lines through.
pub fn access(line: &Access<'_>) {
    if !tracing::enabled!(target: ACCESS, Level::INFO) {
        return;
    }
    let json = JSON.load(Ordering::Relaxed);
    LINE.with(|cell| {
        let (buf, clock) = &mut *cell.borrow_mut();
        buf.clear();
        line.write(buf, clock.now(), json);
        SINK.append(buf);
    });
}

thread_local! {
    /// Each thread formats into its own buffer, with its own clock.
    static LINE: RefCell<(Vec<u8>, Clock)> = RefCell::new((Vec::with_capacity(256), Clock::default()));
}

/// The timestamp tracing's default timer writes (`2026-12-01T23:20:00.998929Z`), its part up to
/// the seconds formatted once a second.
#[derive(Default)]
struct Clock {
    second: u64,
    stamp: String,
}

impl Clock {
    fn now(&mut self) -> &str {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        self.at(now.as_secs(), now.subsec_micros())
    }

    fn at(&mut self, secs: u64, micros: u32) -> &str {
        if self.stamp.is_empty() || self.second != secs {
            self.second = secs;
            // humantime's RFC 3339 to the second; its `Z` is cut below with the old fraction.
            self.stamp = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string();
        }
        self.stamp.truncate(19);
        self.stamp.push('.');
        let mut digits = [b'0'; 6];
        put_digits(&mut digits, micros.into());
        self.stamp.extend(digits.iter().map(|&d| char::from(d)));
        self.stamp.push('Z');
        &self.stamp
    }
}

/// A field's value, as tracing recorded it: `%` Display (bare in text), a string, a number.
enum Field<'a> {
    Display(&'a str),
    Str(&'a str),
    Number(u16),
    Millis(Duration),
}

impl Access<'_> {
    /// The fields in the order tracing's event recorded them (an absent error is not recorded).
    fn fields(&self) -> impl Iterator<Item = (&'static str, Field<'_>)> {
        [
            ("method", Some(Field::Display(self.method))),
            ("path", Some(Field::Str(self.path))),
            ("status", Some(Field::Number(self.status))),
            ("endpoint", Some(Field::Str(self.endpoint))),
            ("duration_ms", Some(Field::Millis(self.duration))),
            ("user", Some(Field::Str(self.user))),
            ("error", self.error.as_deref().map(Field::Str)),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }

    /// The whole line, newline included: tracing's text format (`%` fields bare, strings and
    /// floats as `{:?}`), or its JSON format with `flatten_event` (the fields between the level and
    /// the target).
    fn write(&self, buf: &mut Vec<u8>, timestamp: &str, json: bool) {
        if json {
            buf.extend_from_slice(b"{\"timestamp\":");
            quoted(buf, timestamp, true);
            buf.extend_from_slice(b",\"level\":\"INFO\"");
        } else {
            buf.extend_from_slice(timestamp.as_bytes());
            buf.extend_from_slice(b"  INFO waitroom::access:");
        }
        for (name, value) in self.fields() {
            if json {
                buf.extend_from_slice(b",\"");
                buf.extend_from_slice(name.as_bytes());
                buf.extend_from_slice(b"\":");
            } else {
                buf.push(b' ');
                buf.extend_from_slice(name.as_bytes());
                buf.push(b'=');
            }
            match value {
                Field::Display(s) if !json => buf.extend_from_slice(s.as_bytes()),
                Field::Display(s) | Field::Str(s) => quoted(buf, s, json),
                Field::Number(n) => push_number(buf, n),
                Field::Millis(duration) => push_millis(buf, duration, json),
            }
        }
        buf.extend_from_slice(if json { b",\"target\":\"waitroom::access\"}\n" } else { b"\n" });
    }
}

/// `n`'s last `digits.len()` decimal digits into `digits`, zero-padded (core::fmt costs a few
/// hundred instructions a number; these run twice a line).
fn put_digits(digits: &mut [u8], mut n: u64) {
    for d in digits.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// `n` in decimal, as `{}` writes it.
fn push_number(buf: &mut Vec<u8>, n: u16) {
    let mut digits = [b'0'; 5];
    put_digits(&mut digits, n.into());
    let first = digits.iter().position(|&d| d != b'0').unwrap_or(digits.len() - 1);
    buf.extend_from_slice(&digits[first..]);
}

/// The milliseconds `(micros as f64) / 1000.0` as `{:?}` (`json`: serde_json) writes that
/// float: every whole number of microseconds is a float whose shortest form is its exact
/// decimal, so it is written from the integer (the float's formatting cost a line about 600
/// instructions, a fifth of its cost). Beyond about 30 years, where both would turn to an
/// exponent, the float itself is formatted.
fn push_millis(buf: &mut Vec<u8>, duration: Duration, json: bool) {
    let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
    if micros >= 1_000_000_000_000_000 {
        let ms = micros as f64 / 1000.0;
        if json {
            let _ = serde_json::to_writer(&mut *buf, &ms);
        } else {
            let _ = write!(buf, "{ms:?}");
        }
        return;
    }
    buf.extend_from_slice(itoa::Buffer::new().format(micros / 1000).as_bytes());
    buf.push(b'.');
    let mut fraction = [b'0'; 3];
    put_digits(&mut fraction, micros % 1000);
    let digits = fraction.iter().rposition(|&d| d != b'0').map_or(1, |last| last + 1);
    buf.extend_from_slice(&fraction[..digits]);
}

/// Printable ASCII but `"` and `\`: what both `{:?}` and JSON leave as it is.
fn plain(s: &str) -> bool {
    s.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

/// `s` quoted as `{:?}` writes it (`json`: as serde_json does), without either's machinery when
/// it is plain.
fn quoted(buf: &mut Vec<u8>, s: &str, json: bool) {
    if plain(s) {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else if json {
        let _ = serde_json::to_writer(&mut *buf, s);
    } else {
        let _ = write!(buf, "{s:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::FormatTime;

    const STAMP: &str = "2026-12-01T23:20:00.998929Z";

    struct Fixed;

    impl FormatTime for Fixed {
        fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
            w.write_str(STAMP)
        }
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// The line the proxy logged through tracing before `access` wrote its own.
    fn emit(line: &Access<'_>) {
        tracing::info!(
            target: "waitroom::access",
            method = %line.method,
            path = line.path,
            status = line.status,
            endpoint = line.endpoint,
            duration_ms = line.duration.as_micros() as f64 / 1000.0,
            user = line.user,
            error = line.error.clone(),
        );
    }

    fn through_tracing(line: &Access<'_>, json: bool) -> String {
        let out = Captured::default();
        let builder = tracing_subscriber::fmt().with_timer(Fixed).with_writer(out.clone());
        if json {
            tracing::subscriber::with_default(builder.json().flatten_event(true).finish(), || emit(line));
        } else {
            tracing::subscriber::with_default(builder.with_ansi(false).finish(), || emit(line));
        }
        let bytes = lock(&out.0).clone();
        String::from_utf8(bytes).unwrap()
    }

    fn ours(line: &Access<'_>, json: bool) -> String {
        let mut buf = Vec::new();
        line.write(&mut buf, STAMP, json);
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn access_lines_are_the_lines_tracing_wrote_byte_for_byte() {
        let users = ["u1", "-", "a\"b\\c", "tab\there", "ü-ser", "nul\0 del\u{7f} bell\u{7}", "\u{301}mark"];
        let paths = ["/queue/status", "/api/orders/42", "/a%20b", "/"];
        let errors = [None, Some("Upstream ConnectRefused context: \"x\" cause: refused (os error 111)".to_owned())];
        let durations = [0, 1, 10, 999, 1_000, 5_311_355, 2_124_360, 123_000_000, 300_000_001, 999_999_999_999_999, 10u64.pow(18), u64::MAX]
            .map(Duration::from_micros);
        let mut checked = 0;
        for (i, user) in users.iter().enumerate() {
            for (j, path) in paths.iter().enumerate() {
                let line = Access {
                    method: ["GET", "POST", "DELETE"][(i + j) % 3],
                    path,
                    status: [200, 201, 403, 502, 0][(i + j) % 5],
                    endpoint: ["status", "enter", "protected", "passthrough"][j],
                    duration: durations[(i * 3 + j) % durations.len()],
                    user,
                    error: errors[(i + j) % 2].clone(),
                };
                for json in [false, true] {
                    assert_eq!(ours(&line, json), through_tracing(&line, json), "json: {json}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 56);
    }

    #[test]
    fn the_clock_writes_what_tracing_timer_writes() {
        let mut clock = Clock::default();
        // Checked against Python's datetime.fromtimestamp(s, UTC).
        for (secs, want) in [
            (0, "1970-01-01T00:00:00"),
            (951_782_400, "2000-02-29T00:00:00"),
            (1_764_629_999, "2025-12-01T22:59:59"),
            (1_798_761_599, "2026-12-31T23:59:59"),
            (4_102_444_800, "2100-01-01T00:00:00"),
        ] {
            assert_eq!(clock.at(secs, 7), format!("{want}.000007Z"));
            // The same second again: only the fraction moves.
            assert_eq!(clock.at(secs, 999_999), format!("{want}.999999Z"));
        }
        assert_eq!(clock.now().len(), STAMP.len());
    }

    #[test]
    fn numbers_are_written_as_display_writes_them() {
        for n in [0u16, 5, 42, 200, 1000, 65535] {
            let mut buf = Vec::new();
            push_number(&mut buf, n);
            assert_eq!(String::from_utf8(buf).unwrap(), n.to_string());
        }
    }

    #[test]
    fn access_lines_wait_for_the_filter() {
        // No subscriber: tracing's filter says no, and nothing reaches the buffer.
        let before = lock(&SINK.pending).len();
        access(&Access {
            method: "GET",
            path: "/",
            status: 200,
            endpoint: "status",
            duration: Duration::from_millis(1),
            user: "-",
            error: None,
        });
        assert_eq!(lock(&SINK.pending).len(), before);
    }
}
