//! One request upstream: a FRESH TCP socket, tagged with the request's routing inputs
//! (`ailb_common::client::tag`), connected to the model's VIP (where `cgroup/connect4` picks
//! the backend and rewrites the destination), one HTTP/1.1 exchange on it, and a response
//! body relayed frame by frame (or a connection of the [`Pool`] with the same routing
//! inputs, see [`super::pool`]). Dropping the relay (the client went away) closes the
//! upstream connection, so the model server frees the request's slot.

use std::future::Future;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ailb_common::client::{self, ClientError, Tags};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;
use tokio::time::Sleep;

use super::h1::upbody::{RawBody, RawConn};
use super::h1::upstream::{self, Exchanged};
use super::http::{ApiError, BoxError, Deadline, HeadLines};
use super::log::RequestLog;
use super::pool::{Conn, Link, Pool, PoolKey};
use super::request::UpRequest;

/// A failed upstream connect.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("creating the upstream socket")]
    Socket {
        #[source]
        source: io::Error,
    },
    #[error("tagging the upstream socket for {vip}")]
    Tag {
        vip: SocketAddrV4,
        #[source]
        source: ClientError,
    },
    #[error("connecting to {vip}")]
    Connect {
        vip: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error("connecting to {vip}: no answer within {timeout:?}")]
    Timeout { vip: SocketAddrV4, timeout: Duration },
    #[error("the peer of the connection to {vip} is not IPv4: {peer:?}")]
    Peer { vip: SocketAddrV4, peer: io::Result<SocketAddr> },
}

impl ConnectError {
    /// `ECONNREFUSED`: ailb found no live backend of the model that fits the request (or the
    /// address refuses connections).
    pub fn is_refused(&self) -> bool {
        matches!(self, ConnectError::Connect { source, .. } if source.kind() == io::ErrorKind::ConnectionRefused)
    }
}

/// One connected upstream socket and the backend the kernel chose (its peer).
pub struct Upstream {
    pub stream: TcpStream,
    pub backend: SocketAddrV4,
}

async fn connect_once(vip: SocketAddrV4, tags: &Tags<'_>, timeout: Duration) -> Result<Upstream, ConnectError> {
    let socket = TcpSocket::new_v4().map_err(|source| ConnectError::Socket { source })?;
    client::tag(&socket, tags).map_err(|source| ConnectError::Tag { vip, source })?;
    let stream = match tokio::time::timeout(timeout, socket.connect(vip.into())).await {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => return Err(ConnectError::Connect { vip, source }),
        Err(_) => return Err(ConnectError::Timeout { vip, timeout }),
    };
    let backend = match stream.peer_addr() {
        Ok(SocketAddr::V4(b)) => b,
        other => return Err(ConnectError::Peer { vip, peer: other }),
    };
    let _ = stream.set_nodelay(true);
    Ok(Upstream { stream, backend })
}

