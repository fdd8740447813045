//! The front door end to end: `ailb gateway` runs INSIDE the test's child cgroup (where
//! `ailb run` attached the programs), three HTTP backends sit behind one VIP, and a client
//! outside the cgroup sends every request down ONE keep-alive connection to the gateway.
//! Each request gets its own upstream connection, so the kernel picks per request: every
//! `X-Session-ID` sticks to one backend, the sessions spread over several, and a chat that
//! resends its history without any header sticks too (its derived key).

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ailb_tests::{base_config, preflight, BackendCfg, CgroupGuard, Daemon, GatewayProcess};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

const MODEL: &str = "gw-7b";
const VIP: &str = "127.77.9.1:8000";
const BACKENDS: [&str; 3] = ["127.0.9.11:18911", "127.0.9.12:18912", "127.0.9.13:18913"];
const GATEWAY: &str = "127.0.9.1:18900";
const SESSIONS: usize = 10;
const REQUESTS: usize = 300;
const TURNS: usize = 10;

/// An OpenAI-ish backend on `addr` that answers every request with its own address; counts
/// the connections it accepted.
fn start_backend(rt: &tokio::runtime::Runtime, addr: &str) -> Arc<AtomicU64> {
    let addr: SocketAddr = addr.parse().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).unwrap_or_else(|e| panic!("binding {addr}: {e}"));
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    let body = json!({"object": "chat.completion", "backend": addr.to_string()}).to_string();
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    accepted
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect_client() -> Sender {
    let stream = tokio::net::TcpStream::connect(GATEWAY).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// One chat completion; returns (x-ailb-backend, x-ailb-conversation, the body's backend).
async fn chat(c: &mut Sender, session: Option<&str>, body: &Value) -> (String, String, String) {
    let mut b = Request::post("/v1/chat/completions").header("host", "gw").header("content-type", "application/json");
    if let Some(s) = session {
        b = b.header("X-Session-ID", s);
    }
    c.ready().await.expect("the client connection stays open");
    let resp = c.send_request(b.body(Full::new(Bytes::from(body.to_string()))).unwrap()).await.unwrap();
    let status = resp.status();
    let header = |n: &str| resp.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let (backend, conv) = (header("x-ailb-backend"), header("x-ailb-conversation"));
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, StatusCode::OK, "body: {}", String::from_utf8_lossy(&bytes));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    (backend, conv, v["backend"].as_str().unwrap_or("").to_string())
}

#[test]
fn gateway_steers_each_request_on_one_keepalive_connection() {
    let bin = preflight();
    let cg = CgroupGuard::new("gateway");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let accepted: Vec<_> = BACKENDS.iter().map(|a| start_backend(&rt, a)).collect();
    let mut cfg = base_config("gateway", &cg).service(MODEL, VIP);
    for addr in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1));
    }
    cfg.extra = format!("[gateway]\nlisten = [\"{GATEWAY}\"]\n");
    let daemon = Daemon::start(&bin, &cfg);
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, GATEWAY.parse().unwrap());

    let (by_session, turns) = rt.block_on(async {
        let mut c = connect_client().await;
        let mut by_session: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for i in 0..REQUESTS {
            let session = format!("gw-session-{}", i % SESSIONS);
            let body = json!({"model": MODEL, "messages": [{"role": "user", "content": format!("request {i}")}]});
            let (backend, conv, answered) = chat(&mut c, Some(&session), &body).await;
            assert_eq!(backend, answered, "x-ailb-backend must be the backend that answered");
            let want = format!("{:#018x}", ailb_common::hash::conversation_hash(session.as_bytes()));
            assert_eq!(conv, want, "x-ailb-conversation is the kernel's hash of the session id");
            by_session.entry(session).or_default().insert(backend);
        }
        // A chat that resends its whole history each turn, with no header at all.
        let mut messages = vec![json!({"role": "system", "content": "you are terse"})];
        let mut turns = Vec::new();
        for t in 0..TURNS {
            messages.push(json!({"role": "user", "content": format!("turn {t}: tell me more")}));
            let (backend, conv, _) = chat(&mut c, None, &json!({"model": MODEL, "messages": messages})).await;
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
            turns.push((backend, conv));
        }
        (by_session, turns)
    });

    let log = gateway.log();
    for (session, backends) in &by_session {
        assert_eq!(backends.len(), 1, "session {session} reached {backends:?}; gateway log:\n{log}");
    }
    let used: BTreeSet<&String> = by_session.values().flatten().collect();
    assert!(used.len() > 1, "{SESSIONS} sessions all went to {used:?}: the pick happened once, not per request");
    let turn_backends: BTreeSet<&String> = turns.iter().map(|t| &t.0).collect();
    assert_eq!(turn_backends.len(), 1, "the {TURNS}-turn chat reached {turn_backends:?}");
    let turn_keys: BTreeSet<&String> = turns.iter().map(|t| &t.1).collect();
    assert_eq!(turn_keys.len(), 1, "the chat's derived conversation key changed: {turn_keys:?}");
    let total: u64 = accepted.iter().map(|a| a.load(Ordering::SeqCst)).sum();
    assert_eq!(total, (REQUESTS + TURNS) as u64, "one upstream connection per request");
    eprintln!("sessions per backend: {by_session:?}; chat on {turn_backends:?}");
    drop(gateway);
    drop(daemon);
}
