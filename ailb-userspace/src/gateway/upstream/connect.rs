//! A tagged upstream connection: a fresh TCP socket, tagged with the request's routing inputs
//! (`ailb_common::client::tag`), connected to the model's VIP, where `cgroup/connect4` picks the
//! backend and rewrites the destination.

use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use ailb_common::client::{self, ClientError, Tags};
use tokio::net::{TcpSocket, TcpStream};

use crate::gateway::http::ApiError;

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

    /// `ENOKEY`: the socket withheld its prefix keys (`Tags::prefix_on_request`) and the
    /// kernel's pick needs them.
    pub fn keys_wanted(&self) -> bool {
        matches!(self, ConnectError::Connect { source, .. } if source.raw_os_error() == Some(libc::ENOKEY))
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
    connect_unless_asked(vip, tags, timeout).await?.ok_or_else(|| {
        ApiError::bad_gateway("upstream: the kernel asked for prefix keys that the connection did not withhold")
    })
}

/// [`connect`], for tags that may withhold the prefix keys (`Tags::prefix_on_request`): `None`
/// when the kernel asks for them (`ENOKEY`, nothing recorded), for the caller to make them
/// and connect again.
pub async fn connect_unless_asked(
    vip: SocketAddrV4,
    tags: &Tags<'_>,
    timeout: Duration,
) -> Result<Option<Upstream>, ApiError> {
    let mut last = None;
    for _attempt in 0..2 {
        match connect_once(vip, tags, timeout).await {
            Ok(u) => return Ok(Some(u)),
            Err(e) if e.keys_wanted() => return Ok(None),
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
