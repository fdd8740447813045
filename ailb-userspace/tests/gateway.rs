//! The front door in process, without eBPF (no root): without ailb loaded, tagging reports
//! `NoBalancer` and each upstream connect goes to the VIP itself, so a model's VIP points at
//! a tiny hyper upstream that counts its connections.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{channel::Channel, combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

mod support;
use support::serve;

const CHAT_REPLY: &str =
    r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}"#;
const SSE: [&str; 3] = [
    "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
    "data: [DONE]\n\n",
];

type UpBody = UnsyncBoxBody<Bytes, Infallible>;

/// The stand-in for a model server.
struct Upstream {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
    /// The request bodies it received, in order.
    bodies: Arc<Mutex<Vec<Bytes>>>,
    /// Their request headers, in order.
    heads: Arc<Mutex<Vec<hyper::HeaderMap>>>,
    /// For each streamed request: a sender the test fires to release the rest of the stream.
    releases: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
}

async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, closed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let (tx, releases) = mpsc::unbounded_channel();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (a, c, b, h) = (accepted.clone(), closed.clone(), bodies.clone(), heads.clone());
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            let (c, b, h, tx) = (c.clone(), b.clone(), h.clone(), tx.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    h.lock().unwrap().push(req.headers().clone());
                    answer(req, b.clone(), tx.clone())
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                c.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    Upstream { addr, accepted, closed, bodies, heads, releases }
}

async fn answer(
    req: Request<Incoming>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    releases: mpsc::UnboundedSender<oneshot::Sender<()>>,
) -> Result<Response<UpBody>, Infallible> {
    let body = req.into_body().collect().await.unwrap().to_bytes();
    bodies.lock().unwrap().push(body.clone());
    let streamed = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v["stream"].as_bool());
    if streamed != Some(true) {
        let resp = Response::builder().header("content-type", "application/json").header("x-up", "1");
        return Ok(resp.body(Full::new(Bytes::from(CHAT_REPLY)).boxed_unsync()).unwrap());
    }
    // The first event now, the rest only once the test has seen the first one through the
    // gateway: a gateway that buffered the stream whole would never deliver it.
    let (mut tx, chan) = Channel::<Bytes, Infallible>::new(4);
    let (release, released) = oneshot::channel();
    releases.send(release).unwrap();
    tokio::spawn(async move {
        tx.send_data(Bytes::from(SSE[0])).await.ok();
        if released.await.is_ok() {
            for e in &SSE[1..] {
                tx.send_data(Bytes::from(*e)).await.ok();
            }
        }
    });
    let resp = Response::builder().header("content-type", "text/event-stream");
    Ok(resp.body(chan.boxed_unsync()).unwrap())
}

/// A port on 127.0.0.1 that refuses connections (bound, then closed).
fn refused_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The gateway on 127.0.0.1:0 with model `m` at `up` and `dead` at a refusing port.
async fn gateway(up: SocketAddr, extra: &str) -> SocketAddr {
    let text = format!(
        "[[models]]\nname = \"m\"\nvips = [\"{up}\"]\n\n[[models]]\nname = \"dead\"\nvips = [\"127.0.0.1:{}\"]\n\n\
         [gateway]\nmax_body_bytes = 4096\nidle_timeout = \"10s\"\n{extra}",
        refused_port()
    );
    serve(&text).await
}

type ReqBody = UnsyncBoxBody<Bytes, Infallible>;

/// One keep-alive client connection to the gateway.
async fn client(gw: SocketAddr) -> hyper::client::conn::http1::SendRequest<ReqBody> {
    let stream = TcpStream::connect(gw).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    sender
}

fn post(path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Request<ReqBody> {
    let mut b = Request::post(path).header("host", "gw").header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body.into()).boxed_unsync()).unwrap()
}

async fn send(
    c: &mut hyper::client::conn::http1::SendRequest<ReqBody>,
    req: Request<ReqBody>,
) -> (Response<()>, Bytes) {
    c.ready().await.unwrap();
    let resp = c.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    (Response::from_parts(parts, ()), body.collect().await.unwrap().to_bytes())
}