/// Connects to `vip` with `tags`: `ECONNREFUSED` is 503 at once (no backend can take the
/// request now; the client retries after a second); any other failure is tried once more on
/// a fresh socket, then 502.
pub async fn connect(vip: SocketAddrV4, tags: &Tags<'_>, timeout: Duration) -> Result<Upstream, ApiError> {
    let mut last = None;
    for _attempt in 0..2 {
        match connect_once(vip, tags, timeout).await {
            Ok(u) => return Ok(u),
            Err(e) if e.is_refused() => {
                return Err(ApiError::unavailable(format!(
                    "no live backend can take this request now ({}): retry later",
                    crate::error_chain(&e)
                )))
            }
            Err(e) => {
                tracing::debug!(error = %crate::error_chain(&e), "upstream connect failed");
                last = Some(e);
            }
        }
    }
    let e = last.expect("two attempts failed");
    Err(ApiError::bad_gateway(format!("upstream: {} (tried twice)", crate::error_chain(&e))))
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

/// A connection on `up` that the front door drives itself ([`super::h1::upstream`]), with the
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
                return match upstream::exchange(r, req, backend).await? {
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

/// An upstream response body: hyper's client's, or read by the front door itself.
pub enum UpBody {
    Hyper(Incoming),
    Raw(RawBody),
}

impl UpBody {
    /// The whole body when the front door's own client read all of it with the head
    /// ([`RawBody::take_whole`]).
    pub fn take_whole(&mut self) -> Option<Bytes> {
        match self {
            UpBody::Hyper(_) => None,
            UpBody::Raw(b) => b.take_whole(),
        }
    }

    /// The connection a whole raw body read from, to keep.
    fn take_raw(&mut self) -> Option<RawConn> {
        match self {
            UpBody::Hyper(_) => None,
            UpBody::Raw(b) => b.take_conn(),
        }
    }
}

impl HttpBody for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpBody::Raw(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Hyper(b) => b.is_end_stream(),
            UpBody::Raw(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Hyper(b) => b.size_hint(),
            UpBody::Raw(b) => b.size_hint(),
        }
    }
}

/// Where a connection goes when its response has been relayed whole: back to the pool under
/// its routing inputs.
pub struct Reuse {
    pub pool: Arc<Pool>,
    pub key: PoolKey,
}

/// Why a relayed body stopped early.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("upstream sent nothing for {0:?} (gateway.idle_timeout)")]
    Idle(Duration),
    #[error("the request ran past {0:?} (gateway.total_timeout)")]
    Total(Duration),
}

/// The upstream's response body, forwarded frame by frame as it arrives; it records the
/// time to first byte, and on its end (or drop) the request's duration and access log.
///
/// When an event stream (`text/event-stream`) breaks off (the upstream reset, or a timeout),
/// the client gets one last event, `data: {"error": {...}}` in OpenAI's error shape, and a
/// clean end of the stream: an SSE client reads that as the answer's end with a reason, where a
/// cut connection would look like a network fault or, to some clients, like a hang. Other
/// bodies end with an error, which aborts the response (the client sees it incomplete).
pub struct Relay {
    inner: UpBody,
    sse: bool,
    done: bool,
    idle: Duration,
    /// When the last frame came (or the body first had to wait): the idle timeout counts
    /// from it.
    last_frame: Option<tokio::time::Instant>,
    /// The request's end (`gateway.total_timeout`), as every earlier wait of it had.
    deadline: Deadline,
    /// The timers, armed only when the body has to wait: a response that is there whole never
    /// touches the timer wheel.
    idle_timer: Option<Pin<Box<Sleep>>>,
    total_timer: Option<Pin<Box<Sleep>>>,
    log: Option<RequestLog>,
    started: Instant,
    /// The connection: closed on drop, or back to the pool after a whole response.
    conn: Option<Box<Conn>>,
    reuse: Option<Reuse>,
    held: Held,
}

/// What a request holds: its `max_concurrent` slot until its answer is relayed whole (handed
/// to the client's connection, for an answer that came whole with its head) or dropped, and its
/// share of the admission's memory until the upstream's answer is whole.
pub struct Held {
    pub _permit: OwnedSemaphorePermit,
    pub ticket: Option<super::fleet_memory::Ticket>,
}

impl Relay {
    #[expect(
        clippy::too_many_arguments,
        reason = "each is a separate part of one relayed request; a struct would only rename them"
    )]
    pub fn new(
        inner: UpBody,
        sse: bool,
        conn: Box<Conn>,
        reuse: Option<Reuse>,
        held: Held,
        log: RequestLog,
        idle: Duration,
        deadline: Deadline,
    ) -> Self {
        Self {
            inner,
            sse,
            done: false,
            idle,
            last_frame: None,
            deadline,
            idle_timer: None,
            total_timer: None,
            started: log.started(),
            log: Some(log),
            conn: Some(conn),
            reuse,
            held,
        }
    }

    fn finish(&mut self, outcome: &'static str) {
        if let Some(log) = self.log.take() {
            log.finish(outcome);
        }
    }

    /// The whole response came (or the upstream failed): the request's memory is given back
    /// to the admission, and the connection goes back to the pool for the next request with
    /// the same routing inputs, or is shut down now. Both happen before the last frame
    /// reaches the client, whose next request must not wait behind this one.
    /// `now` gives the time (read only when the connection goes back to the pool).
    fn release(&mut self, now: impl FnOnce() -> Instant) {
        drop(self.held.ticket.take());
        let Some(conn) = self.conn.take() else { return };
        give_back(&mut self.inner, conn, self.reuse.take(), now);
    }

    /// The body broke off: an event stream ends with an error event, any other body with `e`.
    fn fail(&mut self, outcome: &'static str, e: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.reuse = None;
        self.release(Instant::now);
        self.finish(outcome);
        if !self.sse {
            return Poll::Ready(Some(Err(e)));
        }
        self.done = true;
        let msg = format!("the upstream stream broke off: {}", crate::error_chain(&*e));
        let event = format!("data: {}\n\n", ApiError::bad_gateway(msg).body());
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }
}

