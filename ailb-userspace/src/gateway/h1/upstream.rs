//! One exchange on an upstream connection the front door drives itself (with
//! `gateway.http1_fast_path`): the request written as one buffer (head and body together),
//! the response head read with `httparse`, its body left to [`RawBody`]. What hyper's client
//! would have done for the same exchange (a task per connection, a channel crossed by the
//! request and each body frame) is not needed: the request's own task reads the answer.

use bytes::Buf;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{Response, StatusCode, Version};
use tokio::io::AsyncWriteExt;

use super::head::{has_token, MAX_HEADERS, MAX_HEAD_BYTES};
use super::upbody::{Framing, RawBody, RawConn};
use crate::gateway::error::ApiError;
use crate::gateway::request::UpRequest;

/// Bodies up to this size are copied behind the head, for one write; larger ones are written
/// after it.
const JOIN_BODY: usize = 64 * 1024;

/// What became of a request on a raw connection.
pub enum Exchanged {
    Answered(Response<RawBody>),
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
    let mut bytes = Vec::with_capacity(512 + if joined { req.body.len() } else { 0 });
    req.encode_head(&mut bytes);
    if joined {
        bytes.extend_from_slice(&req.body);
    }
    if conn.stream.write_all(&bytes).await.is_err() {
        return Ok(Exchanged::NotSent(req));
    }
    if !joined {
        if let Err(e) = conn.stream.write_all(&req.body).await {
            return Err(failure(backend, "sending the request body", &e));
        }
    }
    let (head, framing) = read_head(&mut conn, backend).await?;
    Ok(Exchanged::Answered(head.map(|()| RawBody::new(conn, framing))))
}

fn failure(backend: std::net::SocketAddrV4, what: &str, e: &dyn std::error::Error) -> ApiError {
    ApiError::bad_gateway(format!("upstream {backend}: {what}: {}", crate::error_chain(e)))
}

/// Reads the response head (skipping `100 Continue` and other informational heads) and how
/// its body is framed.
async fn read_head(conn: &mut RawConn, backend: std::net::SocketAddrV4) -> Result<(Response<()>, Framing), ApiError> {
    loop {
        if !conn.buf.is_empty() {
            match parse(&conn.buf) {
                Ok(Some((len, resp, framing))) => {
                    conn.buf.advance(len);
                    if resp.status().is_informational() {
                        continue;
                    }
                    return Ok((resp, framing));
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

type HeadParse = Option<(usize, Response<()>, Framing)>;

/// A whole response head at the start of `buf` (`None`: not whole yet), or what is wrong with it.
fn parse(buf: &[u8]) -> Result<HeadParse, String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut slots);
    let len = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("a malformed response head ({e})")),
    };
    let status = r.code.and_then(|c| StatusCode::from_u16(c).ok()).ok_or("a response head without a valid status")?;
    let version = if r.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
    let mut headers = HeaderMap::with_capacity(r.headers.len());
    let (mut length, mut chunked) = (None, false);
    for h in r.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| format!("a bad header name {:?}", h.name))?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| format!("a bad value of header {}", h.name))?;
        if name == CONTENT_LENGTH {
            let n = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<u64>().ok());
            match (n, length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(prior)) if n == prior => {}
                _ => return Err(format!("a bad content-length {:?}", String::from_utf8_lossy(h.value))),
            }
        } else if name == TRANSFER_ENCODING {
            chunked = has_token(h.value, "chunked");
        }
        headers.append(name, value);
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
    *resp.headers_mut() = headers;
    Ok(Some((len, resp, framing)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_heads_are_framed_as_http_says() {
        let (len, resp, f) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").unwrap().unwrap();
        assert_eq!((len, resp.status(), f), (38, StatusCode::OK, Framing::Length(5)));
        let (_, _, f) = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap().unwrap();
        assert_eq!(f, Framing::Chunked);
        let (_, resp, f) = parse(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!((resp.version(), f), (Version::HTTP_10, Framing::Close));
        let (_, _, f) = parse(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().unwrap();
        assert_eq!(f, Framing::Length(0));
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-").unwrap().is_none());
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").is_err());
        assert!(parse(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    }
}
