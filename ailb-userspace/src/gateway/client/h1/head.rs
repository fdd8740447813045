//! A client's request head, parsed in place with `httparse`, for the requests the fast path
//! takes: HTTP/1.0 or 1.1, `GET` or `POST`, an origin-form target, a body framed by one
//! `Content-Length` (or none), and no `Transfer-Encoding`, `Upgrade` or `Expect`. Any other
//! head, and any head that does not parse, is [`Parsed::Fallback`]: hyper then reads it from
//! the same bytes and answers it as it always did (400, 431, HTTP/2, chunked bodies, ...).

use std::ops::Range;

use bytes::Bytes;
use hyper::{Method, Uri, Version};

use crate::gateway::http::request::{Layout, Plain, RawHead, Routing, ROUTING};
use crate::gateway::http::{has_token, valid_value};
use crate::gateway::http::{MAX_HEADERS, MAX_HEAD_BYTES};

/// What the bytes at the start of a connection's buffer are.
#[derive(Debug)]
pub enum Parsed {
    /// The start of a head the fast path may take: more bytes are needed.
    Partial,
    /// Not for the fast path: hyper serves the connection from these bytes on.
    Fallback(Fallback),
    /// A whole head.
    Request(Head),
}

/// Why a head goes to hyper (for the debug log and the tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// It does not parse as HTTP/1.x (an HTTP/2 preface, a malformed line or header).
    Unparsed,
    /// More than [`MAX_HEADERS`] headers or [`MAX_HEAD_BYTES`] bytes.
    TooLarge,
    /// A method other than GET and POST.
    Method,
    /// A target that is not a path (`*`, an absolute URI), or one `Uri` refuses.
    Target,
    /// A name or value `http` refuses.
    Header,
    /// `Transfer-Encoding`, `Upgrade` or `Expect`.
    Framing,
    /// A `Content-Length` that is not one decimal number (or several that differ).
    Length,
}

/// A request head the fast path serves, as found in the buffer.
#[derive(Debug)]
pub struct Head {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    /// Each header's name and value, as places in the head's bytes.
    headers: Vec<(Range<u32>, Range<u32>)>,
    /// Whether one of them is `Connection`.
    connection: bool,
    /// Set when the head can go upstream as it came, with `X-Forwarded-For` added.
    plain: Option<Plain>,
    /// Where the first header of each of [`ROUTING`] is among `headers`.
    routing: Routing,
    /// Its length in the buffer (the body starts there).
    pub len: usize,
    /// Its body's length (`Content-Length`, 0 without one).
    pub body_len: u64,
    /// Whether the connection stays open after the answer: HTTP/1.1 without
    /// `Connection: close`. An HTTP/1.0 connection closes after each answer (hyper's server
    /// closes it too: the front door's answers never carry `Connection: keep-alive`).
    pub keep_alive: bool,
}

/// Whether the `Connection` value `v` says keep-alive and nothing else (empty list elements
/// aside, as HTTP allows).
fn only_keep_alive(v: &[u8]) -> bool {
    let mut said = false;
    for t in v.split(|b| *b == b',').map(<[u8]>::trim_ascii).filter(|t| !t.is_empty()) {
        if !t.eq_ignore_ascii_case(b"keep-alive") {
            return false;
        }
        said = true;
    }
    said
}

impl Head {
    /// The head with `bytes`, the buffer it was parsed from (at least its first `len` bytes).
    pub fn into_raw(self, bytes: Bytes) -> RawHead {
        let Head { method, uri, version, headers, connection, plain, routing, len, .. } = self;
        RawHead::new(method, uri, version, bytes, len, Layout { headers, connection, plain, routing })
    }
}

/// Parses the head at the start of `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    // Left unset until parsed: setting up the 100 slots for every head cost more than the
    // headers of a small request.
    let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => return Parsed::Fallback(Fallback::TooLarge),
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Fallback(Fallback::TooLarge),
        Err(_) => return Parsed::Fallback(Fallback::Unparsed),
    };
    match build(&req, buf, len) {
        Ok(head) => Parsed::Request(head),
        Err(why) => Parsed::Fallback(why),
    }
}

/// Where `part` (a slice of `buf`) lies in it.
fn place(buf: &[u8], part: &[u8]) -> Range<u32> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    // A head is at most MAX_HEAD_BYTES plus one read, far below 4 GiB.
    start as u32..(start + part.len()) as u32
}

