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
mod tests {
    use super::*;
    use crate::gateway::http::Headers;

    fn head(text: &str) -> Head {
        match parse(text.as_bytes()) {
            Parsed::Request(h) => h,
            other => panic!("{text:?}: expected a head, got {other:?}"),
        }
    }

    #[test]
    fn a_head_goes_upstream_as_it_came_only_when_nothing_in_it_changes() {
        let text =
            "POST /v1/chat/completions?a=1 HTTP/1.1\r\nHost: gw\r\nX-Session-ID:  s1 \r\nContent-Length: 2\r\n\r\n{}";
        let h = head(text);
        assert_eq!(h.plain, Some(Plain { has_length: true, cut: None }));
        let len = h.len;
        let raw = h.into_raw(Bytes::from_static(text.as_bytes()));
        let lines = raw.plain().unwrap();
        assert_eq!(lines.first, &text.as_bytes()[..len - 2], "the request line and header lines, spaces and all");
        assert_eq!(lines.rest, b"");
        assert_eq!(
            head("GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n").plain,
            Some(Plain { has_length: false, cut: None })
        );
        assert_eq!(head("GET / HTTP/1.1\r\n\r\n").plain, Some(Plain { has_length: false, cut: None }));
        // A `Connection: keep-alive` line is cut out, wherever it is.
        for (text, first, rest) in [
            (
                "GET / HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: gw\r\n",
                "Accept: */*\r\n",
            ),
            ("GET / HTTP/1.1\r\nconnection:Keep-Alive , \r\n\r\n", "GET / HTTP/1.1\r\n", ""),
        ] {
            let raw = head(text).into_raw(Bytes::copy_from_slice(text.as_bytes()));
            let lines = raw.plain().unwrap();
            assert_eq!((lines.first, lines.rest), (first.as_bytes(), rest.as_bytes()), "{text:?}");
        }
        let not_plain = [
            "GET / HTTP/1.0\r\nHost: gw\r\n\r\n",
            "GET / HTTP/1.1\nHost: gw\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: gw\n\r\n",
            "GET / HTTP/1.1\r\nHost: gw\r\n\n",
            "GET /#frag HTTP/1.1\r\nHost: gw\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: keep-alive\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: \r\n\r\n",
            "GET / HTTP/1.1\r\nKEEP-ALIVE: 5\r\n\r\n",
            "GET / HTTP/1.1\r\nTE: trailers\r\n\r\n",
            "GET / HTTP/1.1\r\nTrailer: x\r\n\r\n",
            "GET / HTTP/1.1\r\nProxy-Connection: close\r\n\r\n",
            "GET / HTTP/1.1\r\nProxy-Authorization: x\r\n\r\n",
            "GET / HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
        ];
        for text in not_plain {
            assert_eq!(head(text).plain, None, "{text:?}");
        }
        for name in crate::gateway::http::HOP_BY_HOP.iter().chain(&["x-forwarded-for"]) {
            assert!(matches!(kind(name.as_bytes()), Kind::Rewritten | Kind::Connection | Kind::Framing), "{name}");
        }
    }

    #[test]
    fn a_routing_header_found_while_parsing_is_the_first_of_its_name() {
        let text = "POST / HTTP/1.1\r\nX-SESSION-ID: one\r\ncookie: a=1\r\nx-session-id: two\r\n\
                    X-Required-Memory-MB: 700\r\nX-Model-Id: m\r\nCookie: b=2\r\nX-Other: o\r\n\r\n";
        let raw = head(text).into_raw(Bytes::from_static(text.as_bytes()));
        for name in ROUTING.iter().chain(&["x-other", "x-absent", "X-Session-ID"]) {
            assert_eq!(raw.first(name), raw.values(name).next(), "{name}");
        }
        assert_eq!(raw.first("x-session-id"), Some(&b"one"[..]));
        assert_eq!(raw.first("x-required-memory"), None);
        assert_eq!(raw.first("cookie"), Some(&b"a=1"[..]));
        for name in ROUTING {
            assert_eq!(kind(name.as_bytes()), Kind::Routing(ROUTING.iter().position(|r| *r == name).unwrap()));
            assert_eq!(kind(name.to_ascii_uppercase().as_bytes()), kind(name.as_bytes()));
        }
    }

