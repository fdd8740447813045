//! A response body read straight off a kept upstream connection ([`RawConn`]), without
//! hyper's client: framed by `Content-Length`, by chunks (decoded here, so an event stream's
//! events go on as they arrive), or by the end of the connection. Each read becomes one
//! frame at once. The connection comes back ([`RawBody::take_conn`]) only once the body ended
//! where its framing says, with nothing unread after it; a body cut short is an error (the
//! relay then ends an event stream with an error event), and dropping the body closes the
//! connection (the client went away: the model server frees the request's slot).
//!
//! [`UpBody`] is the response body of either upstream client: this one, or hyper's.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::net::TcpStream;

use crate::gateway::http::BoxError;

/// Bytes read from the socket at a time.
const READ_SIZE: usize = 16 * 1024;
/// The longest chunk-size or trailer line taken.
const MAX_LINE: usize = 4096;

/// An upstream connection driven by the front door itself: the socket, what was read of it
/// but not used yet, and the buffer its requests are written from (kept from one request to
/// the next, so a request costs no allocation for it).
pub struct RawConn {
    pub stream: TcpStream,
    pub buf: BytesMut,
    pub out: Vec<u8>,
}

impl RawConn {
    pub fn new(stream: TcpStream) -> Self {
        Self { stream, buf: BytesMut::with_capacity(READ_SIZE), out: Vec::new() }
    }

    /// Whether it can carry another request: nothing unread, and no end (or data) from the
    /// backend since (a readiness the runtime has not seen costs no system call).
    pub fn is_open(&self) -> bool {
        let mut probe = [0u8; 1];
        self.buf.is_empty()
            && matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Reads more into the buffer; `Ok(0)` at the end of the connection.
    ///
    /// Through the stream's `AsyncRead`: a read that fills less than the room given clears the
    /// socket's readiness, so the next [`RawConn::is_open`] costs no system call (a
    /// `try_read` would leave it set, and that check would find `EAGAIN` in a `recvfrom`).
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.buf.reserve(READ_SIZE);
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
    }
}

/// How a response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// Until the backend closes the connection (which then cannot be kept).
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `n` bytes of the body (or of the current chunk) to go.
    Data(u64),
    /// The line with the next chunk's size.
    ChunkSize,
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// Trailer lines, up to an empty one.
    Trailers,
    /// Until the end of the connection.
    ToClose,
    Done,
}

/// Why a relayed upstream body broke off.
#[derive(Debug, thiserror::Error)]
pub enum UpBodyError {
    #[error("the upstream closed the connection {0} bytes before the end of the response body")]
    Short(u64),
    #[error("the upstream closed the connection inside a chunked response body")]
    ShortChunked,
    #[error("the upstream sent a malformed chunk size line")]
    BadChunk,
    #[error("reading the upstream response body")]
    Read {
        #[source]
        source: io::Error,
    },
}

/// The body of one upstream response.
pub struct RawBody {
    conn: Option<RawConn>,
    state: State,
    chunked: bool,
}

impl RawBody {
    pub fn new(conn: RawConn, framing: Framing) -> Self {
        let (state, chunked) = match framing {
            Framing::Length(0) => (State::Done, false),
            Framing::Length(n) => (State::Data(n), false),
            Framing::Chunked => (State::ChunkSize, true),
            Framing::Close => (State::ToClose, false),
        };
        Self { conn: Some(conn), state, chunked }
    }

    /// The whole body, when it is framed by a length and all of it is read already (a small
    /// answer mostly comes with its head): the body is then done, and its connection can be
    /// taken. `None` (and nothing taken) otherwise.
    pub fn take_whole(&mut self) -> Option<Bytes> {
        let conn = self.conn.as_mut()?;
        let whole = match self.state {
            State::Done => Bytes::new(),
            State::Data(n) if !self.chunked && conn.buf.len() as u64 >= n => {
                conn.buf.split_to(usize::try_from(n).expect("at most the buffer's length")).freeze()
            }
            _ => return None,
        };
        self.state = State::Done;
        Some(whole)
    }