fn error_code(body: &Bytes) -> (String, String) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("error body {body:?}: {e}"));
    let e = &v["error"];
    assert!(e.get("param").is_some() && e["type"].is_string(), "OpenAI error shape: {v}");
    (e["code"].as_str().unwrap_or_default().to_string(), e["message"].as_str().unwrap().to_string())
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

#[tokio::test]
async fn non_streamed_chat_passes_through_byte_for_byte() {
    let up = upstream().await;
    let gw = gateway(up.addr, "").await;
    let mut c = client(gw).await;
    let (resp, body) = send(&mut c, post("/v1/chat/completions", &[("X-Session-ID", "s1")], CHAT)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(body, CHAT_REPLY.as_bytes());
    assert_eq!(up.bodies.lock().unwrap()[0], CHAT.as_bytes(), "the request body is forwarded as is");
    let h = resp.headers();
    assert_eq!(h["x-up"], "1", "upstream headers come back");
    assert_eq!(h["x-ailb-backend"], up.addr.to_string().as_str());
    let hash = ailb_common::hash::conversation_hash(b"s1");
    assert_eq!(h["x-ailb-conversation"], format!("{hash:#018x}").as_str());
}

#[tokio::test]
async fn streamed_chat_is_relayed_frame_by_frame() {
    let mut up = upstream().await;
    let gw = gateway(up.addr, "").await;
    let mut c = client(gw).await;
    let req =
        post("/v1/chat/completions", &[], r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#);
    c.ready().await.unwrap();
    let resp = c.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first event within 10 s: the gateway must not wait for the whole stream")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(first, SSE[0].as_bytes(), "the first event arrives before the upstream sends the rest");
    up.releases.recv().await.unwrap().send(()).unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!([first, rest].concat(), SSE.concat().as_bytes());
}

#[tokio::test]
async fn a_client_that_goes_away_drops_the_upstream_connection() {
    let mut up = upstream().await;
    let gw = gateway(up.addr, "").await;
    let mut c = client(gw).await;
    let req = post("/v1/chat/completions", &[], r#"{"model":"m","stream":true,"messages":[]}"#);
    let resp = c.send_request(req).await.unwrap();
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    let _release = up.releases.recv().await.unwrap(); // never fired: the stream stays open
    assert_eq!(up.closed.load(Ordering::SeqCst), 0);
    drop((body, c));
    let closed = wait_for(|| up.closed.load(Ordering::SeqCst) == 1).await;
    assert!(closed, "the upstream connection should close when the client goes away");
}

/// Polls `f` every 10 ms for at most 5 s.
async fn wait_for(f: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f()
}

#[tokio::test]
async fn errors_are_openai_shaped() {
    let up = upstream().await;
    let gw = gateway(up.addr, "").await;
    let mut c = client(gw).await;

    let (resp, body) = send(&mut c, post("/v1/chat/completions", &[], r#"{"model":"nope"}"#)).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(&body).0, "model_not_found");

    let (resp, body) = send(&mut c, post("/v1/chat/completions", &[], r#"{"model": "m", "#)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let (code, msg) = error_code(&body);
    assert_eq!(code, "invalid_json");
    assert!(msg.contains("invalid JSON"), "{msg}");

    let (resp, body) = send(&mut c, post("/v1/embeddings", &[], r#"{"model":"dead","input":"x"}"#)).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{body:?}");
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(error_code(&body).0, "no_backend");

    let (resp, _) = send(&mut c, post("/v1/nothing", &[], "{}")).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 0, "no error case reached the upstream");

    // Over max_body_bytes (4096): by Content-Length, then chunked (no length).
    let (resp, body) = send(&mut c, post("/v1/chat/completions", &[], vec![b' '; 5000])).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(&body).0, "request_too_large");
    let mut c = client(gw).await;
    let chunks = chunked(vec![Bytes::from(vec![b' '; 3000]), Bytes::from(vec![b' '; 3000])]);
    let req = Request::post("/v1/chat/completions").header("host", "gw").body(chunks).unwrap();
    let (resp, _) = send(&mut c, req).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

/// A body of `chunks` with no length (sent chunked).
fn chunked(chunks: Vec<Bytes>) -> ReqBody {
    let (mut tx, chan) = Channel::<Bytes, Infallible>::new(1);
    tokio::spawn(async move {
        for c in chunks {
            if tx.send_data(c).await.is_err() {
                return; // the gateway stopped reading at its limit
            }
        }
    });
    chan.boxed_unsync()
}

#[tokio::test]
async fn over_max_concurrent_is_429() {
    let mut up = upstream().await;
    let gw = gateway(up.addr, "max_concurrent = 1\n").await;
    let mut held = client(gw).await;
    let req = post("/v1/chat/completions", &[], r#"{"model":"m","stream":true,"messages":[]}"#);
    let resp = held.send_request(req).await.unwrap();
    let release = up.releases.recv().await.unwrap();
    let mut c = client(gw).await;
    let (r, body) = send(&mut c, post("/v1/chat/completions", &[], CHAT)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(error_code(&body).0, "too_many_requests");
    release.send(()).unwrap();
    resp.into_body().collect().await.unwrap();
    let (r, _) = send(&mut c, post("/v1/chat/completions", &[], CHAT)).await;
    assert_eq!(r.status(), StatusCode::OK, "the slot is free again once the stream ended");
}

/// 50 chat requests down `c`, of 5 sessions in turn, each answered whole.
async fn fifty_of_five_sessions(c: &mut hyper::client::conn::http1::SendRequest<ReqBody>) {
    for i in 0..50 {
        let id = format!("s{}", i % 5);
        let (resp, body) = send(c, post("/v1/chat/completions", &[("x-session-id", &id)], CHAT)).await;
        assert_eq!(resp.status(), StatusCode::OK, "request {i}");
        assert_eq!(body, CHAT_REPLY.as_bytes());
    }
}

#[tokio::test]
async fn without_reuse_fifty_requests_on_one_client_connection_use_fifty_upstream_connections() {
    let up = upstream().await;
    let gw = gateway(up.addr, "upstream_reuse = \"never\"\n").await;
    let mut c = client(gw).await;
    fifty_of_five_sessions(&mut c).await;
    assert_eq!(up.accepted.load(Ordering::SeqCst), 50, "one fresh upstream connection per request");
}

#[tokio::test]
async fn models_health_and_metrics() {
    let up = upstream().await;
    let gw = gateway(up.addr, "").await;
    let mut c = client(gw).await;
    let get = |p: &str| Request::get(p).header("host", "gw").body(Full::new(Bytes::new()).boxed_unsync()).unwrap();
    let (resp, body) = send(&mut c, get("/v1/models")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["dead", "m"], "no daemon.listen: the whole catalog");
    assert!(v["data"].as_array().unwrap().iter().all(|m| m["ailb_live"].is_null()), "and it says it cannot tell");
    assert_eq!(send(&mut c, get("/healthz")).await.0.status(), StatusCode::OK);
    send(&mut c, post("/v1/chat/completions", &[], CHAT)).await;
    let (resp, body) = send(&mut c, get("/metrics")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let text = String::from_utf8(body.to_vec()).unwrap();
    for want in [
        "ailb_gateway_requests_total{model=\"m\",status=\"200\"} 1",
        "ailb_gateway_ttfb_seconds_count{model=\"m\"} 1",
        "ailb_gateway_duration_seconds_count{model=\"m\"} 1",
        "ailb_gateway_in_flight{model=\"m\"} 0",
    ] {
        assert!(text.contains(want), "metrics should contain {want:?}:\n{text}");
    }
}

/// An HTTP/1.0 upstream that answers `ok` and closes: the client's keep-alive connection to
/// the gateway must stay open (the response is sent in the client's version).
#[tokio::test]
async fn an_http10_upstream_does_not_close_the_client_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                // The head, then as many body bytes as Content-Length says.
                loop {
                    let n = s.read(&mut chunk).await.unwrap();
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                        if buf.len() >= end + 4 + len || n == 0 {
                            break;
                        }
                    }
                }
                s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok").await.unwrap();
                s.shutdown().await.ok();
            });
        }
    });
    let gw = gateway(addr, "").await;
    let mut c = client(gw).await;
    for i in 0..3 {
        let (resp, body) = send(&mut c, post("/v1/chat/completions", &[], CHAT)).await;
        assert_eq!((resp.status(), resp.version()), (StatusCode::OK, hyper::Version::HTTP_11), "request {i}");
        assert_eq!(body, "ok");
    }
}

/// An upstream that goes away in the middle of an event stream: the client gets the events sent so
/// far, then one error event in OpenAI's shape, then a clean end of the stream (never a hang).
#[tokio::test]
async fn an_upstream_gone_mid_stream_ends_the_stream_with_an_error_event() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const FIRST: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !String::from_utf8_lossy(&buf).contains("\r\n\r\n") {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the gateway closed before sending its request");
            buf.extend_from_slice(&chunk[..n]);
        }
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        s.write_all(format!("{head}{:x}\r\n{FIRST}\r\n", FIRST.len()).as_bytes()).await.unwrap();
        s.flush().await.unwrap();
        // Broken off: the socket goes without the terminating chunk.
        drop(s);
    });
    let gw = gateway(addr, "").await;
    let mut c = client(gw).await;
    let (resp, body) = tokio::time::timeout(
        Duration::from_secs(10),
        send(&mut c, post("/v1/chat/completions", &[], r#"{"model":"m","stream":true,"messages":[]}"#)),
    )
    .await
    .expect("the broken stream must end within 10 s, not hang");
    assert_eq!(resp.status(), StatusCode::OK);
    let text = String::from_utf8_lossy(&body).into_owned();
    let rest =
        text.strip_prefix(FIRST).unwrap_or_else(|| panic!("the event sent before the reset comes first: {text:?}"));
    let json = rest
        .strip_prefix("data: ")
        .and_then(|r| r.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("then exactly one more event: {rest:?}"));
    let (code, msg) = error_code(&Bytes::from(json.to_string()));
    assert_eq!(code, "upstream_error");
    assert!(msg.contains("broke off"), "{msg}");
}

/// `upstream_reuse = "conversation"`: a connection carries another request only when its
/// routing inputs are the same (model, memory need, conversation key).
#[tokio::test]
async fn connections_are_reused_only_for_the_same_routing_inputs() {
    let up = upstream().await;
    let gw = gateway(up.addr, "").await;
    let mut c = client(gw).await;
    fifty_of_five_sessions(&mut c).await;
    assert_eq!(up.accepted.load(Ordering::SeqCst), 5, "one upstream connection per conversation");
    // The same conversation with another memory need is another pick.
    for gb in ["8", "8", "16"] {
        let h = [("x-session-id", "s0"), ("x-required-memory", gb)];
        assert_eq!(send(&mut c, post("/v1/chat/completions", &h, CHAT)).await.0.status(), StatusCode::OK);
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 7, "8 GB once, 16 GB once");
    // A request without a conversation key is a fresh weighted pick every time.
    let embed = r#"{"model":"m","input":"x"}"#;
    for _ in 0..4 {
        assert_eq!(send(&mut c, post("/v1/embeddings", &[], embed)).await.0.status(), StatusCode::OK);
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 11, "no reuse without a conversation key");
    // A derived key (no header: the first user message) is a key like any other.
    for _ in 0..3 {
        assert_eq!(send(&mut c, post("/v1/chat/completions", &[], CHAT)).await.0.status(), StatusCode::OK);
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 12);
    let get = Request::get("/metrics").header("host", "gw").body(Full::new(Bytes::new()).boxed_unsync()).unwrap();
    let text = String::from_utf8(send(&mut c, get).await.1.to_vec()).unwrap();
    for want in [
        "ailb_gateway_upstream_requests_total{reused=\"false\"} 12",
        "ailb_gateway_upstream_requests_total{reused=\"true\"} 48",
    ] {
        assert!(text.contains(want), "metrics should contain {want:?}:\n{text}");
    }
}

/// A kept connection is never used past `upstream_max_age` from its connect: the next
/// request makes a new pick.
#[tokio::test]
async fn connections_older_than_max_age_are_not_reused() {
    let up = upstream().await;
    let gw = gateway(up.addr, "upstream_max_age = \"300ms\"\n").await;
    let mut c = client(gw).await;
    let h = [("x-session-id", "s")];
    assert_eq!(send(&mut c, post("/v1/chat/completions", &h, CHAT)).await.0.status(), StatusCode::OK);
    assert_eq!(send(&mut c, post("/v1/chat/completions", &h, CHAT)).await.0.status(), StatusCode::OK);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    // The sweeper closes the idle connection once it is past its age.
    assert!(wait_for(|| up.closed.load(Ordering::SeqCst) == 1).await, "the idle connection is closed at its age");
    assert_eq!(send(&mut c, post("/v1/chat/completions", &h, CHAT)).await.0.status(), StatusCode::OK);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2, "a new connection, a new pick");
}

/// A kept connection that its backend closed while idle is not used: the request goes on a
/// fresh connection and succeeds.
#[tokio::test]
async fn an_idle_connection_closed_by_the_backend_is_replaced() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An upstream that answers one request per connection with keep-alive, then closes it a
    // moment later (as a server's keep-alive timeout does).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let a = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            a.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"}") {
                    let n = s.read(&mut buf).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let reply = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{CHAT_REPLY}", CHAT_REPLY.len());
                s.write_all(reply.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            });
        }
    });
    let gw = gateway(addr, "").await;
    let mut c = client(gw).await;
    let h = [("x-session-id", "s")];
    for i in 0..3 {
        let (resp, body) = send(&mut c, post("/v1/chat/completions", &h, CHAT)).await;
        assert_eq!(resp.status(), StatusCode::OK, "request {i}");
        assert_eq!(body, CHAT_REPLY.as_bytes());
        let want = i + 1;
        assert!(wait_for(|| accepted.load(Ordering::SeqCst) == want).await);
        // Past the upstream's close of the idle connection.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3, "each request after a close went on a fresh connection");
}

