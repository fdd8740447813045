//! A client's request head as the pipeline takes it ([`ReqHead`]): hyper's parts, or the
//! HTTP/1 fast path's head read in place ([`RawHead`]: its bytes, and where each header lies in
//! them). The fast path's parser (`client/h1/head.rs`) builds a [`RawHead`]; the upstream side
//! copies it, as it came when it can ([`RawHead::plain`]).

use std::ops::Range;

use bytes::Bytes;
use hyper::header::CONNECTION;
use hyper::http::request::Parts;
use hyper::{Method, Uri, Version};

use super::{has_token, Headers, HOP_BY_HOP};

/// A request's head. Both kinds are boxed: the head is moved into each of the pipeline's async
/// functions in turn, and a pointer moves for a fraction of what two hundred bytes cost.
#[derive(Debug)]
pub enum ReqHead {
    /// From hyper's server.
    Hyper(Box<Parts>),
    /// From the HTTP/1 fast path: header values are slices of the bytes read.
    Raw(Box<RawHead>),
}

impl From<Parts> for ReqHead {
    fn from(parts: Parts) -> Self {
        ReqHead::Hyper(Box::new(parts))
    }
}

impl From<RawHead> for ReqHead {
    fn from(head: RawHead) -> Self {
        ReqHead::Raw(Box::new(head))
    }
}

impl ReqHead {
    pub fn method(&self) -> &Method {
        match self {
            ReqHead::Hyper(p) => &p.method,
            ReqHead::Raw(r) => &r.method,
        }
    }

    pub fn path(&self) -> &str {
        match self {
            ReqHead::Hyper(p) => p.uri.path(),
            ReqHead::Raw(r) => r.uri.path(),
        }
    }

    /// The path and query, as the request line upstream carries them.
    pub fn target(&self) -> &str {
        let uri = match self {
            ReqHead::Hyper(p) => &p.uri,
            ReqHead::Raw(r) => &r.uri,
        };
        uri.path_and_query().map_or("/", |p| p.as_str())
    }

    pub fn version(&self) -> Version {
        match self {
            ReqHead::Hyper(p) => p.version,
            ReqHead::Raw(r) => r.version,
        }
    }

    /// Calls `f` with every header, in order (names lowercase for hyper's, as the client
    /// wrote them for the fast path's).
    pub fn each_header(&self, mut f: impl FnMut(&[u8], &[u8])) {
        match self {
            ReqHead::Hyper(p) => p.headers.iter().for_each(|(n, v)| f(n.as_str().as_bytes(), v.as_bytes())),
            ReqHead::Raw(r) => r.iter().for_each(|(n, v)| f(n, v)),
        }
    }

    /// Whether it has a `Connection` header.
    pub fn has_connection(&self) -> bool {
        match self {
            ReqHead::Hyper(p) => p.headers.contains_key(CONNECTION),
            ReqHead::Raw(r) => r.has_connection(),
        }
    }

    /// The `:authority` of an HTTP/2 request (HTTP/1.1 carries it as `Host`).
    pub fn authority(&self) -> Option<&str> {
        match self {
            ReqHead::Hyper(p) => p.uri.authority().map(|a| a.as_str()),
            ReqHead::Raw(_) => None,
        }
    }

    /// Whether header `name` is hop-by-hop: one of [`HOP_BY_HOP`], or named in `Connection`.
    pub fn hop_by_hop(&self, name: &[u8]) -> bool {
        HOP_BY_HOP.iter().any(|h| h.as_bytes().eq_ignore_ascii_case(name))
            || (self.has_connection() && self.find_value("connection", |v| has_token(v, name).then_some(())).is_some())
    }
}

impl Headers for ReqHead {
    fn first(&self, name: &str) -> Option<&[u8]> {
        match self {
            ReqHead::Hyper(p) => p.headers.first(name),
            ReqHead::Raw(r) => r.first(name),
        }
    }

    fn find_value<'h, T>(&'h self, name: &str, f: impl FnMut(&'h [u8]) -> Option<T>) -> Option<T> {
        match self {
            ReqHead::Hyper(p) => p.headers.find_value(name, f),
            ReqHead::Raw(r) => r.find_value(name, f),
        }
    }
}

/// A head that can go upstream as it came: HTTP/1.1, CRLF line ends, no header the front door
/// leaves out or rewrites (hop-by-hop ones, `X-Forwarded-For`), except one `Connection:
/// keep-alive` line (what HTTP/1.1 clients such as the `openai` Python client send), which is
/// cut out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plain {
    /// Whether it has a `Content-Length`.
    pub has_length: bool,
    /// Where the `Connection: keep-alive` line is in the head (from its name to the next line).
    pub cut: Option<Range<u32>>,
}

