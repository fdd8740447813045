//! The client side of the front door: client connections accepted ([`serve`]), read and
//! answered, by hyper's server (HTTP/1.1 with keep-alive, and HTTP/2 with prior knowledge, h2c,
//! on the same port: [`serve_hyper`]) or, first, by the front door's own HTTP/1 path
//! ([`h1`], `gateway.http1_fast_path`).
//!
//! Both hand each request to a [`Handler`] (the front door's service) as a head
//! ([`ReqHead`]) and a body ([`RequestBody`]), and write the [`Answer`] it gives back: the
//! client side knows nothing of routing, admission or upstreams.

pub mod h1;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::config::gateway::ValidGateway;
use crate::gateway::http::{visible_ascii, Answer, ApiError, ClientIp, Deadline, Headers, ReqHead};

/// What answers the requests of client connections.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request, from its head and its body (hyper's server and the HTTP/1 fast
    /// path both answer through here).
    fn answer(
        self: Arc<Self>,
        head: ReqHead,
        body: RequestBody,
        client: ClientIp,
    ) -> impl Future<Output = Answer> + Send;

    /// Counts a client connection the HTTP/1 fast path handed to hyper's server.
    fn handed_off(&self);
}

/// What the client side reads of `[gateway]`.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `gateway.http1_fast_path`: client connections are read by [`h1`] first.
    pub http1_fast_path: bool,
    /// `gateway.header_timeout`: the longest wait for a request head, and then for its body.
    pub header_timeout: Duration,
    /// `gateway.max_body_bytes`: the largest request body read.
    pub max_body_bytes: u64,
}

impl Settings {
    pub fn of(cfg: &ValidGateway) -> Self {
        Self {
            http1_fast_path: cfg.http1_fast_path,
            header_timeout: cfg.header_timeout,
            max_body_bytes: cfg.max_body_bytes,
        }
    }
}

/// A request's body as the handler gets it.
pub enum RequestBody {
    /// hyper's, read when the handler needs it.
    Hyper(Incoming),
    /// Read whole already (by the HTTP/1 fast path), or why it could not be.
    Read(Result<Bytes, ApiError>),
}

impl RequestBody {
    /// The whole body, at most `max_body_bytes`. hyper's is read now, bounded by `deadline`: a
    /// larger `Content-Length` (in `headers`) is refused before reading, a chunked body is read
    /// up to the limit only, and a body slower than `header_timeout` gets 408 (it holds one of
    /// the `max_concurrent` slots meanwhile).
    pub async fn read(self, headers: &impl Headers, settings: Settings, deadline: Deadline) -> Result<Bytes, ApiError> {
        match self {
            RequestBody::Read(read) => read,
            RequestBody::Hyper(body) => deadline.bound(read_hyper(headers, body, settings)).await,
        }
    }
}

/// hyper's body, whole (see [`RequestBody::read`]).
async fn read_hyper(headers: &impl Headers, body: Incoming, settings: Settings) -> Result<Bytes, ApiError> {
    let max = settings.max_body_bytes;
    let declared = headers.first("content-length").and_then(|v| visible_ascii(v)?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(ApiError::too_large(max));
    }
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let within = settings.header_timeout;
    let Ok(read) = tokio::time::timeout(within, Limited::new(body, limit).collect()).await else {
        return Err(ApiError::body_timeout(within));
    };
    match read {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(max)),
        Err(e) => Err(ApiError::invalid_request("invalid_body", format!("reading the request body: {e}"))),
    }
}

/// Accepts connections on `listener` and serves each with `handler` (HTTP/1.1 with
/// keep-alive, or HTTP/2 when the client's first bytes are its preface; the HTTP/1 fast path
/// first when `settings.http1_fast_path`), until the task is dropped.
pub async fn serve<H: Handler>(handler: Arc<H>, listener: TcpListener, settings: Settings) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and the like: the listener stays; wait a little for fds to free up.
                tracing::warn!(error = %e, "gateway: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let client = ClientIp::new(peer);
            if settings.http1_fast_path {
                h1::serve(handler, stream, peer, client, settings).await;
            } else {
                serve_hyper(handler, TokioIo::new(stream), peer, client, settings).await;
            }
        });
    }
}

/// Serves one client connection with hyper's server (HTTP/1.1, or HTTP/2 when its first
/// bytes are the preface) until it closes.
pub async fn serve_hyper<H, I>(handler: Arc<H>, io: I, peer: SocketAddr, client: ClientIp, settings: Settings)
where
    H: Handler,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (handler, client) = (handler.clone(), client.clone());
        async move {
            let (parts, body) = req.into_parts();
            Ok::<_, Infallible>(handler.answer(parts.into(), RequestBody::Hyper(body), client).await.into_response())
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(settings.header_timeout).keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    if let Err(e) = builder.serve_connection(io, svc).await {
        tracing::debug!(%peer, error = %crate::error_chain(&*e), "gateway: client connection ended");
    }
}