/// The upstream learns the client's address from `X-Forwarded-For` (appended to any the
/// client sent).
#[tokio::test]
async fn the_client_address_is_forwarded() {
    let up = upstream().await;
    let gw = gateway(up.addr, "").await;
    let mut c = client(gw).await;
    send(&mut c, post("/v1/chat/completions", &[("x-forwarded-for", "10.1.2.3")], CHAT)).await;
    let heads = up.heads.lock().unwrap();
    assert_eq!(heads[0]["x-forwarded-for"], "10.1.2.3, 127.0.0.1");
}

/// HTTP/2 with prior knowledge (h2c) on the same port: requests are routed and answered
/// like HTTP/1.1 ones, several at once on one connection.
#[tokio::test]
async fn http2_clients_are_served() {
    let up = upstream().await;
    let gw = gateway(up.addr, "").await;
    let stream = TcpStream::connect(gw).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mut s = sender.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("s{i}");
            let req = Request::post("http://gw/v1/chat/completions")
                .header("content-type", "application/json")
                .header("x-session-id", id)
                .body(Full::new(Bytes::from(CHAT)).boxed_unsync())
                .unwrap();
            s.ready().await.unwrap();
            let resp = s.send_request(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(resp.version(), hyper::Version::HTTP_2);
            assert!(resp.headers().contains_key("x-ailb-backend"));
            resp.into_body().collect().await.unwrap().to_bytes()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), CHAT_REPLY.as_bytes());
    }
    let heads = up.heads.lock().unwrap();
    assert_eq!(heads.len(), 8);
    assert!(heads.iter().all(|h| h["host"] == "gw"), "Host from :authority: {heads:?}");
}