/// The lines of a [`Plain`] head to send upstream: `first`, then `rest` (the head with the
/// `Connection: keep-alive` line cut out between them, without the blank line that ends it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainLines<'h> {
    pub first: &'h [u8],
    pub rest: &'h [u8],
    pub has_length: bool,
}

/// A request head with its bytes: header values are read in place, never copied.
#[derive(Debug)]
pub struct RawHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    bytes: Bytes,
    layout: Layout,
    len: usize,
}

/// Where a head's headers lie in its bytes, and what its parser noted of them.
#[derive(Debug)]
pub struct Layout {
    /// Each header's name and value, as places in the head's bytes.
    pub headers: Vec<(Range<u32>, Range<u32>)>,
    /// Whether one of them is `Connection`.
    pub connection: bool,
    /// Set when the head can go upstream as it came, with `X-Forwarded-For` added.
    pub plain: Option<Plain>,
    /// Where the first header of each of [`ROUTING`] is among `headers`.
    pub routing: Routing,
}

/// The headers the routing rules look up in most requests (lowercase, as they ask for them).
pub const ROUTING: [&str; 5] = ["x-model-id", "x-required-memory", "x-required-memory-mb", "x-session-id", "cookie"];

/// For each of [`ROUTING`], the index of its first header, or `NONE`: found while the head is
/// parsed, so a lookup is one index rather than a walk over every header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routing([u8; ROUTING.len()]);

impl Default for Routing {
    fn default() -> Self {
        Self([Self::NONE; ROUTING.len()])
    }
}

impl Routing {
    const NONE: u8 = u8::MAX;

    /// Notes header `index` as one of [`ROUTING`] (`which`), unless an earlier one was.
    pub fn set(&mut self, which: usize, index: usize) {
        if self.0[which] == Self::NONE {
            // At most MAX_HEADERS headers, below u8::MAX.
            self.0[which] = index as u8;
        }
    }
}

impl RawHead {
    /// The head of `bytes` (at least its first `len` bytes), laid out as `layout` says.
    pub fn new(method: Method, uri: Uri, version: Version, bytes: Bytes, len: usize, layout: Layout) -> Self {
        Self { method, uri, version, bytes, layout, len }
    }

    /// Every header (name, value) as the client wrote it, in order. Names are httparse's
    /// tokens (ASCII), compared as bytes: no text conversion per lookup.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.layout.headers.iter().map(|(n, v)| {
            (&self.bytes[n.start as usize..n.end as usize], &self.bytes[v.start as usize..v.end as usize])
        })
    }

    /// Whether it has a `Connection` header (which may name more hop-by-hop headers).
    pub fn has_connection(&self) -> bool {
        self.layout.connection
    }

    /// The same head without its [`Plain`] mark (for tests of the path that rewrites a head).
    #[cfg(test)]
    pub fn not_plain(mut self) -> Self {
        self.layout.plain = None;
        self
    }

    /// The request line and header lines as they came (without the blank line that ends the
    /// head and without a `Connection: keep-alive` line), when the head can go upstream so.
    pub fn plain(&self) -> Option<PlainLines<'_>> {
        let p = self.layout.plain.as_ref()?;
        let end = self.len - 2;
        let (first, rest) = match &p.cut {
            Some(cut) => (&self.bytes[..cut.start as usize], &self.bytes[cut.end as usize..end]),
            None => (&self.bytes[..end], &[][..]),
        };
        Some(PlainLines { first, rest, has_length: p.has_length })
    }
}

impl RawHead {
    /// The values of the headers called `name` (any case). A name of another length is passed
    /// over by its place alone, without looking at its bytes or its value's: the routing rules
    /// look up several headers that most requests do not have.
    pub fn values<'h, 'n>(&'h self, name: &'n str) -> impl Iterator<Item = &'h [u8]> + use<'h, 'n> {
        let name = name.as_bytes();
        self.layout.headers.iter().filter_map(move |(n, v)| {
            if n.len() != name.len() || !self.bytes[n.start as usize..n.end as usize].eq_ignore_ascii_case(name) {
                return None;
            }
            Some(&self.bytes[v.start as usize..v.end as usize])
        })
    }
}

impl Headers for RawHead {
    fn first(&self, name: &str) -> Option<&[u8]> {
        let Some(which) = ROUTING.iter().position(|r| *r == name) else { return self.values(name).next() };
        let (_, v) = self.layout.headers.get(usize::from(self.layout.routing.0[which]))?;
        Some(&self.bytes[v.start as usize..v.end as usize])
    }

    fn find_value<'h, T>(&'h self, name: &str, f: impl FnMut(&'h [u8]) -> Option<T>) -> Option<T> {
        self.values(name).find_map(f)
    }
}
