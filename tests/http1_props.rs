//! The connection loop's splitters (`src/http1`) against references written apart from them: where
//! a request head ends against httparse, where a chunked body ends against a whole-buffer reader
//! (`tests/differential/reference.rs`), each fed in arbitrary pieces, as a trickling or
//! pipelining client sends them.

#[path = "differential/reference.rs"]
mod reference;

use proptest::prelude::*;
use waitroom::http1::chunked::{ChunkedEnd, Fed};
use waitroom::http1::head::{self, HeadEnd};

/// `bytes` cut at `cuts` (positions taken modulo its length, in any order).
fn pieces<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| if bytes.is_empty() { 0 } else { c % (bytes.len() + 1) }).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| &bytes[w[0]..w[1]]).collect()
}

fn head_end(parts: &[&[u8]]) -> Option<usize> {
    HeadEnd::across(parts)
}

fn chunked_end(parts: &[&[u8]]) -> Result<Option<usize>, ()> {
    let mut end = ChunkedEnd::START;
    let mut seen = 0;
    for part in parts {
        match end.feed(part) {
            Fed::More => seen += part.len(),
            Fed::End(n) => return Ok(Some(seen + n)),
            Fed::Lost => return Err(()),
        }
    }
    Ok(None)
}

/// Header lines a client may send, hostile ones included (obs-fold, bare LF, NUL, tabs, spaces
/// before the colon, framing fields in every spelling).
fn header_line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"Host: shop\r\n".to_vec()),
        Just(b"X-User-Id: u1\r\n".to_vec()),
        Just(b"Content-Length: 5\r\n".to_vec()),
        Just(b"content-length:0\r\n".to_vec()),
        Just(b"Transfer-Encoding: chunked\r\n".to_vec()),
        Just(b"Transfer-Encoding : chunked\r\n".to_vec()),
        Just(b"Transfer-Encoding: gzip, chunked\r\n".to_vec()),
        Just(b"transfer-encoding:  Chunked \r\n".to_vec()),
        prop_oneof![Just("+5"), Just("5, 5"), Just(""), Just(" 7 "), Just("-1"), Just("99999999999999999999999"), Just("0x5")]
            .prop_map(|v| format!("Content-Length: {v}\r\n").into_bytes()),
        Just(b"X-Fold: a\r\n b\r\n".to_vec()),
        Just(b"X-Lf: a\n".to_vec()),
        Just(b"X-Nul: a\0b\r\n".to_vec()),
        Just(b"X-Tab:\ta\tb\r\n".to_vec()),
        Just(b"Upgrade: h2c\r\n".to_vec()),
        "[ -~]{0,40}".prop_map(|v| format!("X-Any: {v}\r\n").into_bytes()),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(|mut v| {
            v.extend_from_slice(b"\r\n");
            v
        }),
    ]
}

fn request_head() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        Just(b"GET /queue/status HTTP/1.1\r\n".to_vec()),
        Just(b"POST /api/orders HTTP/1.1\r\n".to_vec()),
        Just(b"\r\nGET / HTTP/1.0\n".to_vec()),
        Just(b"GET /a  HTTP/1.1\r\n".to_vec()),
        "[A-Z]{1,7} /[!-~]{0,20} HTTP/1\\.[01]\r\n".prop_map(String::into_bytes),
    ];
    (line, proptest::collection::vec(header_line(), 0..8), prop_oneof![Just(&b"\r\n"[..]), Just(&b"\n"[..])]).prop_map(
        |(line, fields, end)| {
            let mut head = line;
            fields.iter().for_each(|f| head.extend_from_slice(f));
            head.extend_from_slice(end);
            head
        },
    )
}

