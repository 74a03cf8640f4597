//! Logs go to stderr through `tracing`: human-readable by default, one JSON object a line with
//! `WAITROOM_LOG_FORMAT=json`, filtered by `RUST_LOG` (default `info`). pingora logs through the
//! `log` crate; the bridge puts its lines in the same stream.
//!
//! Access lines use the target `waitroom::access`; `RUST_LOG=info,waitroom::access=off` silences
//! them. Entry tokens are never logged: pingora's debug and trace lines dump whole request
//! headers (the token header included, which must travel upstream), so pingora's targets are
//! capped at INFO whatever `RUST_LOG` says.
//!
//! No request thread ever writes to stderr: every line is appended to one bounded buffer, and one
//! writer thread ([`init`]) writes it out in blocks. A log collector that stops reading (a full
//! pipe) then stalls only that thread; once the buffer holds [`BUFFER_MAX`] bytes, new lines are
//! dropped and counted (`waitroom_log_lines_dropped_total`), and the writer says how many when it
//! can write again. Lines stay whole and in order. Access lines go out when the buffer holds
//! [`FLUSH_AT`] bytes or every [`FLUSH_EVERY`]; any other line wakes the writer at once (operators
//! and tests read those as they happen); [`flush`] writes what is left before the process exits.
//!
//! An access line is not a tracing event: [`access`] asks tracing's filter whether the line is
//! wanted, then formats it itself, in the very shape the subscriber would (see [`Access`]).

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard};
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
/// Bytes waiting for the writer at most: beyond, lines are dropped. A few seconds of a busy
/// proxy's access log, so a collector that pauses briefly loses nothing.
pub const BUFFER_MAX: usize = 4 * 1024 * 1024;
/// How long [`flush`] waits for the writer at exit: a stalled reader must not hold up a stop.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// The process's one log stream, like stderr itself: a static because the tracing subscriber it
/// serves is process-wide too, and `flush` must reach it from the exit paths.
static SINK: LazyLock<Sink> = LazyLock::new(|| Sink {
    pending: Mutex::new(Pending::default()),
    wake: Condvar::new(),
    written: Condvar::new(),
    writer: AtomicBool::new(false),
});

struct Sink {
    pending: Mutex<Pending>,
    /// Wakes the writer: a line that must go out now, a full block, or an exit.
    wake: Condvar,
    /// The writer finished a block.
    written: Condvar,
    /// Whether the writer thread runs (without it, `flush` writes itself).
    writer: AtomicBool,
}

