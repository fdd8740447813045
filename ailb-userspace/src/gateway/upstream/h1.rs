//! The front door's own HTTP/1 client (with `gateway.http1_fast_path`): one exchange on an
//! upstream connection it drives itself, the request written as one buffer (head and body
//! together), the response head scanned in place ([`super::scan`]), its body left to
//! [`RawBody`]. What hyper's client would have done for the same exchange (a task per
//! connection, a channel crossed by the request and each body frame) is not needed: the
//! request's own task reads the answer.

use bytes::Buf;
use hyper::header::{HeaderMap, HeaderValue, CONNECTION};
use hyper::{Response, StatusCode, Version};
use tokio::io::AsyncWriteExt;

use super::body::{Framing, RawBody, RawConn};
use super::request::UpRequest;
use super::scan::{scan, Malformed, Scanned, Slot};
use crate::gateway::http::{
    has_token, is_event_stream, kept, valid_value, ApiError, HeadLines, BACKEND_HEADER, CONVERSATION_HEADER,
    MAX_HEADERS, MAX_HEAD_BYTES,
};

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
    /// Not forwarded: another hop-by-hop header ([`crate::gateway::http::HOP_BY_HOP`]), or one
    /// the front door writes itself (`x-ailb-backend`, `x-ailb-conversation`: an upstream's, a
    /// server behind another ailb or one that names itself, would make a second value).
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
mod tests;