/// A chunked body, well formed or nearly: sizes that match their data or not, extensions,
/// trailers, line ends that are bare LFs.
fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    let chunk = (proptest::collection::vec(any::<u8>(), 0..40), 0u8..8).prop_map(|(data, how)| {
        let size = match how {
            0 => data.len() + 1,
            1 => data.len().saturating_sub(1),
            _ => data.len(),
        };
        let mut c = match how {
            2 => format!("{size:X};name=\"v\"\r\n"),
            3 => format!("{size:x} \r\n"),
            4 => format!("{size:x}\n"),
            _ => format!("{size:x}\r\n"),
        }
        .into_bytes();
        c.extend_from_slice(&data);
        c.extend_from_slice(if how == 5 { b"\n" } else { b"\r\n" });
        c
    });
    let last = prop_oneof![
        Just(b"0\r\n\r\n".to_vec()),
        Just(b"000\r\nExpires: never\r\nX: y\n\r\n".to_vec()),
        Just(b"0\r\n\n".to_vec()),
        Just(b"0\r\nX: y\n\n".to_vec()),
        Just(Vec::new()),
    ];
    (proptest::collection::vec(chunk, 0..5), last, proptest::collection::vec(any::<u8>(), 0..8)).prop_map(
        |(chunks, last, noise)| {
            let mut body = chunks.concat();
            body.extend_from_slice(&last);
            body.extend_from_slice(&noise);
            body
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Wherever httparse finds a whole head, the splitter ends it at the same byte, however the
    /// bytes are cut; and the splitter never ends a head where httparse would read on.
    #[test]
    fn the_head_splitter_ends_a_head_where_httparse_does(
        head in request_head(),
        after in proptest::collection::vec(any::<u8>(), 0..32),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let stream = [head.as_slice(), after.as_slice()].concat();
        let whole = head_end(&[&stream]);
        prop_assert_eq!(head_end(&pieces(&stream, &cuts)), whole, "cut differently");
        let mut fields = [httparse::EMPTY_HEADER; 256];
        let mut parsed = httparse::Request::new(&mut fields);
        if let Ok(httparse::Status::Complete(n)) = parsed.parse(&stream) {
            prop_assert_eq!(whole, Some(n), "httparse read a head of {} bytes", n);
        }
        if let Some(end) = whole {
            let mut fields = [httparse::EMPTY_HEADER; 256];
            let mut parsed = httparse::Request::new(&mut fields);
            let partial = matches!(parsed.parse(&stream[..end]), Ok(httparse::Status::Partial));
            prop_assert!(!partial, "httparse would read on past {}", end);
        }
    }

    /// A head's framing is what a plain reading of httparse's fields says, whenever httparse
    /// reads the head; and a head httparse refuses has no framing the loop would vouch for.
    #[test]
    fn the_framing_is_httparses_fields_read_plainly(head in request_head()) {
        let read = head::read(&head, false);
        let mut fields = [httparse::EMPTY_HEADER; 256];
        let mut parsed = httparse::Request::new(&mut fields);
        match parsed.parse(&head) {
            Ok(httparse::Status::Complete(_)) if read.plain_line => {
                let expected = match reference::declared(parsed.headers) {
                    _ if parsed.method == Some("CONNECT") => head::Body::Unknown,
                    Some(reference::Declared::Length(n)) => head::Body::Length(n),
                    Some(reference::Declared::Chunked) => head::Body::Chunked,
                    None => head::Body::Unknown,
                };
                prop_assert_eq!(read.framing.body, expected);
                let upgrade = parsed.headers.iter().any(|h| h.name.eq_ignore_ascii_case("upgrade"));
                prop_assert_eq!(read.framing.switch, upgrade);
            }
            _ => prop_assert_eq!(read.framing.body, head::Body::Unknown),
        }
    }

    /// The chunk splitter finds the end the whole-buffer reader finds, however the body is cut,
    /// and gives up exactly where that reader refuses.
    #[test]
    fn the_chunk_splitter_agrees_with_a_whole_buffer_reader(
        body in chunked_body(),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let expected = reference::chunked_end(&body);
        prop_assert_eq!(chunked_end(&[&body]), expected);
        prop_assert_eq!(chunked_end(&pieces(&body, &cuts)), expected, "cut differently");
    }

    /// Arbitrary bytes: the same agreement, where most inputs are refused early.
    #[test]
    fn the_chunk_splitter_agrees_on_arbitrary_bytes(
        body in proptest::collection::vec(prop_oneof![Just(b'0'), Just(b'\r'), Just(b'\n'), Just(b';'), Just(b'a'), any::<u8>()], 0..64),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let expected = reference::chunked_end(&body);
        prop_assert_eq!(chunked_end(&pieces(&body, &cuts)), expected);
    }
}