#[derive(Default)]
struct Pending {
    /// Lines not written yet.
    lines: Vec<u8>,
    /// Whether a line in `lines` is to go out at once.
    urgent: bool,
    /// Lines dropped since the writer last said so.
    dropped: u64,
    /// Whether the writer is writing a block now.
    writing: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sink {
    /// Appends one whole line, or drops it when the buffer is full; never blocks on stderr.
    fn append(&self, line: &[u8], urgent: bool) {
        let wake = {
            let mut pending = lock(&self.pending);
            if pending.lines.len() + line.len() > BUFFER_MAX {
                pending.dropped += 1;
                drop(pending);
                crate::metrics::LOG_LINES_DROPPED_TOTAL.inc();
                return;
            }
            pending.lines.extend_from_slice(line);
            pending.urgent |= urgent;
            pending.urgent || pending.lines.len() >= FLUSH_AT
        };
        if wake {
            self.wake.notify_one();
        }
    }

    /// The writer thread: takes the buffer whole and writes it, with no lock held while writing.
    fn write_forever(&self) {
        let mut block = Vec::with_capacity(FLUSH_AT);
        loop {
            let dropped = {
                let mut pending = lock(&self.pending);
                pending.writing = false;
                self.written.notify_all();
                if !(pending.urgent || pending.lines.len() >= FLUSH_AT) {
                    pending = self.wake.wait_timeout(pending, FLUSH_EVERY).unwrap_or_else(|e| e.into_inner()).0;
                }
                if pending.lines.is_empty() && pending.dropped == 0 {
                    continue;
                }
                // The two buffers take turns, so neither is grown again line by line.
                std::mem::swap(&mut pending.lines, &mut block);
                pending.urgent = false;
                pending.writing = true;
                std::mem::take(&mut pending.dropped)
            };
            let mut stderr = std::io::stderr().lock();
            if dropped > 0 {
                let _ = stderr.write_all(&dropped_line(dropped));
            }
            let _ = stderr.write_all(&block);
            let _ = stderr.flush();
            block.clear();
        }
    }

    /// Waits (at most [`EXIT_WAIT`]) until the writer has written every line appended so far.
    fn flush(&self) {
        if !self.writer.load(Ordering::Acquire) {
            let mut pending = lock(&self.pending);
            let _ = std::io::stderr().write_all(&pending.lines);
            pending.lines.clear();
            return;
        }
        let deadline = std::time::Instant::now() + EXIT_WAIT;
        let mut pending = lock(&self.pending);
        pending.urgent = true;
        self.wake.notify_one();
        while !pending.lines.is_empty() || pending.writing {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            pending = self.written.wait_timeout(pending, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// The line that says how many lines the buffer dropped, in the log's format.
fn dropped_line(dropped: u64) -> Vec<u8> {
    let mut clock = Clock::default();
    let mut line = Vec::with_capacity(160);
    let message = "log lines dropped: the log's reader did not keep up";
    if JSON.load(Ordering::Relaxed) {
        line.extend_from_slice(b"{\"timestamp\":\"");
        line.extend_from_slice(clock.now());
        let _ = writeln!(line, "\",\"level\":\"WARN\",\"message\":\"{message}\",\"dropped\":{dropped},\"target\":\"waitroom::logging\"}}");
    } else {
        line.extend_from_slice(clock.now());
        let _ = writeln!(line, "  WARN waitroom::logging: {message} dropped={dropped}");
    }
    line
}

/// What the fmt layer writes each event to: the whole formatted line, which goes out at once,
/// after the access lines before it, so the order holds.
struct Line;

impl std::io::Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        SINK.append(bytes, true);
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

/// A kind of warning that every failing request would log: in an outage the same line thousands
/// of times a second hides everything else in the log (and fills the buffer, dropping lines of
/// other kinds). Each kind is let through at most once a period; the line that is let through
/// carries how many of its kind were held back since the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warning {
    /// An enter could not reach Redis.
    EnterFailed,
    /// A status poll could not reach Redis.
    StatusFailed,
    /// An event call (its status or its draw) could not reach Redis.
    EventFailed,
    /// The event's state could not be read for an enter.
    EventStateFailed,
    /// A protected request's claim could not reach Redis.
    ClaimFailed,
    /// A claim could not be released after an order that failed.
    ReleaseFailed,
    /// A token could not be spent after an order that succeeded.
    SpendFailed,
    /// The settle queue was full and dropped a settle.
    SettleQueueFull,
    /// A queued settle failed again.
    SettleRetryFailed,
}

impl Warning {
    const KINDS: usize = 9;

    fn period(self) -> Duration {
        match self {
            Warning::SettleQueueFull | Warning::SettleRetryFailed => Duration::from_secs(10),
            _ => Duration::from_secs(1),
        }
    }

    /// `Some(lines held back since the last one)` when this line is to be logged.
    pub fn pass(self) -> Option<u64> {
        WARNINGS[self as usize].pass(self.period())
    }
}

/// When each kind of [`Warning`] was last let through, and how many were held back since: process
/// state, as the log sink is.
static WARNINGS: [Limited; Warning::KINDS] = [const { Limited::new() }; Warning::KINDS];
// A kind added without a slot would index past the array.
const _: () = assert!(Warning::SettleRetryFailed as usize + 1 == Warning::KINDS);

struct Limited {
    /// When a line of this kind was last let through, in ms since [`EPOCH`] plus one (0: never).
    last: std::sync::atomic::AtomicU64,
    held_back: std::sync::atomic::AtomicU64,
}

static EPOCH: LazyLock<std::time::Instant> = LazyLock::new(std::time::Instant::now);

impl Limited {
    const fn new() -> Limited {
        Limited { last: std::sync::atomic::AtomicU64::new(0), held_back: std::sync::atomic::AtomicU64::new(0) }
    }

    fn pass(&self, period: Duration) -> Option<u64> {
        let now = EPOCH.elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= period.as_millis() as u64;
        // Of the threads that find it due at once, one logs.
        if due && self.last.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
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
    if !SINK.writer.load(Ordering::Acquire) {
        match std::thread::Builder::new().name("waitroom-log".into()).spawn(|| SINK.write_forever()) {
            Ok(_) => SINK.writer.store(true, Ordering::Release),
            // Without the thread, lines wait in the buffer (the oldest kept, the newest dropped)
            // and go out at exit.
            Err(error) => eprintln!("waitroom: could not start the log writer: {error}"),
        }
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
        SINK.append(buf, false);
    });
}

thread_local! {
    /// Each thread formats into its own buffer, with its own clock.
    static LINE: RefCell<(Vec<u8>, Clock)> = RefCell::new((Vec::with_capacity(256), Clock::default()));
}

/// The timestamp tracing's default timer writes (`2026-12-01T23:20:00.998929Z`), its part up to
/// the seconds formatted once a second, the microseconds written into it in place.
#[derive(Default)]
struct Clock {
    second: u64,
    /// Empty until the first line.
    stamp: Vec<u8>,
}

impl Clock {
    fn now(&mut self) -> &[u8] {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        self.at(now.as_secs(), now.subsec_micros())
    }

    fn at(&mut self, secs: u64, micros: u32) -> &[u8] {
        if self.stamp.is_empty() || self.second != secs {
            self.second = secs;
            // humantime's RFC 3339 to the second (`...:00Z`); its `Z` makes room for the fraction.
            let seconds = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string();
            self.stamp.clear();
            self.stamp.extend_from_slice(&seconds.as_bytes()[..19]);
            self.stamp.extend_from_slice(b".000000Z");
        }
        put_digits(&mut self.stamp[20..26], micros.into());
        &self.stamp
    }
}

/// Each field's name with what goes before it and after it, in tracing's text format and in its
/// JSON format, in the order tracing's event recorded them: one copy a name rather than three.
const NAMES: [(&[u8], &[u8]); 7] = [
    (b" method=", b",\"method\":"),
    (b" path=", b",\"path\":"),
    (b" status=", b",\"status\":"),
    (b" endpoint=", b",\"endpoint\":"),
    (b" duration_ms=", b",\"duration_ms\":"),
    (b" user=", b",\"user\":"),
    (b" error=", b",\"error\":"),
];

impl Access<'_> {
    /// The whole line, newline included: tracing's text format (`%` fields bare, strings and
    /// floats as `{:?}`), or its JSON format with `flatten_event` (the fields between the level and
    /// the target). An absent error is not recorded, so not written.
    fn write(&self, buf: &mut Vec<u8>, timestamp: &[u8], json: bool) {
        let name = |buf: &mut Vec<u8>, i: usize| {
            let (text, in_json) = NAMES[i];
            buf.extend_from_slice(if json { in_json } else { text });
        };
        if json {
            // A timestamp is digits and ASCII punctuation: nothing to escape.
            buf.extend_from_slice(b"{\"timestamp\":\"");
            buf.extend_from_slice(timestamp);
            buf.extend_from_slice(b"\",\"level\":\"INFO\"");
        } else {
            buf.extend_from_slice(timestamp);
            buf.extend_from_slice(b"  INFO waitroom::access:");
        }
        name(buf, 0);
        if json {
            quoted(buf, self.method, true);
        } else {
            buf.extend_from_slice(self.method.as_bytes());
        }
        name(buf, 1);
        quoted(buf, self.path, json);
        name(buf, 2);
        buf.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        name(buf, 3);
        quoted(buf, self.endpoint, json);
        name(buf, 4);
        push_millis(buf, self.duration, json);
        name(buf, 5);
        quoted(buf, self.user, json);
        if let Some(error) = &self.error {
            name(buf, 6);
            quoted(buf, error, json);
        }
        buf.extend_from_slice(if json { b",\"target\":\"waitroom::access\"}\n" } else { b"\n" });
    }
}

/// `n`'s last `digits.len()` decimal digits into `digits`, zero-padded (core::fmt costs a few
/// hundred instructions a number).
fn put_digits(digits: &mut [u8], mut n: u64) {
    for d in digits.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
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

/// Whether `{:?}` and JSON both leave `s` as it is: printable ASCII but `"` and `\`. Eight bytes
/// at a time (the byte-by-byte test cost a line about 300 instructions), with the word tests of
/// Sean Anderson's "Bit Twiddling Hacks" (`hasless`, `hasmore`, `haszero`), each exact for
/// whether any byte of the word matches.
fn plain(s: &str) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH != 0;
    let plain_word = |w: u64| {
        let below_space = w.wrapping_sub(0x20 * ONES) & !w & HIGH != 0;
        let above_tilde = (w.wrapping_add(ONES) | w) & HIGH != 0;
        let quote_or_backslash = has_zero(w ^ (u64::from(b'"') * ONES)) || has_zero(w ^ (u64::from(b'\\') * ONES));
        !(below_space || above_tilde || quote_or_backslash)
    };
    let (words, rest) = s.as_bytes().as_chunks::<8>();
    // The tail as a word too, filled up with spaces (plain).
    let mut tail = [b' '; 8];
    tail[..rest.len()].copy_from_slice(rest);
    words.iter().all(|&word| plain_word(u64::from_ne_bytes(word))) && plain_word(u64::from_ne_bytes(tail))
}

/// `s` quoted as `{:?}` writes it (`json`: as serde_json does), without either's machinery when
/// it is plain.
fn quoted(buf: &mut Vec<u8>, s: &str, json: bool) {
    if plain(s) {
        buf.reserve(s.len() + 2);
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
        line.write(&mut buf, STAMP.as_bytes(), json);
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
            assert_eq!(clock.at(secs, 7), format!("{want}.000007Z").as_bytes());
            // The same second again: only the fraction moves.
            assert_eq!(clock.at(secs, 999_999), format!("{want}.999999Z").as_bytes());
        }
        assert_eq!(clock.now().len(), STAMP.len());
    }

    #[test]
    fn plain_is_the_byte_by_byte_test() {
        let by_byte = |s: &[u8]| s.iter().all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
        // Every byte in every position of a word and of the tail, among plain neighbours that sit
        // next to the bounds (a borrow or carry between bytes would show there).
        for len in [1, 7, 8, 9, 16, 17] {
            for at in 0..len {
                for b in 0..=255u8 {
                    for fill in [b' ', b'~', b'!', b'#', b'[', b']'] {
                        let mut bytes = vec![fill; len];
                        bytes[at] = b;
                        let Ok(s) = std::str::from_utf8(&bytes) else { continue };
                        assert_eq!(plain(s), by_byte(&bytes), "{bytes:?}");
                    }
                }
            }
        }
        // Bytes above ASCII come in whole characters.
        for len in [1, 8, 9, 16, 17] {
            for at in 0..len {
                for c in ["\u{80}", "ü", "\u{7ff}", "€", "\u{ffff}", "𝄞", "\u{10ffff}"] {
                    let s = format!("{}{c}{}", "~".repeat(at), "~".repeat(len - at));
                    assert!(!plain(&s), "{s:?}");
                }
            }
        }
        assert!(plain(""));
    }

    #[test]
    fn a_limited_warning_passes_once_a_period_with_the_count_held_back() {
        let hour = Duration::from_secs(3600);
        let limited = Limited::new();
        assert_eq!(limited.pass(hour), Some(0));
        for _ in 0..5 {
            assert_eq!(limited.pass(hour), None);
        }
        let every_time = Limited::new();
        assert_eq!((every_time.pass(Duration::ZERO), every_time.pass(Duration::ZERO)), (Some(0), Some(0)));
        // Due again: the line says how many were held back.
        assert_eq!(limited.pass(Duration::ZERO), Some(5));
    }

    #[test]
    fn access_lines_wait_for_the_filter() {
        // No subscriber: tracing's filter says no, and nothing reaches the buffer.
        let before = lock(&SINK.pending).lines.len();
        access(&Access {
            method: "GET",
            path: "/",
            status: 200,
            endpoint: "status",
            duration: Duration::from_millis(1),
            user: "-",
            error: None,
        });
        assert_eq!(lock(&SINK.pending).lines.len(), before);
    }
}