fn build(req: &httparse::Request<'_, '_>, buf: &[u8], len: usize) -> Result<Head, Fallback> {
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => return Err(Fallback::Unparsed),
    };
    let method = match req.method {
        Some("POST") => Method::POST,
        Some("GET") => Method::GET,
        _ => return Err(Fallback::Method),
    };
    let path = req.path.ok_or(Fallback::Unparsed)?;
    if !path.starts_with('/') {
        return Err(Fallback::Target);
    }
    let uri = Uri::try_from(path).map_err(|_| Fallback::Target)?;
    let mut headers = Vec::with_capacity(req.headers.len());
    let mut body_len = None;
    let mut close = version == Version::HTTP_10;
    let mut connection = false;
    // The head can go upstream as it came when it is HTTP/1.1 with CRLF line ends, a target
    // `Uri` keeps whole (it drops a fragment), and nothing the front door takes out or rewrites.
    let crlf = |at: usize| buf.get(at.wrapping_sub(2)..at) == Some(b"\r\n");
    let mut plain = version == Version::HTTP_11
        && uri.path_and_query().is_some_and(|p| p.as_str() == path)
        && len >= 4
        && crlf(len)
        && crlf(len - 2);
    let mut has_length = false;
    let mut routing = Routing::default();
    // The index of the `Connection: keep-alive` header, whose line is cut out of a plain head.
    let mut cut_at = None;
    for (i, h) in req.headers.iter().enumerate() {
        if !valid_value(h.value) {
            return Err(Fallback::Header);
        }
        let name = place(buf, h.name.as_bytes());
        plain &= crlf(name.start as usize);
        match kind(h.name.as_bytes()) {
            Kind::Framing => return Err(Fallback::Framing),
            Kind::ContentLength => {
                let n = content_length(h.value).ok_or(Fallback::Length)?;
                if body_len.is_some_and(|prior| prior != n) {
                    return Err(Fallback::Length);
                }
                body_len = Some(n);
                has_length = true;
            }
            Kind::Connection => {
                close |= has_token(h.value, "close");
                if connection || !only_keep_alive(h.value) {
                    plain = false;
                }
                connection = true;
                cut_at = Some(i);
            }
            Kind::Rewritten => plain = false,
            Kind::Routing(which) => routing.set(which, i),
            Kind::Other => {}
        }
        headers.push((name, place(buf, h.value)));
    }
    // The line runs from its name to the next header's name (or to the blank line).
    let cut = cut_at.map(|i| {
        let end = headers.get(i + 1).map_or((len - 2) as u32, |(next, _)| next.start);
        headers[i].0.start..end
    });
    let plain = plain.then_some(Plain { has_length, cut });
    let keep_alive = !close;
    let body_len = body_len.unwrap_or(0);
    Ok(Head { method, uri, version, headers, connection, plain, routing, len, body_len, keep_alive })
}

/// What a request header is to the fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `Transfer-Encoding`, `Upgrade`, `Expect`: the request goes to hyper.
    Framing,
    ContentLength,
    /// Hop-by-hop; it may name more.
    Connection,
    /// Left out of the request upstream (another hop-by-hop header) or rewritten there
    /// (`X-Forwarded-For`).
    Rewritten,
    /// One of [`ROUTING`] (its index there).
    Routing(usize),
    Other,
}

/// The kind of header `name`, by its length first: most names differ in length from every
/// name looked for, and are told apart without comparing their bytes.
fn kind(name: &[u8]) -> Kind {
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    match name.len() {
        2 if is("te") => Kind::Rewritten,
        6 if is("expect") => Kind::Framing,
        6 if is(ROUTING[4]) => Kind::Routing(4),
        7 if is("upgrade") => Kind::Framing,
        7 if is("trailer") => Kind::Rewritten,
        10 if is("connection") => Kind::Connection,
        10 if is("keep-alive") => Kind::Rewritten,
        10 if is(ROUTING[0]) => Kind::Routing(0),
        12 if is(ROUTING[3]) => Kind::Routing(3),
        14 if is("content-length") => Kind::ContentLength,
        15 if is("x-forwarded-for") => Kind::Rewritten,
        16 if is("proxy-connection") => Kind::Rewritten,
        17 if is("transfer-encoding") => Kind::Framing,
        17 if is(ROUTING[1]) => Kind::Routing(1),
        19 if is("proxy-authorization") => Kind::Rewritten,
        20 if is(ROUTING[2]) => Kind::Routing(2),
        _ => Kind::Other,
    }
}

/// A `Content-Length` value: decimal digits only (as hyper takes it), at most 19 of them.
fn content_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

#[cfg(test)]
mod tests;
