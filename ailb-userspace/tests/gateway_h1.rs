//! The front door's HTTP/1 fast path (`gateway.http1_fast_path`, the default) on raw client
//! connections, in process and without eBPF (as `tests/gateway.rs`: each upstream connect goes
//! to the model's VIP itself): pipelining, heads split over reads, the limits, framing errors,
//! upstream failures, and the connections it hands to hyper's server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod support;

const REPLY: &str = r#"{"id":"c1","object":"chat.completion","choices":[]}"#;
const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

/// A model server stand-in that answers every request with [`REPLY`].
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                    req.into_body().collect().await.unwrap();
                    let resp = Response::builder().header("content-type", "application/json");
                    Ok::<_, Infallible>(resp.body(Full::new(Bytes::from(REPLY))).unwrap())
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    addr
}

/// An upstream that reads a request head and closes without answering.
async fn closing_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
        }
    });
    addr
}

/// The gateway with model `m` at `up`, `max_body_bytes = 4096`, and `extra` settings.
async fn gateway(up: SocketAddr, extra: &str) -> SocketAddr {
    let text = format!("[[models]]\nname = \"m\"\nvips = [\"{up}\"]\n\n[gateway]\nmax_body_bytes = 4096\n{extra}");
    support::serve(&text).await
}

fn chat(body: &str, extra_headers: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n{extra_headers}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// One response read off a raw connection.
#[derive(Debug)]
struct Answer {
    status_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn status(&self) -> u16 {
        self.status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn error_code(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("error body {:?}: {e}", String::from_utf8_lossy(&self.body)));
        v["error"]["code"].as_str().unwrap_or_default().to_string()
    }
}

/// Reads one response (framed by Content-Length, chunks, or the close) from `s`, keeping what
/// follows it in `buf`.
async fn read_answer(s: &mut TcpStream, buf: &mut Vec<u8>) -> Answer {
    let head_len = loop {
        let mut slots = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut slots);
        if let httparse::Status::Complete(n) = r.parse(buf).expect("a response head") {
            break n;
        }
        fill(s, buf).await.expect("the response head's end");
    };
    let text = String::from_utf8_lossy(&buf[..head_len]).into_owned();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    buf.drain(..head_len);
    let mut answer = Answer { status_line, headers, body: Vec::new() };
    if (100..200).contains(&answer.status()) || answer.status() == 204 {
        return answer;
    }
    if let Some(n) = answer.header("content-length").map(|v| v.parse::<usize>().unwrap()) {
        while buf.len() < n {
            fill(s, buf).await.expect("the whole body");
        }
        answer.body = buf.drain(..n).collect();
    } else if answer.header("transfer-encoding") == Some("chunked") {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                fill(s, buf).await.expect("a chunk size");
            };
            let size = usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                fill(s, buf).await.expect("a whole chunk");
            }
            answer.body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    } else {
        while fill(s, buf).await.is_some() {}
        answer.body = std::mem::take(buf);
    }
    answer
}

/// Reads more into `buf`; `None` at the end of the connection.
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    let mut chunk = [0u8; 16 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk)).await.expect("no stall").ok()?;
    buf.extend_from_slice(&chunk[..n]);
    (n > 0).then_some(n)
}

/// Whether the gateway closed `s` (EOF or reset) with nothing more to read.
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await, Ok(Ok(0) | Err(_)))
}

