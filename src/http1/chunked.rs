//! Where a chunked request body ends (RFC 9112, 7.1), found as the bytes pass.

/// The reader's place in a chunked body, fed as pingora reads it: the body ends after the last
/// chunk (size 0) and the empty line that ends its trailer section. Strict: every line ends in
/// CRLF; what it cannot read as that framing ([`Fed::Lost`]) makes the connection give pingora
/// every byte from then on, as for a body of unknown length, and pingora's own parser refuses
/// what it refuses. Reading a body's end differently from pingora can only make pingora wait for
/// body bytes held back (its body timeout then refuses the request) or see bytes past its end
/// (its 400): never move where the next request starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedEnd {
    /// In a chunk's size line: the size so far, and whether a digit came.
    Size { size: u64, digits: bool },
    /// Past the size, in a chunk extension, up to the line's CR.
    Extension { size: u64 },
    /// The size line's CR came.
    SizeLf { size: u64 },
    Data { left: u64 },
    DataCr,
    DataLf,
    /// Past the last chunk, at the start of a trailer line or of the final empty line.
    TrailerStart,
    TrailerLine,
    /// The final empty line's CR came.
    EndLf,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Fed {
    More,
    /// The body ends after this many of the bytes fed.
    End(usize),
    Lost,
}

impl ChunkedEnd {
    pub const START: ChunkedEnd = ChunkedEnd::Size { size: 0, digits: false };

    pub fn feed(&mut self, bytes: &[u8]) -> Fed {
        use ChunkedEnd::*;
        let mut i = 0;
        while i < bytes.len() {
            if let Data { left } = *self {
                // A chunk's data may hold anything: skipped whole, never looked at.
                let take = left.min((bytes.len() - i) as u64);
                i += take as usize;
                *self = if take == left { DataCr } else { Data { left: left - take } };
                continue;
            }
            let b = bytes[i];
            *self = match (*self, b) {
                (Size { size, .. }, b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                    let digit = u64::from((b as char).to_digit(16).unwrap_or(0));
                    match size.checked_mul(16).and_then(|s| s.checked_add(digit)) {
                        Some(size) => Size { size, digits: true },
                        None => return Fed::Lost,
                    }
                }
                (Size { size, digits: true }, b';' | b' ' | b'\t') => Extension { size },
                (Size { size, digits: true } | Extension { size }, b'\r') => SizeLf { size },
                (Extension { size }, b) if b != b'\n' => Extension { size },
                (SizeLf { size: 0 }, b'\n') => TrailerStart,
                (SizeLf { size }, b'\n') => Data { left: size },
                (DataCr, b'\r') => DataLf,
                (DataLf, b'\n') => ChunkedEnd::START,
                (TrailerStart, b'\r') => EndLf,
                (TrailerStart | TrailerLine, b) if b != b'\n' => TrailerLine,
                (TrailerLine, b'\n') => TrailerStart,
                (EndLf, b'\n') => return Fed::End(i + 1),
                _ => return Fed::Lost,
            };
            i += 1;
        }
        Fed::More
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_ends_after_its_last_chunk_and_trailers() {
        let end = |pieces: &[&[u8]]| {
            let mut at = ChunkedEnd::START;
            let mut fed = 0;
            for piece in pieces {
                match at.feed(piece) {
                    Fed::More => fed += piece.len(),
                    Fed::End(n) => return Some(fed + n),
                    Fed::Lost => return None,
                }
            }
            Some(usize::MAX)
        };
        let body: &[u8] = b"5\r\nhello\r\n1A;name=\"x\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n";
        let next = b"GET / HTTP/1.1\r\n\r\n";
        let whole = [body, next].concat();
        assert_eq!(end(&[&whole]), Some(body.len()));
        // Fed a byte at a time, as a trickling client sends it.
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(end(&bytes), Some(body.len()));
        assert_eq!(end(&[b"5\r\n0\r\n\r\n\r\n0\r\n\r\n"]), Some(15));
        assert_eq!(end(&[b"0\r\nExpires: never\r\nX-A: b\r\n\r\nGET"]), Some(29));
        assert_eq!(end(&[b"000\r\n\r\n"]), Some(7));
        assert_eq!(end(&[b"5\r\nhel"]), Some(usize::MAX), "not over yet");
        for lost in [
            &b"\r\n"[..],
            b"g\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloX\r\n",
            b"0\r\n\n",
            b"0\r\nX: y\n\n",
            b"1ffffffffffffffff\r\n",
        ] {
            assert_eq!(end(&[lost]), None, "{:?}", String::from_utf8_lossy(lost));
        }
    }
}