    /// The connection, once the body ended as framed (not for a close-delimited body).
    pub fn take_conn(&mut self) -> Option<RawConn> {
        (self.state == State::Done).then(|| self.conn.take()).flatten()
    }

    /// Consumes one CRLF-terminated line of the buffer, without its CRLF; `None` when the
    /// buffer holds no whole line yet.
    fn line(conn: &mut RawConn) -> Result<Option<BytesMut>, UpBodyError> {
        match conn.buf.windows(2).position(|w| w == b"\r\n") {
            Some(i) => {
                let line = conn.buf.split_to(i);
                conn.buf.advance(2);
                Ok(Some(line))
            }
            None if conn.buf.len() > MAX_LINE => Err(UpBodyError::BadChunk),
            None => Ok(None),
        }
    }

    /// Moves the framing on with what is buffered: `Some(data)` when there is body data,
    /// `None` when more bytes are needed (or the body is done).
    fn step(&mut self) -> Result<Option<Bytes>, UpBodyError> {
        let conn = self.conn.as_mut().expect("a body being read has its connection");
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Data(n) => {
                    if conn.buf.is_empty() {
                        return Ok(None);
                    }
                    let take = usize::try_from(n).unwrap_or(usize::MAX).min(conn.buf.len());
                    let data = conn.buf.split_to(take).freeze();
                    let left = n - take as u64;
                    self.state = match (left, self.chunked) {
                        (0, true) => State::ChunkEnd,
                        (0, false) => State::Done,
                        (left, _) => State::Data(left),
                    };
                    return Ok(Some(data));
                }
                State::ToClose => {
                    return Ok((!conn.buf.is_empty()).then(|| conn.buf.split().freeze()));
                }
                State::ChunkSize => {
                    let Some(line) = Self::line(conn)? else { return Ok(None) };
                    let hex = line[..].split(|b| *b == b';').next().unwrap_or_default().trim_ascii();
                    let size = std::str::from_utf8(hex)
                        .ok()
                        .and_then(|h| u64::from_str_radix(h, 16).ok())
                        .ok_or(UpBodyError::BadChunk)?;
                    self.state = if size == 0 { State::Trailers } else { State::Data(size) };
                }
                State::ChunkEnd => {
                    let Some(line) = Self::line(conn)? else { return Ok(None) };
                    if !line.is_empty() {
                        return Err(UpBodyError::BadChunk);
                    }
                    self.state = State::ChunkSize;
                }
                State::Trailers => {
                    let Some(line) = Self::line(conn)? else { return Ok(None) };
                    if line.is_empty() {
                        self.state = State::Done;
                    }
                }
            }
        }
    }

    /// The error for an end of the connection in the current state.
    fn cut_short(&mut self) -> Option<UpBodyError> {
        match self.state {
            State::ToClose | State::Done => {
                self.state = State::Done;
                // A close-delimited body's connection is over.
                self.conn = None;
                None
            }
            State::Data(n) if !self.chunked => Some(UpBodyError::Short(n)),
            _ => Some(UpBodyError::ShortChunked),
        }
    }
}

impl HttpBody for RawBody {
    type Data = Bytes;
    type Error = UpBodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, UpBodyError>>> {
        let this = self.get_mut();
        loop {
            match this.step() {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(None) if this.state == State::Done => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => {
                    this.conn = None;
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let conn = this.conn.as_mut().expect("a body being read has its connection");
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => {
                    return match this.cut_short() {
                        None => Poll::Ready(None),
                        Some(e) => {
                            this.conn = None;
                            this.state = State::Done;
                            Poll::Ready(Some(Err(e)))
                        }
                    };
                }
                Ok(_) => {}
                Err(source) => {
                    this.conn = None;
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(UpBodyError::Read { source })));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Data(n) if !self.chunked => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
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
    pub fn take_raw(&mut self) -> Option<RawConn> {
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

#[cfg(test)]
mod tests;