/// The gateway's `ailb_gateway_http1_handoffs_total`.
async fn handoffs(gw: SocketAddr) -> u64 {
    let mut s = TcpStream::connect(gw).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n").await.unwrap();
    let a = read_answer(&mut s, &mut Vec::new()).await;
    let text = String::from_utf8(a.body).unwrap();
    let line = text.lines().find(|l| l.starts_with("ailb_gateway_http1_handoffs_total ")).expect("the counter");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_the_fast_path() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    let mut all = chat(CHAT, "X-Session-ID: s1\r\n");
    all.push_str("GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n");
    all.push_str(&chat(r#"{"model":"nope"}"#, ""));
    all.push_str(&chat(CHAT, ""));
    s.write_all(all.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let first = read_answer(&mut s, &mut buf).await;
    assert_eq!(first.status(), 200, "{first:?}");
    assert_eq!(first.body, REPLY.as_bytes());
    assert!(first.header("x-ailb-backend").is_some() && first.header("x-ailb-conversation").is_some(), "{first:?}");
    assert!(first.header("date").is_some(), "{first:?}");
    let health = read_answer(&mut s, &mut buf).await;
    assert_eq!((health.status(), health.body.as_slice()), (200, &b"ok\n"[..]));
    let unknown = read_answer(&mut s, &mut buf).await;
    assert_eq!((unknown.status(), unknown.error_code().as_str()), (404, "model_not_found"));
    let last = read_answer(&mut s, &mut buf).await;
    assert_eq!(last.status(), 200);
    assert!(buf.is_empty(), "nothing more: {buf:?}");
    assert_eq!(handoffs(gw).await, 0, "every request was the fast path's");
}

#[tokio::test]
async fn a_head_split_over_many_reads_is_one_request() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    s.set_nodelay(true).unwrap();
    let req = chat(CHAT, "X-Session-ID: s1\r\n");
    for piece in req.as_bytes().chunks(7) {
        s.write_all(piece).await.unwrap();
        // Apart in time, so the gateway reads them apart.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let a = read_answer(&mut s, &mut Vec::new()).await;
    assert_eq!((a.status(), a.body.as_slice()), (200, REPLY.as_bytes()));
    assert_eq!(handoffs(gw).await, 0);
}

#[tokio::test]
async fn an_oversized_head_is_431_from_hyper() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    let huge = "a".repeat(600 * 1024);
    let req = chat(CHAT, &format!("X-Huge: {huge}\r\n"));
    // The gateway may close before it has read all of it.
    let _ = s.write_all(req.as_bytes()).await;
    let a = read_answer(&mut s, &mut Vec::new()).await;
    assert_eq!(a.status(), 431, "{}", a.status_line);
    assert_eq!(handoffs(gw).await, 1);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_before_it_is_sent_and_the_connection_closes() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    // Only the head: the answer must not wait for the body.
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000000\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    let a = read_answer(&mut s, &mut Vec::new()).await;
    assert_eq!((a.status(), a.error_code().as_str()), (413, "request_too_large"));
    assert_eq!(a.header("connection"), Some("close"));
    // What the client sends on is read off, then the connection ends.
    let _ = s.write_all(&vec![b' '; 64 * 1024]).await;
    assert!(closed(&mut s).await);
}

#[tokio::test]
async fn a_content_length_shorter_than_the_body_frames_the_rest_as_the_next_request() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    let req = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\n{CHAT}");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let a = read_answer(&mut s, &mut buf).await;
    assert_eq!((a.status(), a.error_code().as_str()), (400, "invalid_json"), "the body is its first 5 bytes");
    // The rest is no request head: hyper's server answers 400 and closes.
    let b = read_answer(&mut s, &mut buf).await;
    assert_eq!(b.status(), 400, "{b:?}");
    assert!(closed(&mut s).await);
    assert_eq!(handoffs(gw).await, 1);
}

#[tokio::test]
async fn a_body_cut_short_by_the_client_is_400_invalid_body() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    let req = "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{\"model\":";
    s.write_all(req.as_bytes()).await.unwrap();
    s.shutdown().await.unwrap();
    let a = read_answer(&mut s, &mut Vec::new()).await;
    assert_eq!((a.status(), a.error_code().as_str()), (400, "invalid_body"));
    assert_eq!(a.header("connection"), Some("close"));
}