    #[test]
    fn the_openai_python_clients_head_goes_upstream_as_it_came_less_its_connection_line() {
        // As the `openai` Python client 3.57.0 (httpx) sent it to a listener.
        let text = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept-Encoding: gzip, deflate\r\n\
                    Connection: keep-alive\r\nauthorization: Bearer k\r\naccept: application/json\r\n\
                    content-type: application/json\r\nuser-agent: OpenAI/Python 3.57.0\r\nx-stainless-lang: python\r\n\
                    x-stainless-package-version: 3.57.0\r\nx-stainless-os: Linux\r\nx-stainless-arch: x64\r\n\
                    x-stainless-runtime: CPython\r\nx-stainless-runtime-version: 3.11.7\r\nx-stainless-async: false\r\n\
                    x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\nContent-Length: 57\r\n\r\n";
        let raw = head(text).into_raw(Bytes::from_static(text.as_bytes()));
        let lines = raw.plain().expect("plain");
        let (before, after) = text.split_once("Connection: keep-alive\r\n").unwrap();
        assert_eq!((lines.first, lines.rest), (before.as_bytes(), &after.as_bytes()[..after.len() - 2]));
        assert!(lines.has_length);
    }

    fn fallback(text: &[u8]) -> Fallback {
        match parse(text) {
            Parsed::Fallback(f) => f,
            other => panic!("{:?}: expected a fallback, got {other:?}", String::from_utf8_lossy(text)),
        }
    }

    #[test]
    fn a_post_with_a_body_is_taken_and_its_body_starts_after_the_head() {
        let text = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 7\r\nX-Session-ID: s\r\n\r\n{\"a\":1}";
        let h = head(text);
        assert_eq!(h.method, Method::POST);
        assert_eq!(h.uri.path(), "/v1/chat/completions");
        assert_eq!(h.uri.query(), Some("x=1"));
        assert_eq!(h.version, Version::HTTP_11);
        assert_eq!(h.body_len, 7);
        assert_eq!(&text[h.len..], "{\"a\":1}");
        assert!(h.keep_alive);
        let raw = h.into_raw(Bytes::from_static(text.as_bytes()));
        assert_eq!(raw.first("x-session-id"), Some(&b"s"[..]));
        assert_eq!(raw.first("HOST"), Some(&b"gw"[..]));
        let names: Vec<&[u8]> = raw.iter().map(|(n, _)| n).collect();
        assert_eq!(names, [&b"Host"[..], b"Content-Length", b"X-Session-ID"]);
        assert!(!raw.has_connection());
    }

    #[test]
    fn a_head_split_anywhere_is_partial_until_its_last_byte() {
        let text = "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n";
        for cut in 0..text.len() {
            assert!(matches!(parse(&text.as_bytes()[..cut]), Parsed::Partial), "cut at {cut}");
        }
        assert_eq!(head(text).len, text.len());
    }

    #[test]
    fn connection_close_and_http10_close_after_the_answer() {
        assert!(!head("GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        assert_eq!(head("GET / HTTP/1.0\r\n\r\n").version, Version::HTTP_10);
    }

    #[test]
    fn what_the_fast_path_does_not_take_goes_to_hyper() {
        assert_eq!(fallback(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Fallback::Unparsed);
        assert_eq!(fallback(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), Fallback::Framing);
        assert_eq!(fallback(b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n"), Fallback::Framing);
        assert_eq!(fallback(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n"), Fallback::Framing);
        assert_eq!(fallback(b"PUT / HTTP/1.1\r\n\r\n"), Fallback::Method);
        assert_eq!(fallback(b"HEAD / HTTP/1.1\r\n\r\n"), Fallback::Method);
        assert_eq!(fallback(b"OPTIONS * HTTP/1.1\r\n\r\n"), Fallback::Method);
        assert_eq!(fallback(b"GET http://x/ HTTP/1.1\r\n\r\n"), Fallback::Target);
        assert_eq!(fallback(b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n"), Fallback::Length);
        assert_eq!(fallback(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), Fallback::Length);
        assert_eq!(fallback(b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n"), Fallback::Length);
        assert_eq!(fallback(b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"), Fallback::Unparsed);
        assert_eq!(fallback(b"\x16\x03\x01\x02\x00"), Fallback::Unparsed);
    }

    #[test]
    fn the_same_content_length_twice_is_one_length() {
        assert_eq!(head("POST / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nab").body_len, 2);
        assert_eq!(head("POST / HTTP/1.1\r\nContent-Length:  12 \r\n\r\n").body_len, 12);
    }

    #[test]
    fn too_many_headers_or_too_long_a_head_goes_to_hyper() {
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(fallback(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()), Fallback::TooLarge);
        let long = format!("GET / HTTP/1.1\r\nX-Long: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(fallback(long.as_bytes()), Fallback::TooLarge);
    }
}
