//! The accepted stream the loop wraps: it holds each request head until it is whole, enforces the
//! head's deadlines and size, gives pingora exactly the body a head declares, and gathers a
//! response's small writes (see the module doc of [`super`]).

use super::*;

mod delegate;

#[derive(Debug)]
pub(super) enum Stage {
    /// A request head is due: bytes are held here until it is whole.
    Head { held: Vec<u8>, end: HeadEnd, first_byte: bool, fresh: bool, started: Instant },
    /// A completed head (and whatever came with it) on its way to pingora.
    Release { bytes: Vec<u8>, at: usize },
    /// A request is being served: reads and writes pass straight through.
    Serving,
    /// Over `max_request_head`: the 431 is being written.
    Refusing { response: Vec<u8>, at: usize },
    /// The 431 is out: the client's input is read and dropped until it closes or LINGER passes.
    Lingering,
    /// A limit closed the connection: every read fails.
    Closed,
}

/// An accepted connection held to `limits` (see the module doc); everything pingora asks of a
/// stream besides reading and writing is passed to the one inside.
#[derive(Debug)]
pub struct LimitedStream {
    inner: Stream,
    pub(super) stage: Stage,
    /// The deadline of the current head (or of the linger after a 431) ...
    deadline: Instant,
    /// ... and the timer that wakes a read waiting for it (see `poll_deadline`): a request whose
    /// head is already there touches no timer.
    timer: Pin<Box<Sleep>>,
    header_timeout: Duration,
    max_head: usize,
    /// A response's writes, gathered until pingora flushes them (see `poll_write`). Empty, with
    /// no allocation, while the connection waits for a head.
    pub(super) pending: Vec<u8>,
    /// Bytes read off the socket that come after the head being served: a pipelined client's
    /// next requests (or a body), and what a held poll's watch read (see [`Unread`]). Read
    /// before the socket, the next head's from here first: pingora keeps nothing past the head
    /// it is given, so bytes handed over with it were lost, and so were the requests in them.
    /// Empty, with no allocation, unless a client sent ahead.
    unread: Vec<u8>,
    /// How many more bytes pingora's session may read: what is left of the body its head
    /// declared (all, for a body of unknown framing or a tunnel). Past it comes the next
    /// request, which pingora would read while it forwards this one (its look at the connection
    /// while it waits for the upstream) and take for bytes sent after the end of a body: it drops
    /// the request at the upstream unanswered and answers nothing. Its reads wait instead, and
    /// what arrives is kept in `unread` for the next head (see `poll_after_request`).
    allowance: Allowance,
    /// Set by the proxy for a request whose upstream answer must be heard whatever the client
    /// does (a protected order: its token is settled by that answer, see [`hold_client`]).
    held: AtomicBool,
    /// The body the head being served declares, whether or not it asks to switch protocols.
    declared: Body,
    /// The head asks to switch protocols: pingora may read every byte (a tunnel after a 101) ...
    switch: bool,
    /// ... unless the proxy forwards it without its `Upgrade` ([`forwarding`]): then only the
    /// declared body, as for any request.
    switch_dropped: AtomicBool,
    /// How the client left while a held request was at the upstream: told to the loop's next
    /// read, once the answer is out, instead of to pingora.
    departed: Option<Departed>,
    _slot: Slot,
}

/// What of the connection's bytes pingora may read while it serves a request (see
/// `LimitedStream::allowance`).
#[derive(Debug, Clone, Copy)]
enum Allowance {
    /// Everything: a body of unknown framing, a tunnel, or no forwarded request.
    All,
    /// This many more bytes of body.
    Length(usize),
    /// A chunked body, up to its end.
    Chunked(ChunkedEnd),
}

impl From<Body> for Allowance {
    fn from(body: Body) -> Allowance {
        match body {
            Body::Length(length) => Allowance::Length(length),
            Body::Chunked => Allowance::Chunked(ChunkedEnd::START),
            Body::Unknown => Allowance::All,
        }
    }
}

/// A client's end of its connection, noticed while a held request was at the upstream.
#[derive(Debug, Clone, Copy)]
enum Departed {
    Closed,
    Failed(io::ErrorKind),
}

