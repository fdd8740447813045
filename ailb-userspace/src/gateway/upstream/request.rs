//! The request the front door sends upstream for a client's ([`UpRequest`]): the client's
//! method, target and end-to-end headers, its address appended to `X-Forwarded-For`, `Host`
//! from an HTTP/2 client's `:authority`, and the body.

use std::io::Write as _;

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, HOST};
use hyper::Request;

use crate::gateway::http::{ClientIp, Headers, ReqHead, FORWARDED_FOR};

/// The request sent upstream for a client's request.
pub struct UpRequest {
    pub head: ReqHead,
    pub body: Bytes,
    pub client: ClientIp,
}

impl UpRequest {
    /// The `X-Forwarded-For` value: the client's first one with its address appended, or its
    /// address alone (the model server's logs then name the client rather than the front door).
    fn forwarded_for(&self, mut f: impl FnMut(&[u8])) {
        let ip = self.client.value().as_bytes();
        // A client's `X-Forwarded-For` that its `Connection` names is hop-by-hop: not kept.
        let prior = if self.head.hop_by_hop(FORWARDED_FOR.as_bytes()) { None } else { self.head.first(FORWARDED_FOR) };
        match prior {
            Some(prior) if !prior.trim_ascii().is_empty() => {
                let mut v = Vec::with_capacity(prior.len() + 2 + ip.len());
                v.extend_from_slice(prior);
                v.extend_from_slice(b", ");
                v.extend_from_slice(ip);
                f(&v)
            }
            _ => f(ip),
        }
    }

    /// Appends the request head as HTTP/1.1 to `out`: the request line, every end-to-end
    /// header in order (names as the client wrote them; `X-Forwarded-For` where the client's
    /// first one was, else last), `Host` from `:authority` when there is none, and a
    /// `Content-Length` when the client sent none.
    pub fn encode_head(&self, out: &mut Vec<u8>) {
        if let ReqHead::Raw(raw) = &self.head {
            if let Some(plain) = raw.plain() {
                // Nothing to rewrite: the lines go as they came, in one copy (two when a
                // `Connection: keep-alive` line is cut out).
                out.extend_from_slice(plain.first);
                out.extend_from_slice(plain.rest);
                header(out, FORWARDED_FOR.as_bytes(), self.client.value().as_bytes());
                if !plain.has_length {
                    let _ = write!(out, "content-length: {}\r\n", self.body.len());
                }
                out.extend_from_slice(b"\r\n");
                return;
            }
        }
        out.extend_from_slice(self.head.method().as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.head.target().as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        let (mut xff, mut host, mut length) = (false, false, false);
        self.head.each_header(|name, value| {
            if name.eq_ignore_ascii_case(FORWARDED_FOR.as_bytes()) {
                if !xff {
                    xff = true;
                    self.forwarded_for(|v| header(out, name, v));
                }
                return;
            }
            if self.head.hop_by_hop(name) {
                return;
            }
            host |= name.eq_ignore_ascii_case(b"host");
            length |= name.eq_ignore_ascii_case(b"content-length");
            header(out, name, value);
        });
        if !xff {
            self.forwarded_for(|v| header(out, FORWARDED_FOR.as_bytes(), v));
        }
        if let Some(a) = self.head.authority().filter(|_| !host) {
            header(out, b"host", a.as_bytes());
        }
        if !length {
            // Writing to a Vec cannot fail.
            let _ = write!(out, "content-length: {}\r\n", self.body.len());
        }
        out.extend_from_slice(b"\r\n");
    }

    /// The same request for hyper's client (the same headers as [`UpRequest::encode_head`]).
    pub fn to_hyper(&self) -> Request<Bytes> {
        let mut headers = HeaderMap::new();
        let mut xff = false;
        self.head.each_header(|name, value| {
            let name = if name.eq_ignore_ascii_case(FORWARDED_FOR.as_bytes()) {
                if xff {
                    return;
                }
                xff = true;
                self.forwarded_for(|v| {
                    headers.append(HeaderName::from_static(FORWARDED_FOR), value_of(v));
                });
                return;
            } else if self.head.hop_by_hop(name) {
                return;
            } else {
                HeaderName::from_bytes(name).expect("a request's header names are valid")
            };
            headers.append(name, value_of(value));
        });
        if !xff {
            self.forwarded_for(|v| {
                headers.append(HeaderName::from_static(FORWARDED_FOR), value_of(v));
            });
        }
        if let Some(a) = self.head.authority().filter(|_| !headers.contains_key(HOST)) {
            headers.insert(HOST, value_of(a.as_bytes()));
        }
        let mut req = Request::new(self.body.clone());
        *req.method_mut() = self.head.method().clone();
        *req.uri_mut() = self.head.target().parse().expect("a request's path and query are a valid target");
        *req.headers_mut() = headers;
        req
    }
}

fn value_of(v: &[u8]) -> HeaderValue {
    HeaderValue::from_bytes(v).expect("a request's header values (and an address appended) are valid")
}

fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests;
