//! Just enough of the Redis protocol: encoding commands (for `redis-cli --pipe` streams) and a
//! small async client for the crowd's read-only look-ups (ZSCORE, ZCARD, GET).

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Appends one command in RESP (an array of bulk strings).
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

#[derive(Debug)]
#[allow(dead_code)] // the error and array payloads are kept for debugging output
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Simple(String),
    Error(String),
    Array(Vec<Reply>),
}

impl Reply {
    /// An integer, or a bulk/simple string holding one (ZSCORE answers a string).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Bulk(b) => std::str::from_utf8(b).ok()?.trim().parse::<f64>().ok().map(|f| f as i64),
            Reply::Simple(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
}

pub struct Redis {
    stream: BufReader<TcpStream>,
    buf: Vec<u8>,
}

impl Redis {
    pub async fn connect(addr: &str) -> std::io::Result<Redis> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Redis { stream: BufReader::new(stream), buf: Vec::new() })
    }

    pub async fn cmd(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        self.buf.clear();
        encode(&mut self.buf, args);
        self.stream.get_mut().write_all(&self.buf).await?;
        read_reply(&mut self.stream).await
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

async fn read_line(r: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "redis closed"));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_reply(
    r: &mut BufReader<TcpStream>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Reply>> + Send + '_>> {
    Box::pin(async move {
        let line = read_line(r).await?;
        let (kind, rest) = line.split_at(1);
        match kind {
            "+" => Ok(Reply::Simple(rest.to_string())),
            "-" => Ok(Reply::Error(rest.to_string())),
            ":" => rest.parse().map(Reply::Int).map_err(|_| bad("integer")),
            "$" => {
                let len: i64 = rest.parse().map_err(|_| bad("bulk length"))?;
                if len < 0 {
                    return Ok(Reply::Nil);
                }
                let mut data = vec![0u8; len as usize + 2];
                r.read_exact(&mut data).await?;
                data.truncate(len as usize);
                Ok(Reply::Bulk(data))
            }
            "*" => {
                let len: i64 = rest.parse().map_err(|_| bad("array length"))?;
                if len < 0 {
                    return Ok(Reply::Nil);
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(read_reply(r).await?);
                }
                Ok(Reply::Array(items))
            }
            _ => Err(bad("reply type")),
        }
    })
}
