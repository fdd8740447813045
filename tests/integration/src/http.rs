//! A plain HTTP/1.1 client for the tests that talk to servers and the front door directly
//! (`Connection: close`, the whole answer read, chunked coding undone), and a streamed request
//! that a test can abandon mid-stream.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// An HTTP answer: status, the head's header lines (lower-cased names), the body (de-chunked).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The first header of that (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON (panics, showing it, when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of an SSE body, in order (`[DONE]` included).
    pub fn sse_data(&self) -> Vec<String> {
        self.body.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.trim().to_string()).collect()
    }
}

/// `GET path` on `addr` (`Connection: close`): status and body, or why it failed.
pub fn get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let r = request(addr, "GET", path, &[], None, Duration::from_secs(10))?;
    Ok((r.status, r.body))
}

/// `POST path` with a JSON body and extra headers on `addr`, read to the end (`Connection: close`).
pub fn post_json(addr: &str, path: &str, headers: &[(&str, &str)], body: &serde_json::Value) -> Reply {
    request(addr, "POST", path, headers, Some(&body.to_string()), Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("POST {path} to {addr}: {e}"))
}

fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
) -> Result<Reply, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_read_timeout(Some(timeout));
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).map_err(|e| format!("write: {e}"))?;
    if let Some(b) = body {
        s.write_all(b.as_bytes()).map_err(|e| format!("write: {e}"))?;
    }
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    parse_reply(&raw)
}

/// Splits a whole HTTP/1.1 response and undoes chunked transfer coding.
pub fn parse_reply(raw: &[u8]) -> Result<Reply, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no end of head in {text:?}"))?;
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked { dechunk(rest)? } else { rest.to_string() };
    Ok(Reply { status, headers, body })
}

fn dechunk(mut rest: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or("a chunk size without CRLF")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("chunk size {size:?}: {e}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = after.get(..size).ok_or("a chunk shorter than its size")?;
        out.push_str(chunk);
        rest = after[size..].strip_prefix("\r\n").ok_or("a chunk without its CRLF")?;
    }
}

/// A streamed request left open: the test reads until the stream has started, then drops it
/// (the client disconnects mid-stream).
pub struct OpenStream {
    reader: BufReader<TcpStream>,
}

impl OpenStream {
    /// Sends `POST path` with `body` (which asks for `"stream": true`) and reads the head.
    pub fn start(addr: &str, path: &str, body: &serde_json::Value) -> Self {
        let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
        let b = body.to_string();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            b.len()
        );
        s.write_all(head.as_bytes()).and_then(|_| s.write_all(b.as_bytes())).unwrap_or_else(|e| panic!("write: {e}"));
        Self { reader: BufReader::new(s) }
    }

    /// Reads lines until `n` SSE `data:` lines have come; returns the head and those lines.
    pub fn read_events(&mut self, n: usize) -> Vec<String> {
        let mut seen = Vec::new();
        let mut line = String::new();
        while seen.iter().filter(|l: &&String| l.starts_with("data:")).count() < n {
            line.clear();
            let got =
                self.reader.read_line(&mut line).unwrap_or_else(|e| panic!("reading the stream: {e} after {seen:?}"));
            if got == 0 {
                panic!("the stream ended after {seen:?}");
            }
            seen.push(line.trim_end().to_string());
        }
        seen
    }
}

#[cfg(test)]
mod tests;
