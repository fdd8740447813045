//! One HTTP/1.1 connection to a backend ([`Conn`]), driven by the front door's own client
//! ([`super::h1`]) or by hyper's, and one request sent on it ([`send`]).

use std::net::SocketAddrV4;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::body::{RawConn, UpBody};
use super::connect::Upstream;
use super::h1::{self, Exchanged};
use super::request::UpRequest;
use crate::gateway::http::{ApiError, Deadline, HeadLines};

/// How an upstream connection is driven.
pub enum Link {
    /// By hyper's client: a sender, and the connection's own task.
    Hyper { sender: SendRequest<Full<Bytes>>, driver: AbortOnDrop },
    /// By the front door itself (`gateway.http1_fast_path`); `None` while a response body
    /// holds the socket, or after one that did not end cleanly.
    Raw(Option<RawConn>),
}

/// One open HTTP/1.1 connection to a backend. It is kept boxed from its opening to its end: each
/// request moves it out of the pool, through the pipeline's async functions and back, and a box
/// moves as one pointer.
pub struct Conn {
    pub link: Link,
    pub backend: SocketAddrV4,
    /// `backend` as the value of the response's `x-ailb-backend` header, formatted once.
    pub backend_value: HeaderValue,
    /// When it connected (when the kernel made its pick).
    pub born: Instant,
    /// A duplicate of the socket, to mark it idle and busy, and to shut it down at once.
    pub fd: Option<OwnedFd>,
}

impl Conn {
    /// Whether it can carry another request (its backend has not closed it).
    pub fn is_open(&self) -> bool {
        match &self.link {
            Link::Hyper { sender, .. } => !sender.is_closed(),
            Link::Raw(raw) => raw.as_ref().is_some_and(RawConn::is_open),
        }
    }

    /// Ends the connection now: a `shutdown` on the socket sends the FIN in this call, so the
    /// kernel stops counting it in flight before anything else happens (dropping the
    /// connection's task would close it only when the runtime gets to it).
    pub fn done(self) {
        if let Some(fd) = &self.fd {
            let _ = socket2::SockRef::from(fd).shutdown(std::net::Shutdown::Both);
        }
    }

    /// Tells the kernel this connection waits idle (`true`) or carries a request (`false`).
    pub(super) fn mark_idle(&self, idle: bool) {
        let Some(fd) = &self.fd else { return };
        if let Err(e) = ailb_common::client::mark_idle(fd, idle) {
            tracing::debug!(backend = %self.backend, error = %crate::error_chain(&e), "marking an upstream connection idle");
        }
    }
}

/// Aborts the HTTP connection task (closing the upstream socket) when dropped.
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Opens an HTTP/1.1 connection on `up` (its task lives as long as the returned
/// [`Conn`]'s driver). The [`Conn`] holds a duplicate of the socket, to end its count in the
/// kernel the moment its response ends ([`Conn::done`]) or to mark it idle in the pool.
pub async fn open(up: Upstream) -> Result<Box<Conn>, ApiError> {
    let backend = up.backend;
    let (born, fd) = (Instant::now(), dup(&up.stream));
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(up.stream))
        .await
        .map_err(|e| upstream_failure(backend, "handshake", &e))?;
    let driver = AbortOnDrop(tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(%backend, error = %crate::error_chain(&e), "upstream connection ended");
        }
    }));
    let backend_value = HeaderValue::try_from(backend.to_string()).expect("an address is a valid header value");
    Ok(Box::new(Conn { link: Link::Hyper { sender, driver }, backend, backend_value, born, fd }))
}

/// A connection on `up` that the front door drives itself ([`super::h1`]), with the
/// same duplicate of the socket as [`open`]'s.
pub fn open_raw(up: Upstream) -> Box<Conn> {
    let (born, fd) = (Instant::now(), dup(&up.stream));
    let backend_value = HeaderValue::try_from(up.backend.to_string()).expect("an address is a valid header value");
    Box::new(Conn { link: Link::Raw(Some(RawConn::new(up.stream))), backend: up.backend, backend_value, born, fd })
}

/// A duplicate of the socket (without it the connection still works; its count only ends
/// when it closes, and it is never marked idle).
fn dup(stream: &TcpStream) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    stream.as_fd().try_clone_to_owned().inspect_err(|e| tracing::debug!(error = %e, "dup of an upstream socket")).ok()
}

fn upstream_failure(backend: SocketAddrV4, what: &str, e: &dyn std::error::Error) -> ApiError {
    ApiError::bad_gateway(format!("upstream {backend}: {what}: {}", crate::error_chain(e)))
}

/// What became of a request sent on a connection.
pub enum Sent {
    /// The response head (and its end-to-end headers as lines when the front door's own
    /// client read it: the response's map then holds only `Connection`).
    Answered(hyper::Response<UpBody>, Option<HeadLines>),
    /// The connection could not take the request (it closed while idle, for one): nothing was
    /// sent, and the request comes back for another connection.
    NotSent(UpRequest),
}

/// Sends `req` on `conn` and waits at most `idle` for the response head (and never past
/// `deadline`).
pub async fn send(conn: &mut Conn, req: UpRequest, idle: Duration, deadline: Deadline) -> Result<Sent, ApiError> {
    let backend = conn.backend;
    let work = async {
        let sender = match &mut conn.link {
            Link::Hyper { sender, .. } => sender,
            Link::Raw(raw) => {
                let Some(r) = raw.take() else { return Ok(Sent::NotSent(req)) };
                return match h1::exchange(r, req, backend).await? {
                    Exchanged::Answered(resp, lines) => Ok(Sent::Answered(resp.map(UpBody::Raw), Some(lines))),
                    Exchanged::NotSent(req) => Ok(Sent::NotSent(req)),
                };
            }
        };
        if sender.ready().await.is_err() {
            return Ok(Sent::NotSent(req));
        }
        match sender.try_send_request(req.to_hyper().map(Full::new)).await {
            Ok(resp) => Ok(Sent::Answered(resp.map(UpBody::Hyper), None)),
            Err(mut e) => match e.take_message() {
                Some(_) => Ok(Sent::NotSent(req)),
                None => Err(upstream_failure(backend, "sending the request", e.error())),
            },
        }
    };
    let (until, total) = deadline.within(tokio::time::Instant::now(), idle);
    // Pinned where it is: the timeout then holds a pointer, where taking the exchange by value
    // would move its hundreds of bytes twice more per request.
    let work = std::pin::pin!(work);
    match tokio::time::timeout_at(until, work).await {
        Ok(r) => r,
        Err(_) if total => Err(deadline.error()),
        Err(_) => Err(ApiError::timeout(format!("upstream {backend}: no response head within {idle:?}"))),
    }
}
