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