/// Marks the request `session` serves as one whose upstream answer must be heard whatever the
/// client does next (contract section 12, one admission, one order): a client that closes its
/// connection, resets it, or sends more after a protected order would otherwise make pingora drop
/// the order at the upstream unanswered, and its claim would be released while the upstream may
/// have taken the order, so one token could place any number of them. The connection's reads
/// then wait until the answer has come (and settled the token); how the client left is seen by
/// the next read, once the answer is written (or fails to be).
pub fn hold_client(session: &pingora::protocols::http::ServerSession) {
    if let Some(limited) = session.stream().and_then(|stream| stream.as_any().downcast_ref::<LimitedStream>()) {
        limited.held.store(true, Ordering::Relaxed);
    }
}

/// Tells the connection under `session` whether its request is forwarded without its `Upgrade`
/// (`drop_switch`, see [`crate::proxy`]), and returns what the connection can vouch for of where
/// the request ends, or `None` for a stream that is not the connection loop's.
pub fn forwarding(session: &pingora::protocols::http::ServerSession, drop_switch: bool) -> Option<Delimited> {
    let limited = session.stream().and_then(|stream| stream.as_any().downcast_ref::<LimitedStream>())?;
    if drop_switch {
        limited.switch_dropped.store(true, Ordering::Relaxed);
    }
    Some(match limited.declared {
        Body::Unknown => Delimited::Not,
        _ if limited.switch && !drop_switch => Delimited::UnlessSwitched,
        _ => Delimited::Yes,
    })
}

/// The body the request `session` serves declares, as the connection loop read its head (the one
/// framing decision, see [`crate::http1`]), or `None` for a stream that is not the loop's.
pub fn declared_body(session: &pingora::protocols::http::ServerSession) -> Option<Body> {
    let limited = session.stream().and_then(|stream| stream.as_any().downcast_ref::<LimitedStream>())?;
    Some(limited.declared)
}

/// Whether the connection knows where a request ends, and so where the next one starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delimited {
    /// Its body's end is plain (a length, or chunked alone).
    Yes,
    /// It may switch protocols: every byte after its head may be the new protocol's.
    UnlessSwitched,
    /// Only pingora reads where its body ends: what the client sends after it cannot be told
    /// apart from it, and may be taken for more body or for an error after the request was sent.
    Not,
}

impl LimitedStream {
    pub(super) fn new(inner: Stream, slot: Slot, limits: &LimitsConfig) -> LimitedStream {
        let mut stream = LimitedStream {
            inner,
            stage: Stage::Serving,
            deadline: Instant::now(),
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            header_timeout: limits.header_timeout,
            max_head: limits.max_request_head,
            pending: Vec::new(),
            unread: Vec::new(),
            allowance: Allowance::All,
            held: AtomicBool::new(false),
            declared: Body::Length(0),
            switch: false,
            switch_dropped: AtomicBool::new(false),
            departed: None,
            _slot: slot,
        };
        stream.expect_head(limits, true);
        stream
    }

    /// A request head is due now: on a fresh connection (`fresh`) or after a response.
    pub(super) fn expect_head(&mut self, limits: &LimitsConfig, fresh: bool) {
        let now = Instant::now();
        self.header_timeout = limits.header_timeout;
        self.max_head = limits.max_request_head;
        let idle = if fresh { limits.idle_timeout.min(limits.header_timeout) } else { limits.idle_timeout };
        self.deadline = now + idle;
        self.allowance = Allowance::All;
        *self.held.get_mut() = false;
        self.declared = Body::Length(0);
        self.switch = false;
        *self.switch_dropped.get_mut() = false;
        self.stage = Stage::Head { held: Vec::new(), end: HeadEnd::default(), first_byte: false, fresh, started: now };
    }

    /// Counted when the limit strikes: a refused head at its 431, a deadline here.
    fn close(&mut self, why: Closed) -> io::Error {
        self.stage = Stage::Closed;
        let kind = match why {
            Closed::HeadTooLarge => io::ErrorKind::InvalidData,
            Closed::IdleTimeout | Closed::HeaderTimeout => {
                metrics::CONNECTIONS_CLOSED_TOTAL.with_label_values(&[why.label()]).inc();
                io::ErrorKind::TimedOut
            }
        };
        io::Error::new(kind, why.label())
    }

