//! What the front door answers a request ([`Answer`]): a response, and for a response relayed
//! from the front door's own upstream client, the upstream's end-to-end headers as lines ready
//! to write ([`HeadLines`]), so that the HTTP/1 fast path writes them as they came, without
//! building an `http` header map for them. Hyper's server gets one map of both (the upstream's headers
//! first, then the response's own, the order the fast path writes them in).

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::Response;

use super::Body;

/// An upstream response's end-to-end headers, each a `name: value\r\n` line (names as the
/// upstream wrote them: HTTP/1 names are case-insensitive, and a proxy that keeps them, as
/// nginx and HAProxy do, spends no work per byte on them).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeadLines {
    lines: Vec<u8>,
    /// Its `Content-Length`.
    pub content_length: Option<u64>,
    /// Whether it has a `Date`.
    pub has_date: bool,
    /// Whether its `Content-Type` is an event stream (`text/event-stream`).
    pub event_stream: bool,
}

impl HeadLines {
    pub fn with_capacity(bytes: usize) -> Self {
        Self { lines: Vec::with_capacity(bytes), ..Self::default() }
    }

    /// Appends a header (`name` a token, `value` valid as a header value).
    pub fn push(&mut self, name: impl AsRef<[u8]>, value: &[u8]) {
        self.lines.extend_from_slice(name.as_ref());
        self.lines.extend_from_slice(b": ");
        self.lines.extend_from_slice(value);
        self.lines.extend_from_slice(b"\r\n");
    }

    /// The lines, as written.
    pub fn as_bytes(&self) -> &[u8] {
        &self.lines
    }

    /// Each header's name and value.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines.split(|b| *b == b'\n').filter_map(|line| {
            let line = line.strip_suffix(b"\r")?;
            let at = line.windows(2).position(|w| w == b": ")?;
            Some((&line[..at], &line[at + 2..]))
        })
    }
}

/// The answer to a request.
pub struct Answer {
    pub resp: Response<Body>,
    /// The upstream's headers, before the response's own.
    pub lines: Option<HeadLines>,
}

impl From<Response<Body>> for Answer {
    fn from(resp: Response<Body>) -> Self {
        Self { resp, lines: None }
    }
}

impl Answer {
    /// One response with every header, for hyper's server.
    pub fn into_response(self) -> Response<Body> {
        let Some(lines) = self.lines else { return self.resp };
        let (mut parts, body) = self.resp.into_parts();
        let own = std::mem::take(&mut parts.headers);
        let mut headers = HeaderMap::with_capacity(own.len() + 8);
        for (name, value) in lines.iter() {
            let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_maybe_shared(Bytes::copy_from_slice(value)))
            else {
                continue;
            };
            headers.append(name, value);
        }
        let mut last = None;
        for (name, value) in own {
            if let Some(n) = name {
                last = Some(n);
            }
            if let Some(n) = &last {
                headers.append(n.clone(), value);
            }
        }
        parts.headers = headers;
        Response::from_parts(parts, body)
    }
}

#[cfg(test)]
mod tests;
