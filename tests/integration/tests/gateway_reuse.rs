//! The front door's kept upstream connections (`gateway.upstream_reuse = "conversation"`)
//! against the kernel's counters: a connection waiting idle between two requests of one
//! conversation does not count as in flight at its backend (nor its memory hint), it counts
//! again while it carries the next request, and its close is counted once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ailb_tests::status::{inflight_by_address, inflight_mem_by_address, stat};
use ailb_tests::{base_config, preflight, wait_until, BackendCfg, CgroupGuard, Daemon, GatewayProcess};
use bytes::Bytes;
use http_body_util::{channel::Channel, combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::sync::Notify;

const MODEL: &str = "reuse-7b";
const VIP: &str = "127.77.9.2:8000";
const BACKENDS: [&str; 2] = ["127.0.9.21:18921", "127.0.9.22:18922"];
const GATEWAY: &str = "127.0.9.2:18920";
const SETTLE: Duration = Duration::from_secs(5);

/// Connections a backend accepted and has open now.
#[derive(Default)]
struct Conns {
    accepted: AtomicU64,
    open: AtomicU64,
}

/// A backend that answers each request with a head and a first chunk at once, and ends the
/// body only when `release` is notified (so a request can be held in flight).
fn start_backend(rt: &tokio::runtime::Runtime, addr: &str, release: Arc<Notify>) -> Arc<Conns> {
    let addr: SocketAddr = addr.parse().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).unwrap_or_else(|e| panic!("binding {addr}: {e}"));
    let conns = Arc::new(Conns::default());
    let c = conns.clone();
    rt.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            c.accepted.fetch_add(1, Ordering::SeqCst);
            c.open.fetch_add(1, Ordering::SeqCst);
            let (c, release) = (c.clone(), release.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let release = release.clone();
                    async move {
                        let _ = req.into_body().collect().await;
                        let (mut tx, body) = Channel::<Bytes, Infallible>::new(2);
                        tokio::spawn(async move {
                            let _ = tx.send_data(Bytes::from("data: {\"backend\": \"")).await;
                            release.notified().await;
                            let _ = tx.send_data(Bytes::from(format!("{addr}\"}}\n\n"))).await;
                        });
                        let resp = Response::builder().header("content-type", "text/event-stream");
                        Ok::<_, Infallible>(resp.body(UnsyncBoxBody::new(body)).unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                c.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    conns
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Sends one chat request of `session` needing 1 GB; returns the backend and the body still
/// being answered.
async fn start_request(c: &mut Sender, session: &str) -> (String, hyper::body::Incoming) {
    let body = json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let req = Request::post("/v1/chat/completions")
        .header("host", "gw")
        .header("content-type", "application/json")
        .header("x-session-id", session)
        .header("x-required-memory", "1")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    c.ready().await.unwrap();
    let resp = c.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let backend = resp.headers()["x-ailb-backend"].to_str().unwrap().to_string();
    let mut body = resp.into_body();
    body.frame().await.expect("the first chunk").unwrap();
    (backend, body)
}

#[test]
fn kept_connections_are_not_counted_in_flight_while_idle() {
    let bin = preflight();
    let cg = CgroupGuard::new("gwreuse");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let release = Arc::new(Notify::new());
    let conns: Vec<_> = BACKENDS.iter().map(|a| start_backend(&rt, a, release.clone())).collect();
    let mut cfg = base_config("gwreuse", &cg).service(MODEL, VIP);
    for addr in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1));
    }
    // Kept long enough that the test, not the age, decides when they close.
    cfg.extra =
        format!("[gateway]\nlisten = [\"{GATEWAY}\"]\nupstream_reuse = \"conversation\"\nupstream_max_age = \"60s\"\n");
    let daemon = Daemon::start(&bin, &cfg);
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, GATEWAY.parse().unwrap());
    let accepted = || conns.iter().map(|c| c.accepted.load(Ordering::SeqCst)).sum::<u64>();
    let open = || conns.iter().map(|c| c.open.load(Ordering::SeqCst)).sum::<u64>();
    let closed_before = stat(&daemon.status(), "closed");

    rt.block_on(async {
        let stream = tokio::net::TcpStream::connect(GATEWAY).await.unwrap();
        let (mut c, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let mut first = None;
        for round in 0..3 {
            let (backend, body) = start_request(&mut c, "s1").await;
            let first = first.get_or_insert_with(|| backend.clone());
            assert_eq!(&backend, first, "round {round}: the conversation stays on its backend");
            // In flight: the request and its 1 GB hint count at the backend.
            let status = daemon.status();
            assert_eq!(inflight_by_address(&status).get(&backend).copied(), Some(1), "round {round}: {status}");
            assert_eq!(inflight_mem_by_address(&status).get(&backend).copied(), Some(1024), "round {round}");
            release.notify_one();
            let rest = body.collect().await.unwrap().to_bytes();
            assert!(String::from_utf8_lossy(&rest).contains(&backend), "round {round}: answered by {backend}");
            // Idle: the connection stays open but counts nothing.
            daemon.wait_inflight_zero(SETTLE);
            assert_eq!(accepted(), 1, "round {round}: one upstream connection carries every round");
            assert_eq!(open(), 1, "round {round}: the kept connection is still open while not counted");
        }
    });
    assert_eq!(stat(&daemon.status(), "closed"), closed_before, "no close counted while the connection is kept");

    // The front door goes (its kept connection closes): the close is counted once and nothing
    // stays in flight.
    drop(gateway);
    wait_until("the kept connection to close", SETTLE, || (open() == 0).then_some(()));
    wait_until("its close to be counted", SETTLE, || {
        (stat(&daemon.status(), "closed") == closed_before + 1).then_some(())
    });
    daemon.wait_inflight_zero(SETTLE);
    drop(daemon);
}