/// An upstream's whole answer: its connection goes back to the pool for the next request with
/// the same routing inputs (`reuse`), or is shut down now. `now` gives the time (read only when
/// the connection goes back to the pool).
fn give_back(body: &mut UpBody, mut conn: Box<Conn>, reuse: Option<Reuse>, now: impl FnOnce() -> Instant) {
    if let Link::Raw(raw @ None) = &mut conn.link {
        *raw = body.take_raw();
    }
    match reuse {
        Some(Reuse { pool, key }) => pool.put_at(key, conn, now()),
        None => conn.done(),
    }
}

/// The end of a request whose answer came whole with its head ([`UpBody::take_whole`]), which
/// then needs no [`Relay`]: what the relay does at its last frame, done now. The connection goes
/// back (or is shut down), the admission's memory and the request's `max_concurrent` slot are
/// given back, and the request is counted and logged, with its first byte now when `data` (the
/// body) has one.
pub fn whole(mut body: UpBody, data: &Bytes, conn: Box<Conn>, reuse: Option<Reuse>, held: Held, mut log: RequestLog) {
    let now = Instant::now();
    drop(held);
    give_back(&mut body, conn, reuse, || now);
    if !data.is_empty() {
        log.first_byte(now.saturating_duration_since(log.started()));
    }
    log.finish("ok");
}

impl HttpBody for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // One clock read per poll serves the deadline, the idle timeout, the time to first
        // byte and the pool (a frame that comes is read within this poll, microseconds later).
        let now = tokio::time::Instant::now();
        if now >= this.deadline.at {
            return this.fail("total timeout", Box::new(RelayError::Total(this.deadline.total)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.last_frame = Some(now);
                if let (Some(log), Some(data)) = (this.log.as_mut(), frame.data_ref()) {
                    if !data.is_empty() {
                        log.first_byte(now.into_std().saturating_duration_since(this.started));
                    }
                }
                if this.inner.is_end_stream() {
                    // The upstream's answer is whole: its connection stops counting in the
                    // kernel BEFORE this last frame reaches the client, whose next request
                    // must not see this one still in flight.
                    this.release(|| now.into_std());
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => this.fail("upstream error", e),
            Poll::Ready(None) => {
                this.finish("ok");
                this.release(|| now.into_std());
                Poll::Ready(None)
            }
            Poll::Pending => {
                let deadline = this.deadline.at;
                let total = this.total_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if total.as_mut().poll(cx).is_ready() {
                    return this.fail("total timeout", Box::new(RelayError::Total(this.deadline.total)));
                }
                let deadline = *this.last_frame.get_or_insert(now) + this.idle;
                let idle = this.idle_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if idle.deadline() != deadline {
                    idle.as_mut().reset(deadline);
                }
                if idle.as_mut().poll(cx).is_ready() {
                    return this.fail("idle timeout", Box::new(RelayError::Idle(this.idle)));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Dropped before its end: the client went away (or its connection failed); an
        // empty body may be dropped unpolled.
        let whole = !self.done && self.inner.is_end_stream();
        let outcome = if self.done || whole { "ok" } else { "client gone" };
        self.finish(outcome);
        if whole {
            self.release(Instant::now);
        }
    }
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