    /// Ready once `deadline` has passed; otherwise the timer will wake this task then.
    ///
    /// The timer is moved earlier at once but never later: a busy keep-alive connection pushes
    /// its deadline forward with every request, and re-arming a timer per request costs a lock
    /// on the runtime's timer wheel. A timer that fires before the current deadline (once per
    /// `idle_timeout` at most) is simply re-armed then.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.timer.deadline() > self.deadline {
                self.timer.as_mut().reset(self.deadline);
            }
            ready!(self.timer.as_mut().poll(cx));
            if Instant::now() >= self.deadline {
                return Poll::Ready(());
            }
            self.timer.as_mut().reset(self.deadline);
        }
    }

    /// The next request head and whatever came with it (`None`: the client closed first), read
    /// through the head stage's deadlines and size limit into a per-thread buffer and kept in one
    /// allocation of its own size (see [`Guarded`]).
    pub(super) async fn read_head(&mut self) -> io::Result<Option<BytesMut>> {
        let mut head = BytesMut::new();
        std::future::poll_fn(|cx| self.poll_next_head(cx, &mut head)).await?;
        Ok((!head.is_empty()).then_some(head))
    }

    fn poll_next_head(&mut self, cx: &mut Context<'_>, head: &mut BytesMut) -> Poll<io::Result<()>> {
        READ_BUFFER.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            loop {
                let mut buf = ReadBuf::new(&mut scratch[..]);
                ready!(self.poll_stage(cx, &mut buf))?;
                if buf.filled().is_empty() {
                    return Poll::Ready(Ok(()));
                }
                head.extend_from_slice(buf.filled());
                // A head gathered over several reads is released in pieces of the buffer's size.
                if matches!(self.stage, Stage::Serving) {
                    return Poll::Ready(Ok(()));
                }
            }
        })
    }

    /// Reading while a head is due. Returns only with the whole head (or nothing, or an error).
    fn poll_head(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let Stage::Head { first_byte, .. } = &self.stage else { return self.poll_stage(cx, buf) };
            let why = if *first_byte { Closed::HeaderTimeout } else { Closed::IdleTimeout };
            let before = buf.filled().len();
            if !self.unread.is_empty() {
                self.take_unread(buf);
            } else if let Some(departed) = self.departed {
                // The client left during the last request: nothing more comes (an empty read).
                if let Departed::Failed(kind) = departed {
                    return Poll::Ready(Err(kind.into()));
                }
            } else {
                match Pin::new(&mut self.inner).poll_read(cx, buf) {
                    Poll::Pending => {
                        ready!(self.poll_deadline(cx));
                        return Poll::Ready(Err(self.close(why)));
                    }
                    Poll::Ready(result) => result?,
                }
            }
            if Instant::now() >= self.deadline {
                // Bytes that keep coming (a trickle) do not move the deadline.
                buf.set_filled(before);
                return Poll::Ready(Err(self.close(why)));
            }
            let Stage::Head { held, end, first_byte, fresh, started } = &mut self.stage else { unreachable!() };
            let new = &buf.filled()[before..];
            if new.is_empty() {
                // The client closed: pingora sees a connection that went away without a request.
                held.clear();
                return Poll::Ready(Ok(()));
            }
            if !*first_byte {
                *first_byte = true;
                // From the first byte the head has header_timeout (a fresh connection's is
                // counted from the accept).
                let from = if *fresh { *started } else { Instant::now() };
                self.deadline = from + self.header_timeout;
            }
            let done = end.feed(new);
            let head_len = held.len() + done.unwrap_or(new.len());
            if head_len > self.max_head {
                buf.set_filled(before);
                metrics::CONNECTIONS_CLOSED_TOTAL.with_label_values(&[Closed::HeadTooLarge.label()]).inc();
                self.stage = Stage::Refusing { response: too_large_response(), at: 0 };
                return self.poll_stage(cx, buf);
            }
            // The head ends inside this read: what follows it is kept for after it.
            let new = match done {
                Some(end) if end < new.len() => {
                    let after = new[end..].to_vec();
                    self.unread.splice(0..0, after);
                    buf.set_filled(before + end);
                    &buf.filled()[before..]
                }
                _ => new,
            };
            match done {
                // The usual case: the whole head in one read, passed on as it is.
                Some(_) if held.is_empty() => {
                    self.stage = Stage::Serving;
                    return Poll::Ready(Ok(()));
                }
                Some(_) => {
                    held.extend_from_slice(new);
                    buf.set_filled(before);
                    let bytes = std::mem::take(held);
                    self.stage = Stage::Release { bytes, at: 0 };
                    return self.poll_stage(cx, buf);
                }
                None => {
                    held.extend_from_slice(new);
                    buf.set_filled(before);
                }
            }
        }
    }

    fn poll_stage(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            match &mut self.stage {
                Stage::Head { .. } => return self.poll_head(cx, buf),
                Stage::Serving => return self.poll_serving(cx, buf),
                Stage::Release { bytes, at } => {
                    let n = (bytes.len() - *at).min(buf.remaining());
                    buf.put_slice(&bytes[*at..*at + n]);
                    *at += n;
                    if *at == bytes.len() {
                        self.stage = Stage::Serving;
                    }
                    return Poll::Ready(Ok(()));
                }
                Stage::Refusing { response, at } => {
                    ready!(Self::poll_drain(&mut self.inner, &mut self.pending, cx))?;
                    while *at < response.len() {
                        match ready!(Pin::new(&mut self.inner).poll_write(cx, &response[*at..])) {
                            Ok(0) | Err(_) => return Poll::Ready(Err(self.close(Closed::HeadTooLarge))),
                            Ok(n) => *at += n,
                        }
                    }
                    if ready!(Pin::new(&mut self.inner).poll_flush(cx)).is_err()
                        || ready!(Pin::new(&mut self.inner).poll_shutdown(cx)).is_err()
                    {
                        return Poll::Ready(Err(self.close(Closed::HeadTooLarge)));
                    }
                    self.deadline = Instant::now() + LINGER;
                    self.stage = Stage::Lingering;
                }
                Stage::Lingering => {
                    if self.poll_deadline(cx).is_ready() {
                        return Poll::Ready(Err(self.close(Closed::HeadTooLarge)));
                    }
                    // Read into the caller's buffer and drop it: no memory of ours.
                    let before = buf.filled().len();
                    let read = ready!(Pin::new(&mut self.inner).poll_read(cx, buf));
                    let got = buf.filled().len() - before;
                    buf.set_filled(before);
                    if read.is_err() || got == 0 || buf.remaining() == 0 {
                        return Poll::Ready(Err(self.close(Closed::HeadTooLarge)));
                    }
                }
                Stage::Closed => return Poll::Ready(Err(io::Error::from(io::ErrorKind::NotConnected))),
            }
        }
    }
}

