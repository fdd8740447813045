//! A response body read straight off a kept upstream connection ([`RawConn`]), without
//! hyper's client: framed by `Content-Length`, by chunks (decoded here, so an event stream's
//! events go on as they arrive), or by the end of the connection. Each read becomes one
//! frame at once. The connection comes back ([`RawBody::take_conn`]) only once the body ended
//! where its framing says, with nothing unread after it; a body cut short is an error (the
//! relay then ends an event stream with an error event), and dropping the body closes the
//! connection (the client went away: the model server frees the request's slot).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::net::TcpStream;

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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;

    /// A raw connection and the backend's end of it.
    async fn pair() -> (RawConn, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (RawConn::new(c), s)
    }

    /// Every frame of `body` until its end, or the error that ended it.
    async fn frames(body: &mut RawBody) -> Result<Vec<Bytes>, UpBodyError> {
        let mut out = Vec::new();
        while let Some(f) = body.frame().await {
            out.push(f?.into_data().unwrap());
        }
        Ok(out)
    }

    #[tokio::test]
    async fn chunks_split_over_reads_are_decoded_and_the_connection_comes_back() {
        let (conn, mut backend) = pair().await;
        let mut body = RawBody::new(conn, Framing::Chunked);
        let writer = tokio::spawn(async move {
            let wire: &[&[u8]] = &[b"5\r\nda", b"ta:\r\n", b"3;ext=1\r\n x\n\r\n0\r", b"\nTrailer: t\r\n\r\nHTTP/1.1"];
            for piece in wire {
                backend.write_all(piece).await.unwrap();
                backend.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            backend
        });
        let got: Vec<u8> = frames(&mut body).await.unwrap().concat();
        assert_eq!(got, b"data: x\n");
        assert!(body.is_end_stream());
        let _backend = writer.await.unwrap();
        let conn = body.take_conn().expect("a body that ended as framed gives its connection back");
        assert_eq!(&conn.buf[..], b"HTTP/1.1", "the next response's first bytes stay buffered");
        assert!(!conn.is_open(), "not reusable with bytes unread");
    }

    #[tokio::test]
    async fn a_length_body_read_with_its_head_is_taken_whole_and_only_then() {
        let (mut conn, _backend) = pair().await;
        conn.buf.extend_from_slice(b"hello, worldHTTP/1.1");
        let mut body = RawBody::new(conn, Framing::Length(12));
        assert_eq!(body.take_whole().as_deref(), Some(&b"hello, world"[..]));
        assert!(body.is_end_stream());
        let conn = body.take_conn().expect("a whole body gives its connection back");
        assert_eq!(&conn.buf[..], b"HTTP/1.1", "the next response's first bytes stay buffered");
        // Not all of it read yet, or not framed by a length: nothing is taken.
        let mut short = RawBody::new(conn, Framing::Length(20));
        short.conn.as_mut().unwrap().buf.clear();
        short.conn.as_mut().unwrap().buf.extend_from_slice(b"0123456789");
        assert_eq!(short.take_whole(), None);
        assert_eq!(short.size_hint().exact(), Some(20));
        let conn = short.conn.take().unwrap();
        let mut chunked = RawBody::new(conn, Framing::Chunked);
        assert_eq!(chunked.take_whole(), None);
        let conn = chunked.conn.take().unwrap();
        assert_eq!(&conn.buf[..], b"0123456789", "nothing consumed");
        let mut close = RawBody::new(conn, Framing::Close);
        assert_eq!(close.take_whole(), None);
        let mut empty = RawBody::new(close.conn.take().unwrap(), Framing::Length(0));
        assert_eq!(empty.take_whole().as_deref(), Some(&b""[..]));
        assert!(empty.take_conn().is_some());
    }

    #[tokio::test]
    async fn a_length_body_cut_short_is_an_error_and_keeps_no_connection() {
        let (conn, mut backend) = pair().await;
        let mut body = RawBody::new(conn, Framing::Length(10));
        assert_eq!(body.size_hint().exact(), Some(10));
        backend.write_all(b"abcd").await.unwrap();
        drop(backend);
        match frames(&mut body).await {
            Err(UpBodyError::Short(6)) => {}
            other => panic!("expected 6 bytes short, got {other:?}"),
        }
        assert!(body.take_conn().is_none());
    }

    #[tokio::test]
    async fn a_close_delimited_body_ends_with_the_connection() {
        let (conn, mut backend) = pair().await;
        let mut body = RawBody::new(conn, Framing::Close);
        backend.write_all(b"all of it").await.unwrap();
        drop(backend);
        assert_eq!(frames(&mut body).await.unwrap().concat(), b"all of it");
        assert!(body.take_conn().is_none(), "its connection is over");
    }

    #[tokio::test]
    async fn a_bad_chunk_size_is_an_error() {
        let (conn, mut backend) = pair().await;
        let mut body = RawBody::new(conn, Framing::Chunked);
        backend.write_all(b"zz\r\n").await.unwrap();
        assert!(matches!(frames(&mut body).await, Err(UpBodyError::BadChunk)));
    }

    #[tokio::test]
    async fn an_idle_connection_the_backend_closed_is_not_open() {
        let (conn, backend) = pair().await;
        assert!(conn.is_open());
        drop(backend);
        // The runtime learns of the close when it polls the socket: wait for readiness.
        conn.stream.readable().await.unwrap();
        assert!(!conn.is_open());
    }
}
