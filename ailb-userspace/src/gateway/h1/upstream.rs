//! One exchange on an upstream connection the front door drives itself (with
//! `gateway.http1_fast_path`): the request written as one buffer (head and body together),
//! the response head scanned in place ([`super::scan`]), its body left to [`RawBody`]. What hyper's client
//! would have done for the same exchange (a task per connection, a channel crossed by the
//! request and each body frame) is not needed: the request's own task reads the answer.

use bytes::Buf;
use hyper::header::{HeaderMap, HeaderValue, CONNECTION};
use hyper::{Response, StatusCode, Version};
use tokio::io::AsyncWriteExt;

use super::scan::{scan, Malformed, Scanned, Slot};
use super::upbody::{Framing, RawBody, RawConn};
use crate::gateway::http::{
    has_token, is_event_stream, kept, valid_value, ApiError, HeadLines, BACKEND_HEADER, CONVERSATION_HEADER,
    MAX_HEADERS, MAX_HEAD_BYTES,
};
use crate::gateway::request::UpRequest;

/// Bodies up to this size are copied behind the head, for one write; larger ones are written
/// after it.
const JOIN_BODY: usize = 64 * 1024;

/// What became of a request on a raw connection.
pub enum Exchanged {
    /// The response (its headers only those that describe the connection, `Connection`) and
    /// its end-to-end headers as lines.
    Answered(Response<RawBody>, HeadLines),
    /// The connection failed before it took any of the request (it was closed while idle):
    /// the request comes back for another connection, and the connection is gone.
    NotSent(UpRequest),
}

/// Sends `req` on `conn` and reads the response head. `backend` names the connection in errors.
pub async fn exchange(
    mut conn: RawConn,
    req: UpRequest,
    backend: std::net::SocketAddrV4,
) -> Result<Exchanged, ApiError> {
    let joined = req.body.len() <= JOIN_BODY;
    let mut bytes = std::mem::take(&mut conn.out);
    bytes.clear();
    bytes.reserve(512 + if joined { req.body.len() } else { 0 });
    req.encode_head(&mut bytes);
    if joined {
        bytes.extend_from_slice(&req.body);
    }
    if conn.stream.write_all(&bytes).await.is_err() {
        return Ok(Exchanged::NotSent(req));
    }
    conn.out = kept(bytes);
    if !joined {
        if let Err(e) = conn.stream.write_all(&req.body).await {
            return Err(failure(backend, "sending the request body", &e));
        }
    }
    let (head, framing, lines) = read_head(&mut conn, backend).await?;
    Ok(Exchanged::Answered(head.map(|()| RawBody::new(conn, framing)), lines))
}

fn failure(backend: std::net::SocketAddrV4, what: &str, e: &dyn std::error::Error) -> ApiError {
    ApiError::bad_gateway(format!("upstream {backend}: {what}: {}", crate::error_chain(e)))
}

/// Reads the response head (skipping `100 Continue` and other informational heads) and how
/// its body is framed.
async fn read_head(
    conn: &mut RawConn,
    backend: std::net::SocketAddrV4,
) -> Result<(Response<()>, Framing, HeadLines), ApiError> {
    loop {
        if !conn.buf.is_empty() {
            match parse(&conn.buf) {
                Ok(Some((len, resp, framing, lines))) => {
                    conn.buf.advance(len);
                    if resp.status().is_informational() {
                        continue;
                    }
                    return Ok((resp, framing, lines));
                }
                Ok(None) if conn.buf.len() > MAX_HEAD_BYTES => {
                    return Err(ApiError::bad_gateway(format!(
                        "upstream {backend}: a response head longer than {MAX_HEAD_BYTES} bytes"
                    )))
                }
                Ok(None) => {}
                Err(why) => return Err(ApiError::bad_gateway(format!("upstream {backend}: {why}"))),
            }
        }
        match std::future::poll_fn(|cx| conn.poll_fill(cx)).await {
            Ok(0) => {
                return Err(ApiError::bad_gateway(format!(
                    "upstream {backend}: the connection closed before the response head"
                )))
            }
            Ok(_) => {}
            Err(e) => return Err(failure(backend, "reading the response head", &e)),
        }
    }
}

type HeadParse = Option<(usize, Response<()>, Framing, HeadLines)>;

/// Header slots set up for each response head; a head with more is scanned again into
/// [`MAX_HEADERS`]. Setting up all of those for every head cost more than the rest of its parse.
const FEW_HEADERS: usize = 24;