/// A body slower than `header_timeout` gets 408 (the client's fault, not the upstream's) and
/// never reaches the upstream.
#[tokio::test]
async fn a_body_slower_than_the_header_timeout_is_408() {
    let up = upstream().await;
    let gw = gateway(up.addr, "header_timeout = \"300ms\"\n").await;
    let mut c = client(gw).await;
    let (mut tx, chan) = Channel::<Bytes, Infallible>::new(1);
    tokio::spawn(async move {
        tx.send_data(Bytes::from(&CHAT[..10])).await.ok();
        // The rest never comes while the test runs.
        std::future::pending::<()>().await;
        drop(tx);
    });
    let mut req = post("/v1/chat/completions", &[], Bytes::new());
    *req.body_mut() = chan.boxed_unsync();
    let started = std::time::Instant::now();
    let (resp, body) = send(&mut c, req).await;
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(error_code(&body).0, "request_timeout");
    assert!(started.elapsed() < Duration::from_secs(5), "cut off at the header timeout: {:?}", started.elapsed());
    assert_eq!(up.accepted.load(Ordering::SeqCst), 0);
}

/// `/v1/models` lists the models the daemon's plan says have a live backend (`daemon.listen`,
/// `GET /v1/plan`), and the whole catalog while the daemon does not answer.
#[tokio::test]
async fn models_are_those_with_a_live_backend() {
    let up = upstream().await;
    // A stand-in for `ailb run`'s endpoint: `m` is available, `dead` is not.
    let daemon = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let daemon_addr = daemon.local_addr().unwrap();
    let answering = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let on = answering.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = daemon.accept().await.unwrap();
            let on = on.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let on = on.load(Ordering::SeqCst);
                    async move {
                        assert_eq!(req.uri().path(), "/v1/plan");
                        let plan = r#"{"generation":3,"models":{
                            "m":{"vips":[],"backends":[],"affinity_ttl":null,"available":true,"weights_held":false},
                            "dead":{"vips":[],"backends":[],"affinity_ttl":null,"available":false,"weights_held":false}}}"#;
                        let (status, body) = if on { (200, plan) } else { (500, "down") };
                        Ok::<_, Infallible>(
                            Response::builder().status(status).body(Full::new(Bytes::from(body))).unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    let text = format!(
        "[daemon]\nlisten = \"{daemon_addr}\"\n[[models]]\nname = \"m\"\nvips = [\"{}\"]\n\n[[models]]\nname = \"dead\"\n\
         vips = [\"127.0.0.1:{}\"]\n",
        up.addr,
        refused_port()
    );
    let mut c = client(serve(&text).await).await;
    let list = |v: serde_json::Value| -> Vec<(String, serde_json::Value)> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["id"].as_str().unwrap().to_string(), m["ailb_live"].clone()))
            .collect()
    };
    let get = || Request::get("/v1/models").header("host", "gw").body(Full::new(Bytes::new()).boxed_unsync()).unwrap();
    let (resp, body) = send(&mut c, get()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(list(serde_json::from_slice(&body).unwrap()), [("m".to_string(), serde_json::Value::Bool(true))]);
    // The daemon stops answering: past the cache, the whole catalog, marked unknown.
    answering.store(false, Ordering::SeqCst);
    tokio::time::sleep(ailb_userspace::gateway::control::live_models::TTL + Duration::from_millis(100)).await;
    let (_, body) = send(&mut c, get()).await;
    let ids: Vec<String> = list(serde_json::from_slice(&body).unwrap())
        .into_iter()
        .map(|(id, live)| {
            assert!(live.is_null());
            id
        })
        .collect();
    assert_eq!(ids, ["dead", "m"]);
}
