//! The HTTP types both sides of the front door share, at the bottom of `gateway/`: nothing here
//! imports the client side, the upstream side, the control side or the pipeline, which all
//! import it.
//!
//! - a request as the pipeline takes it ([`request::ReqHead`]: hyper's parts, or the HTTP/1
//!   fast path's head read in place) and its answer ([`answer::Answer`]);
//! - the body of every answer ([`Body`], [`full`]) and the OpenAI-shaped errors
//!   ([`error::ApiError`]);
//! - a request's deadline ([`deadline::Deadline`], `gateway.total_timeout`);
//! - the header names, limits and byte checks that both HTTP/1 codes (the client's fast path
//!   and the upstream client) use.

pub mod answer;
pub mod deadline;
pub mod error;
pub mod request;

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::header::{HeaderMap, HeaderValue};

pub use answer::{Answer, HeadLines};
pub use deadline::Deadline;
pub use error::{ApiError, ErrorShape};
pub use request::{RawHead, ReqHead};

/// The error of a body: hyper's, the relay's or the upstream's own client's.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of every answer.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body that is there whole.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed_unsync()
}

/// `x-ailb-backend`: the backend the kernel chose (the upstream socket's peer).
pub const BACKEND_HEADER: &str = "x-ailb-backend";
/// `x-ailb-conversation`: the kernel's hash of the conversation key, as `ailb hash` prints it.
pub const CONVERSATION_HEADER: &str = "x-ailb-conversation";
/// `x-forwarded-for`: the client's address is appended to it upstream.
pub const FORWARDED_FOR: &str = "x-forwarded-for";

/// Hop-by-hop headers: they describe one connection and are never forwarded.
pub const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
];

/// Headers a head may have on the front door's own HTTP/1 paths (hyper's own limit is 100: a
/// request head with more goes to hyper, which answers 431; a response head with more is 502).
pub const MAX_HEADERS: usize = 100;
/// Bytes of an unfinished head after which the front door's own HTTP/1 paths stop waiting for
/// its end (a request's goes to hyper, which reads on to its own limit and answers 431).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A client's IP address as `X-Forwarded-For` carries it, formatted once per connection.
#[derive(Clone, Debug)]
pub struct ClientIp(HeaderValue);

impl ClientIp {
    pub fn new(peer: SocketAddr) -> Self {
        Self(HeaderValue::try_from(peer.ip().to_string()).expect("an address is a valid header value"))
    }

    /// The address as a header value.
    pub fn value(&self) -> &HeaderValue {
        &self.0
    }

    /// The address (read back from its text: only a tenant matched by address needs it).
    pub fn addr(&self) -> Option<std::net::IpAddr> {
        self.0.to_str().ok()?.parse().ok()
    }
}

/// A request's headers as the routing rules read them: hyper's map, or the HTTP/1 fast path's
/// head (values as slices of the bytes read). Names are given in lowercase; a head's names
/// match in any case.
pub trait Headers {
    /// The first value of `name`.
    fn first(&self, name: &str) -> Option<&[u8]>;
    /// Calls `f` with every value of `name`, in order, until it returns `Some`.
    fn find_value<'h, T>(&'h self, name: &str, f: impl FnMut(&'h [u8]) -> Option<T>) -> Option<T>;
}

impl Headers for HeaderMap {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(|v| v.as_bytes())
    }

    fn find_value<'h, T>(&'h self, name: &str, f: impl FnMut(&'h [u8]) -> Option<T>) -> Option<T> {
        self.get_all(name).iter().map(|v| v.as_bytes()).find_map(f)
    }
}

/// A header value as text when it is visible ASCII (tabs allowed), as `HeaderValue::to_str` takes it.
pub fn visible_ascii(v: &[u8]) -> Option<&str> {
    if v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        std::str::from_utf8(v).ok()
    } else {
        None
    }
}

/// Whether a `Content-Type` is an event stream (`text/event-stream`, any case, parameters allowed).
pub fn is_event_stream(v: &[u8]) -> bool {
    const SSE: &[u8] = b"text/event-stream";
    visible_ascii(v)
        .is_some_and(|v| v.trim_start().as_bytes().get(..SSE.len()).is_some_and(|p| p.eq_ignore_ascii_case(SSE)))
}

/// Whether the comma-separated header value `v` holds `token` (any case).
pub fn has_token(v: &[u8], token: impl AsRef<[u8]>) -> bool {
    let token = token.as_ref();
    v.split(|b| *b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Whether `http` takes `v` as a header value (visible ASCII, tabs, spaces and obs-text).
///
/// Eight bytes at a time: a word with no byte below 0x20 and none equal to 0x7f is valid as a
/// whole; only a word with one of those (a tab, mostly) is looked at byte by byte. Every value
/// of every request and response is checked, and byte by byte this was a tenth of a response
/// head's parse.
pub fn valid_value(v: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    let byte_ok = |b: &u8| *b == b'\t' || (*b >= 0x20 && *b != 0x7f);
    let mut words = v.chunks_exact(8);
    for w in &mut words {
        let x = u64::from_ne_bytes(w.try_into().expect("chunks of 8 bytes"));
        let del = x ^ (ONES * 0x7f);
        // A high bit set here when a byte is below 0x20 (`x - 0x20` borrows, and its own high
        // bit is clear) or is 0x7f (that byte of `del` is zero): never missed, and a word it
        // flags by a borrow alone is settled byte by byte.
        let suspect = ((x.wrapping_sub(ONES * 0x20) & !x) | (del.wrapping_sub(ONES) & !del)) & HIGH;
        if suspect != 0 && !w.iter().all(byte_ok) {
            return false;
        }
    }
    words.remainder().iter().all(byte_ok)
}

/// The most capacity a connection's write buffer (a client's or an upstream's) keeps from one
/// message to the next; a larger one (a large body went out whole) is given back.
const KEEP_OUT: usize = 8 * 1024;

/// A connection's write buffer to keep for its next message: `out` itself, or a new one in
/// place of one that grew past [`KEEP_OUT`].
pub fn kept(out: Vec<u8>) -> Vec<u8> {
    if out.capacity() <= KEEP_OUT {
        out
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests;