#[tokio::test]
async fn an_upstream_that_closes_without_answering_is_502_json() {
    let gw = gateway(closing_upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    s.write_all(chat(CHAT, "").as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let a = read_answer(&mut s, &mut buf).await;
    assert_eq!((a.status(), a.error_code().as_str()), (502, "upstream_error"), "{a:?}");
    assert_eq!(a.header("content-type"), Some("application/json"));
    // The client's connection stays usable.
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n").await.unwrap();
    assert_eq!(read_answer(&mut s, &mut buf).await.status(), 200);
}

#[tokio::test]
async fn http10_is_answered_in_http10_and_closed() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    let req = chat(CHAT, "").replace("HTTP/1.1", "HTTP/1.0");
    s.write_all(req.as_bytes()).await.unwrap();
    let a = read_answer(&mut s, &mut Vec::new()).await;
    assert!(a.status_line.starts_with("HTTP/1.0 200"), "{a:?}");
    assert_eq!(a.body, REPLY.as_bytes());
    assert!(closed(&mut s).await);
}

#[tokio::test]
async fn connection_close_is_honoured() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    s.write_all(chat(CHAT, "Connection: close\r\n").as_bytes()).await.unwrap();
    let a = read_answer(&mut s, &mut Vec::new()).await;
    assert_eq!((a.status(), a.header("connection")), (200, Some("close")));
    assert!(closed(&mut s).await);
}

#[tokio::test]
async fn chunked_bodies_and_expect_continue_are_served_by_hyper_after_fast_path_requests() {
    let gw = gateway(upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(chat(CHAT, "").as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut s, &mut buf).await.status(), 200);
    assert_eq!(handoffs(gw).await, 0);
    // The same connection, now with a chunked body: hyper takes it from here.
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{CHAT}\r\n0\r\n\r\n",
        CHAT.len()
    );
    s.write_all(chunked.as_bytes()).await.unwrap();
    let a = read_answer(&mut s, &mut buf).await;
    assert_eq!((a.status(), a.body.as_slice()), (200, REPLY.as_bytes()));
    assert_eq!(handoffs(gw).await, 1);

    let mut s = TcpStream::connect(gw).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        CHAT.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let cont = read_answer(&mut s, &mut buf).await;
    assert_eq!(cont.status(), 100, "{cont:?}");
    s.write_all(CHAT.as_bytes()).await.unwrap();
    let a = read_answer(&mut s, &mut buf).await;
    assert_eq!((a.status(), a.body.as_slice()), (200, REPLY.as_bytes()));
    assert_eq!(handoffs(gw).await, 2);
}

#[tokio::test]
async fn http2_prior_knowledge_is_handed_to_hyper() {
    let gw = gateway(upstream().await, "").await;
    let stream = TcpStream::connect(gw).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::post("http://gw/v1/chat/completions").body(Full::new(Bytes::from(CHAT))).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!((resp.status().as_u16(), resp.version()), (200, hyper::Version::HTTP_2));
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), REPLY.as_bytes());
    assert_eq!(handoffs(gw).await, 1);
}

#[tokio::test]
async fn with_the_fast_path_off_hyper_serves_every_connection() {
    let gw = gateway(upstream().await, "http1_fast_path = false\n").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    let mut all = chat(CHAT, "");
    all.push_str(&chat(CHAT, ""));
    s.write_all(all.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..2 {
        let a = read_answer(&mut s, &mut buf).await;
        assert_eq!((a.status(), a.body.as_slice()), (200, REPLY.as_bytes()));
    }
    assert_eq!(handoffs(gw).await, 0, "nothing to hand off: hyper had them all");
}

/// An upstream that answers with a `Content-Length` of 100 and closes after 10 bytes.
async fn short_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789").await;
        }
    });
    addr
}

#[tokio::test]
async fn an_upstream_body_cut_short_cuts_the_clients_answer() {
    let gw = gateway(short_upstream().await, "").await;
    let mut s = TcpStream::connect(gw).await.unwrap();
    s.write_all(chat(CHAT, "X-Session-ID: s1\r\n").as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    while fill(&mut s, &mut buf).await.is_some() {}
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n") && text.contains("Content-Length: 100\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\n0123456789"), "the 10 bytes that came, then the close: {text}");
}
