//! HTTP/1 request framing, read once per request and obeyed by every path that serves it.
//!
//! **Why one module.** The connection loop ([`crate::connection`]) must know where each request ends
//! so that pingora never reads the client's next request as part of this one, and the early
//! answers ([`crate::proxy::early`]) must know what a head says before they answer it. When two
//! parsers of our own disagree with each other (or with pingora's) on where a request ends, one
//! of them forwards a request the other never checked: that is how request smuggling starts. So a
//! head is split off the byte stream by [`head::HeadEnd`], read once by [`head::read`] (httparse,
//! as pingora runs it) into one [`head::Framing`], and that value travels with the request: the
//! loop's allowance of body bytes, the proxy's "can the connection delimit this order" check and
//! its own-endpoint body limit all read it, none reads the head again. A chunked body's end is
//! found by [`chunked::ChunkedEnd`] as the bytes pass.
//!
//! Where this reading is unsure (a head httparse refuses, two framing fields, a transfer coding
//! other than `chunked` alone, `CONNECT`), the framing is [`head::Body::Unknown`]: the head goes
//! to pingora whole, with every byte after it, the connection is not reused, and pingora's own
//! parser decides (and refuses what it refuses). Unsure never means "half-read".

pub mod chunked;
pub mod head;
