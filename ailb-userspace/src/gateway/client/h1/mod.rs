//! The front door's own HTTP/1 path for client connections (`gateway.http1_fast_path`,
//! default on).
//!
//! Why next to hyper: for the small requests an inference API mostly gets, hyper's general
//! HTTP/1 machinery on the client side (its dispatcher, head parsing into a request, encoding
//! of the answer) was a fifth of the front door's instructions per request. This path reads
//! a connection's request heads in place with `httparse`, reads a `Content-Length` body whole
//! and hands the request to the same handler as hyper's server ([`super::Handler::answer`]:
//! routing, limits, admission, metrics and the access log are one code), then writes the
//! answer itself ([`response`]).
//!
//! What it takes is narrow on purpose ([`head`]): HTTP/1.0 and 1.1 GET and POST with a
//! `Content-Length` body or none. Anything else, at any request boundary (an HTTP/2 preface,
//! a chunked body, an upgrade, `Expect: 100-continue`, a head that does not parse or is
//! too large), hands the connection to hyper's server with the bytes already read put back in
//! front ([`rewind::Rewind`]), so hyper answers it exactly as before.
//!
//! Behaviour kept from hyper's server: keep-alive and pipelined requests answered in order;
//! `Connection: close` and HTTP/1.0 closing after the answer; `gateway.header_timeout` for
//! each head (also while a kept-alive connection waits idle: past it the connection closes
//! without an answer) and then for the body (408); a body over `gateway.max_body_bytes` refused
//! by its `Content-Length` before it is read (413, then the connection closes, after reading
//! off what the client still sends for a moment so the answer is not lost to a reset).

pub mod head;
pub mod response;
pub mod rewind;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{serve_hyper, Handler, RequestBody, Settings};
use crate::gateway::http::{kept, ApiError, ClientIp, ReqHead};
use head::{Head, Parsed};

/// A client connection on the fast path: the socket and what was read of it but not used yet.
pub struct Client {
    pub stream: TcpStream,
    pub buf: BytesMut,
}

/// The next thing on a connection.
enum Next {
    Request(Head),
    /// hyper takes the connection (why, for the debug log).
    Fallback(head::Fallback),
    /// The client closed it (or it failed) between requests.
    Closed,
}

/// The longest the front door reads off a refused body before it closes the connection.
const LINGER: Duration = Duration::from_secs(2);
/// The most bytes it reads off meanwhile.
const LINGER_BYTES: usize = 1 << 20;

/// Serves the client connection `stream` from `peer` until it closes, or until a request the
/// fast path does not take hands it to hyper's server.
pub async fn serve<H: Handler>(
    handler: Arc<H>,
    stream: TcpStream,
    peer: SocketAddr,
    client_ip: ClientIp,
    settings: Settings,
) {
    let header_timeout = settings.header_timeout;
    let mut client = Client { stream, buf: BytesMut::with_capacity(8 * 1024) };
    // One timer for every head of the connection, moved later as each request is answered:
    // a timer moved later stays where it is in the runtime's wheel, where a timer per request
    // would be put in and taken out again each time.
    let mut head_timer = std::pin::pin!(tokio::time::sleep(header_timeout));
    // The answers' write buffer, kept from one answer to the next.
    let mut out = Vec::new();
    loop {
        let next = tokio::select! {
            biased;
            next = next_head(&mut client) => Some(next),
            () = head_timer.as_mut() => None,
        };
        let head = match next {
            Some(Next::Request(h)) => h,
            Some(Next::Closed) => return,
            Some(Next::Fallback(why)) => {
                tracing::debug!(%peer, ?why, "gateway: a request for hyper's server");
                handler.handed_off();
                let io = TokioIo::new(rewind::Rewind::new(client.buf.freeze(), client.stream));
                return serve_hyper(handler, io, peer, client_ip, settings).await;
            }
            None => {
                tracing::debug!(%peer, "gateway: no whole request head within {header_timeout:?}; closing");
                return;
            }
        };
        let bytes = client.buf.split_to(head.len).freeze();
        let (body, unread) = read_body(settings, &mut client, &head).await;
        let keep_alive = head.keep_alive && body.is_ok();
        let version = head.version;
        let head = ReqHead::from(head.into_raw(bytes));
        let resp = handler.clone().answer(head, RequestBody::Read(body), client_ip.clone()).await;
        if !response::send(&mut client, &mut out, resp, version, !keep_alive).await {
            return close(client, unread).await;
        }
        out = kept(out);
        head_timer.as_mut().reset(tokio::time::Instant::now() + header_timeout);
    }
}

/// Reads until the buffer starts with a whole head (or with what hyper must take).
async fn next_head(client: &mut Client) -> Next {
    loop {
        if !client.buf.is_empty() {
            match head::parse(&client.buf) {
                Parsed::Request(h) => return Next::Request(h),
                Parsed::Fallback(why) => return Next::Fallback(why),
                Parsed::Partial => {}
            }
        }
        client.buf.reserve(4096);
        match client.stream.read_buf(&mut client.buf).await {
            Ok(0) | Err(_) => return Next::Closed,
            Ok(_) => {}
        }
    }
}

/// The request's body, whole, and whether the client may still be sending it (it was
/// refused unread). The rules are those of hyper's body ([`RequestBody::read`]): a
/// `Content-Length` over `max_body_bytes` is 413 without reading; a body slower than
/// `header_timeout` is 408.
async fn read_body(settings: Settings, client: &mut Client, head: &Head) -> (Result<Bytes, ApiError>, bool) {
    if head.body_len > settings.max_body_bytes {
        return (Err(ApiError::too_large(settings.max_body_bytes)), true);
    }
    let len = usize::try_from(head.body_len).expect("at most max_body_bytes, which fits in memory");
    if client.buf.len() >= len {
        // It came with its head (a small request mostly does): no wait, so no timer.
        return (Ok(client.buf.split_to(len).freeze()), false);
    }
    let within = settings.header_timeout;
    let fill = async {
        while client.buf.len() < len {
            client.buf.reserve(len - client.buf.len());
            match client.stream.read_buf(&mut client.buf).await {
                Ok(0) => {
                    return Err(format!("the client closed the connection after {} of {len} bytes", client.buf.len()))
                }
                Err(e) => return Err(e.to_string()),
                Ok(_) => {}
            }
        }
        Ok(())
    };
    match tokio::time::timeout(within, fill).await {
        Ok(Ok(())) => (Ok(client.buf.split_to(len).freeze()), false),
        Ok(Err(why)) => {
            (Err(ApiError::invalid_request("invalid_body", format!("reading the request body: {why}"))), false)
        }
        Err(_) => (Err(ApiError::body_timeout(within)), false),
    }
}

/// Ends the connection: a FIN now; when the client may still be sending a body the front door
/// refused, what it sends is read off for a moment first (closing with unread bytes would
/// reset the connection, and the client could lose the answer).
async fn close(mut client: Client, unread: bool) {
    let _ = client.stream.shutdown().await;
    if !unread {
        return;
    }
    let drain = async {
        let mut seen = 0;
        let mut scratch = vec![0u8; 16 * 1024];
        while seen < LINGER_BYTES {
            match client.stream.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}