impl LimitedStream {
    /// pingora's reads while it serves a request: the body the head declared, from what the
    /// client sent ahead first, then nothing (see `allowance`).
    fn poll_serving(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.switch && *self.switch_dropped.get_mut() {
            // Forwarded without its Upgrade: a request like any other, its body as declared.
            self.switch = false;
            self.allowance = self.declared.into();
        }
        match self.allowance {
            Allowance::Length(0) => self.poll_after_request(cx),
            Allowance::Length(left) => {
                let mut body = ReadBuf::new(buf.initialize_unfilled_to(left.min(buf.remaining())));
                ready!(self.poll_body(cx, &mut body))?;
                let taken = body.filled().len();
                buf.advance(taken);
                self.allowance = Allowance::Length(left - taken);
                Poll::Ready(Ok(()))
            }
            Allowance::Chunked(mut end) => {
                let before = buf.filled().len();
                ready!(self.poll_body(cx, buf))?;
                self.allowance = match end.feed(&buf.filled()[before..]) {
                    Fed::More => Allowance::Chunked(end),
                    Fed::End(at) => {
                        // What came with the body's end is the next request's.
                        let after = buf.filled()[before + at..].to_vec();
                        self.unread.splice(0..0, after);
                        buf.set_filled(before + at);
                        Allowance::Length(0)
                    }
                    Fed::Lost => Allowance::All,
                };
                Poll::Ready(Ok(()))
            }
            Allowance::All if !self.unread.is_empty() => {
                self.take_unread(buf);
                Poll::Ready(Ok(()))
            }
            Allowance::All if self.departed.is_some() => Poll::Pending,
            Allowance::All => {
                let before = buf.filled().len();
                let read = ready!(Pin::new(&mut self.inner).poll_read(cx, buf));
                if !self.held.load(Ordering::Relaxed) {
                    return Poll::Ready(read);
                }
                // A body whose end only pingora knows: a held request's client that leaves is
                // kept from pingora as past the end (a body cut short then waits for pingora's
                // body timeout, and its request is refused as any unfinished body).
                match read {
                    Ok(()) if buf.filled().len() > before => Poll::Ready(Ok(())),
                    Ok(()) => self.depart(Departed::Closed),
                    Err(e) => self.depart(Departed::Failed(e.kind())),
                }
            }
        }
    }

