//! Reference readers of HTTP/1 framing, written apart from `src/http1` (whole buffers, no state
//! machine) so the splitters can be checked against them.

/// Where a chunked body that starts at `body[0]` ends, read whole: `Ok(Some(end))`, `Ok(None)`
/// while more may come, `Err(())` when it is not that framing (RFC 9112 7.1, every chunk line
/// ending in CRLF; a trailer line may end in a bare LF, the final empty line may not).
pub fn chunked_end(body: &[u8]) -> Result<Option<usize>, ()> {
    let mut at = 0;
    loop {
        // The size line: hex digits, an optional extension, CRLF.
        let digits = body[at..].iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if at + digits == body.len() {
            return if size_fits(&body[at..at + digits]) { Ok(None) } else { Err(()) };
        }
        if digits == 0 || !size_fits(&body[at..at + digits]) {
            return Err(());
        }
        let size = u64::from_str_radix(std::str::from_utf8(&body[at..at + digits]).unwrap(), 16).unwrap();
        at += digits;
        match body[at] {
            b'\r' => {}
            b';' | b' ' | b'\t' => {
                let ext = body[at..].iter().take_while(|&&b| b != b'\r' && b != b'\n').count();
                at += ext;
                if at == body.len() {
                    return Ok(None);
                }
                if body[at] == b'\n' {
                    return Err(());
                }
            }
            _ => return Err(()),
        }
        // body[at] is the size line's CR.
        match body.get(at + 1) {
            None => return Ok(None),
            Some(b'\n') => at += 2,
            Some(_) => return Err(()),
        }
        if size == 0 {
            return trailers_end(body, at);
        }
        let data_end = (at as u64).saturating_add(size);
        if data_end.saturating_add(2) > body.len() as u64 {
            // Still inside the data or its CRLF: check what of the CRLF is there.
            let tail = &body[(data_end.min(body.len() as u64)) as usize..];
            return if b"\r\n".starts_with(tail) { Ok(None) } else { Err(()) };
        }
        let data_end = data_end as usize;
        if &body[data_end..data_end + 2] != b"\r\n" {
            return Err(());
        }
        at = data_end + 2;
    }
}

fn size_fits(digits: &[u8]) -> bool {
    let significant = digits.iter().skip_while(|&&b| b == b'0').count();
    significant <= 16
}

fn trailers_end(body: &[u8], mut at: usize) -> Result<Option<usize>, ()> {
    loop {
        match body.get(at) {
            None => return Ok(None),
            Some(b'\r') => {
                return match body.get(at + 1) {
                    None => Ok(None),
                    Some(b'\n') => Ok(Some(at + 2)),
                    Some(_) => Err(()),
                }
            }
            Some(b'\n') => return Err(()),
            Some(_) => match body[at..].iter().position(|&b| b == b'\n') {
                Some(lf) => at += lf + 1,
                None => return Ok(None),
            },
        }
    }
}

/// The body a parsed head declares, read as plainly as the proxy must (one length of digits, or
/// `chunked` alone), `None` for anything else.
pub enum Declared {
    Length(usize),
    Chunked,
}

pub fn declared(headers: &[httparse::Header]) -> Option<Declared> {
    let mut found = None;
    for h in headers {
        let this = if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value).ok()?.trim();
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Declared::Length(v.parse().ok()?)
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if !std::str::from_utf8(h.value).ok()?.trim().eq_ignore_ascii_case("chunked") {
                return None;
            }
            Declared::Chunked
        } else {
            continue;
        };
        if found.is_some() {
            return None;
        }
        found = Some(this);
    }
    Some(found.unwrap_or(Declared::Length(0)))
}