/// A whole response head at the start of `buf` (`None`: not whole yet), or what is wrong with it.
fn parse(buf: &[u8]) -> Result<HeadParse, String> {
    let mut few: [Slot<'_>; FEW_HEADERS] = [(&[], &[]); FEW_HEADERS];
    match scan(buf, &mut few) {
        Ok(Some(head)) => build(&head, &few[..head.headers]),
        Ok(None) => Ok(None),
        Err(Malformed::TooManyHeaders) => {
            let mut all: Vec<Slot<'_>> = vec![(&[], &[]); MAX_HEADERS];
            match scan(buf, &mut all).map_err(|e| e.to_string())? {
                Some(head) => build(&head, &all[..head.headers]),
                None => Ok(None),
            }
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The response of a scanned head with `headers`.
fn build(head: &Scanned, headers: &[Slot<'_>]) -> Result<HeadParse, String> {
    let status = StatusCode::from_u16(head.code).map_err(|_| Malformed::Status.to_string())?;
    let version = if head.minor == 0 { Version::HTTP_10 } else { Version::HTTP_11 };
    // `Connection` stays in the response's map (whether the upstream keeps the connection open
    // is read from it); it and every other hop-by-hop header stay out of the lines.
    let mut map = HeaderMap::new();
    let mut lines = HeadLines::with_capacity(head.len + 96);
    let connection = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(b"connection"));
    let named = |name: &[u8]| {
        connection && headers.iter().any(|(n, v)| n.eq_ignore_ascii_case(b"connection") && has_token(v, name))
    };
    let (mut length, mut chunked, mut content_type) = (None, false, false);
    for &(name, value) in headers {
        if !valid_value(value) {
            return Err(format!("a bad value of header {}", String::from_utf8_lossy(name)));
        }
        let kind = kind(name);
        match kind {
            Kind::ContentLength => match (decimal(value), length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(prior)) if n == prior => {}
                _ => return Err(format!("a bad content-length {:?}", String::from_utf8_lossy(value))),
            },
            Kind::TransferEncoding => {
                chunked = has_token(value, "chunked");
                continue;
            }
            Kind::Connection => {
                map.append(CONNECTION, HeaderValue::from_bytes(value).map_err(|_| "a bad value of header Connection")?);
                continue;
            }
            Kind::Drop => continue,
            Kind::Date | Kind::ContentType | Kind::Other => {}
        }
        if named(name) {
            continue;
        }
        match kind {
            Kind::ContentLength => lines.content_length = length,
            Kind::Date => lines.has_date = true,
            Kind::ContentType if !content_type => {
                content_type = true;
                lines.event_stream = is_event_stream(value);
            }
            _ => {}
        }
        lines.push(name, value);
    }
    let bodiless = status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let framing = match (bodiless, chunked, length) {
        (true, _, _) => Framing::Length(0),
        (false, true, _) => Framing::Chunked,
        (false, false, Some(n)) => Framing::Length(n),
        (false, false, None) => Framing::Close,
    };
    let mut resp = Response::new(());
    *resp.status_mut() = status;
    *resp.version_mut() = version;
    *resp.headers_mut() = map;
    Ok(Some((head.len, resp, framing, lines)))
}

/// What a response header is to the front door.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    ContentLength,
    /// Hop-by-hop; it frames the body.
    TransferEncoding,
    /// Hop-by-hop; kept in the response's map.
    Connection,
    /// Not forwarded: another hop-by-hop header ([`crate::gateway::http::HOP_BY_HOP`]), or one the gateway writes
    /// itself (`x-ailb-backend`, `x-ailb-conversation`: an upstream's, a server behind another
    /// ailb or one that names itself, would make a second value).
    Drop,
    Date,
    ContentType,
    Other,
}

/// The kind of header `name`, by its length first: most names differ in length from every
/// name looked for, so they are told apart without comparing their bytes.
fn kind(name: &[u8]) -> Kind {
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    match name.len() {
        2 if is("te") => Kind::Drop,
        4 if is("date") => Kind::Date,
        7 if is("trailer") || is("upgrade") => Kind::Drop,
        10 if is("connection") => Kind::Connection,
        10 if is("keep-alive") => Kind::Drop,
        12 if is("content-type") => Kind::ContentType,
        14 if is("content-length") => Kind::ContentLength,
        14 if is(BACKEND_HEADER) => Kind::Drop,
        16 if is("proxy-connection") => Kind::Drop,
        17 if is("transfer-encoding") => Kind::TransferEncoding,
        19 if is("proxy-authorization") || is(CONVERSATION_HEADER) => Kind::Drop,
        _ => Kind::Other,
    }
}

/// A `Content-Length` value: decimal digits only (no sign, no spaces inside), at most `u64`.
fn decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| match b {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(b - b'0')),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::http::HOP_BY_HOP;

    #[test]
    fn response_heads_are_framed_as_http_says() {
        let (len, resp, f, _) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").unwrap().unwrap();
        assert_eq!((len, resp.status(), f), (38, StatusCode::OK, Framing::Length(5)));
        let (_, _, f, _) = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap().unwrap();
        assert_eq!(f, Framing::Chunked);
        let (_, resp, f, _) = parse(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!((resp.version(), f), (Version::HTTP_10, Framing::Close));
        let (_, _, f, _) = parse(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().unwrap();
        assert_eq!(f, Framing::Length(0));
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-").unwrap().is_none());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").is_err());
        assert!(parse(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        for bad in ["+5", "5 5", "", "x", "18446744073709551616"] {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
            assert!(parse(head.as_bytes()).is_err(), "content-length {bad:?}");
        }
        let (_, _, f, _) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n").unwrap().unwrap();
        assert_eq!(f, Framing::Length(u64::MAX));
    }

    #[test]
    fn a_head_with_more_headers_than_the_first_slots_is_scanned_whole() {
        let many = |n: usize| {
            let headers: String = (0..n).map(|i| format!("X-H{i}: {i}\r\n")).collect();
            format!("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n{headers}\r\n")
        };
        let head = many(FEW_HEADERS + 6);
        let (len, _, f, lines) = parse(head.as_bytes()).unwrap().unwrap();
        assert_eq!((len, f), (head.len(), Framing::Length(0)));
        assert_eq!(lines.iter().count(), FEW_HEADERS + 7);
        assert_eq!(lines.iter().last(), Some((&b"X-H29"[..], &b"29"[..])));
        assert!(parse(many(FEW_HEADERS + 6).as_bytes()[..head.len() - 2].as_ref()).unwrap().is_none());
        assert!(parse(many(MAX_HEADERS).as_bytes()).unwrap_err().contains("more than 100 headers"));
    }

    #[test]
    fn end_to_end_headers_become_lines_and_connection_stays_in_the_map() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\nConnection: close, X-Hop\r\n\
                     X-Hop: 1\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nDate: Wed, 02 Dec 2026 01:00:00 GMT\r\n\
                     X-Request-Id: r1\r\n\r\n";
        let (_, resp, f, lines) = parse(head).unwrap().unwrap();
        assert_eq!(f, Framing::Chunked);
        assert_eq!(resp.headers().get_all(CONNECTION).iter().collect::<Vec<_>>(), ["close, X-Hop"]);
        assert_eq!(
            lines.as_bytes(),
            b"Content-Type: Text/Event-Stream; charset=utf-8\r\nDate: Wed, 02 Dec 2026 01:00:00 GMT\r\nX-Request-Id: r1\r\n"
        );
        assert!(lines.event_stream && lines.has_date);
        assert_eq!(lines.content_length, None);
        let (_, resp, _, lines) =
            parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n").unwrap().unwrap();
        assert!(resp.headers().is_empty());
        assert_eq!((lines.content_length, lines.has_date, lines.event_stream), (Some(2), false, false));
        assert!(parse(b"HTTP/1.1 200 OK\r\nX-Bad: a\x7fb\r\n\r\n").is_err());
    }

    #[test]
    fn every_hop_by_hop_header_and_the_gateways_own_are_kept_out_of_the_lines() {
        for name in HOP_BY_HOP.iter().chain(&[BACKEND_HEADER, CONVERSATION_HEADER]) {
            for spelled in [name.to_string(), name.to_ascii_uppercase()] {
                let k = kind(spelled.as_bytes());
                assert!(matches!(k, Kind::Drop | Kind::Connection | Kind::TransferEncoding), "{spelled}: {k:?}");
            }
        }
        let looked_for =
            [("content-length", Kind::ContentLength), ("Date", Kind::Date), ("CONTENT-TYPE", Kind::ContentType)];
        for (name, want) in looked_for {
            assert_eq!(kind(name.as_bytes()), want, "{name}");
        }
        for name in ["x-request-id", "content-lengthx", "dat", "tx", "server", "x-ailb-backends"] {
            assert_eq!(kind(name.as_bytes()), Kind::Other, "{name}");
        }
    }

    #[test]
    fn the_upstreams_own_ailb_headers_are_left_for_the_gateway_to_write() {
        let head =
            b"HTTP/1.1 200 OK\r\nX-Ailb-Backend: 10.0.0.9:80\r\nx-ailb-conversation: 0x1\r\nX-Request-Id: r1\r\n\r\n";
        let (_, _, _, lines) = parse(head).unwrap().unwrap();
        assert_eq!(lines.as_bytes(), b"X-Request-Id: r1\r\n");
    }
}