    /// Body bytes for pingora, what the client sent ahead first. A body cut short (an empty read)
    /// is pingora's to refuse: no whole request reached the upstream.
    fn poll_body(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.unread.is_empty() {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        } else {
            self.take_unread(buf);
            Poll::Ready(Ok(()))
        }
    }

    /// pingora's look at the connection once the whole request is its own, while it waits for the
    /// upstream's answer. What the client sends now is its next request: kept in `unread` (up to
    /// `max_request_head`, then left in the socket) for the loop, and pingora waits, woken by the
    /// answer. A client that closes or resets the connection is pingora's to see, which then
    /// gives up the request as nginx does; a held request's is kept for after the answer.
    fn poll_after_request(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut scratch = [0u8; 2048];
        while self.departed.is_none() && self.unread.len() < self.max_head {
            let mut read = ReadBuf::new(&mut scratch);
            let result = ready!(Pin::new(&mut self.inner).poll_read(cx, &mut read));
            let held = self.held.load(Ordering::Relaxed);
            match result {
                Ok(()) if !read.filled().is_empty() => self.unread.extend_from_slice(read.filled()),
                Ok(()) if held => return self.depart(Departed::Closed),
                Err(e) if held => return self.depart(Departed::Failed(e.kind())),
                other => return Poll::Ready(other),
            }
        }
        Poll::Pending
    }

    /// Keeps a held request's client leaving from pingora: its read waits for the answer.
    fn depart(&mut self, how: Departed) -> Poll<io::Result<()>> {
        self.departed = Some(how);
        Poll::Pending
    }

    /// Moves what `buf` has room for from the front of `unread` into it.
    fn take_unread(&mut self, buf: &mut ReadBuf<'_>) {
        let n = self.unread.len().min(buf.remaining());
        buf.put_slice(&self.unread[..n]);
        self.unread.drain(..n);
        if self.unread.is_empty() {
            self.unread = Vec::new();
        }
    }

    /// Whether a client's bytes wait here, taken off the socket during an earlier request.
    pub(super) fn has_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    /// The head about to go to pingora frames what follows it as `framing`: the one decision
    /// every reader of this request obeys (see [`crate::http1`]).
    pub(super) fn hand_over(&mut self, framing: Framing) {
        self.declared = framing.body;
        self.switch = framing.switch;
        self.allowance = if framing.switch { Allowance::All } else { framing.body.into() };
    }
}

impl Unread for LimitedStream {
    fn unread(&mut self, bytes: &[u8]) {
        self.unread.splice(0..0, bytes.iter().copied());
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_stage(cx, buf)
    }
}

/// Writes smaller than this are gathered until the flush, so a response's head and a small body
/// leave in one send; pingora's own L4 write buffer (off on `listen`, see `crate::server`) has
/// this size and the same rule.
const GATHER_BELOW: usize = 1460;

impl LimitedStream {
    /// Sends what `pending` holds, then frees it: an idle connection keeps no write buffer.
    fn poll_drain(inner: &mut Stream, pending: &mut Vec<u8>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !pending.is_empty() {
            match ready!(Pin::new(&mut *inner).poll_write(cx, pending)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => drop(pending.drain(..n)),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        *pending = Vec::new();
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for LimitedStream {
    /// pingora's buffered writer's rule, with a buffer that exists only while a response is being
    /// written: small writes are gathered, a large one first sends what was gathered and then
    /// goes straight to the socket.
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.len() + buf.len() > GATHER_BELOW {
            ready!(Self::poll_drain(&mut this.inner, &mut this.pending, cx))?;
        }
        if buf.len() >= GATHER_BELOW {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        if this.pending.capacity() == 0 {
            // Once a response, at the size it can reach: no growing copies.
            this.pending.reserve_exact(GATHER_BELOW);
        }
        this.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Self::poll_drain(&mut this.inner, &mut this.pending, cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(Self::poll_drain(&mut this.inner, &mut this.pending, cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

