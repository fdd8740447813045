//! The front door end to end: `ailb gateway` runs INSIDE the test's child cgroup (where
//! `ailb run` attached the programs), three HTTP backends of weights 1:2:5 sit behind one VIP,
//! and a client outside the cgroup sends every request down ONE keep-alive connection to the
//! gateway. Each request gets its own upstream connection, so the kernel picks per request:
//! - 1,000 requests of 10 `X-Session-ID`s: every session sticks to one backend, and that
//!   backend is the one `ailb explain` computed from the pinned tables before any traffic
//!   (the weighted Maglev pick of the session's hash), so the placement of each session is
//!   what the weights decide;
//! - 10 sessions are too few to show a weight ratio (each lands on one backend, so the shares
//!   come in tenths), so 1,000 more requests, each of its own session, check the spread: the
//!   shares are 12.5 / 25 / 62.5 % within a few points;
//! - a chat that resends its history without any header sticks too (its derived key).

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ailb_tests::status::{ailb_status, model_inflight};
use ailb_tests::{base_config, percent, preflight, run_cmd, BackendCfg, CgroupGuard, Daemon, GatewayProcess};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

const MODEL: &str = "gw-7b";
const EMPTY_MODEL: &str = "gw-empty";
const EMPTY_VIP: &str = "127.77.9.3:8000";
const VIP: &str = "127.77.9.1:8000";
const BACKENDS: [(&str, u32); 3] = [("127.0.9.11:18911", 1), ("127.0.9.12:18912", 2), ("127.0.9.13:18913", 5)];
const GATEWAY: &str = "127.0.9.1:18900";
const SESSIONS: usize = 10;
/// Requests of the [`SESSIONS`] sticky sessions, taken in turn.
const REQUESTS: usize = 1000;
/// Requests of one session each, for the spread.
const SPREAD: usize = 1000;
/// The tolerance on each share of the [`SPREAD`] requests. The session ids are fixed and the
/// table is built deterministically, so the shares are the same on every run; the bound is
/// still set as if the hashes were random: a share p of n = 1000 independent picks has a
/// standard deviation of sqrt(p(1-p)/n) <= 1.6 pp, the weighted Maglev table matches the
/// weights to a fraction of a point, and the load bound can divert a pick only when the
/// previous request's upstream connection has not closed yet. 6 pp is over 3.5 sigma.
const TOLERANCE_PP: f64 = 6.0;
const TURNS: usize = 10;
/// The whole test's traffic (2,010 requests) must take less than this: a pick per request
/// costs a connect, not a round of waiting.
const TRAFFIC_LIMIT: Duration = Duration::from_secs(60);

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

/// `ailb explain --json --model MODEL --bpffs DIR --conversation ID`: the kernel's pick for
/// the conversation now, computed from the pinned maps; (backend, outcome).
fn explain(bin: &Path, bpffs: &Path, conversation: &str) -> (String, String) {
    let out = run_cmd(
        Command::new(bin)
            .args(["explain", "--json", "--model", MODEL, "--conversation", conversation])
            .arg("--bpffs")
            .arg(bpffs),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "ailb explain failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("ailb explain --json: {e}"));
    let c = &v["conversation"];
    (c["backend"].as_str().unwrap_or("refused").to_string(), c["outcome"].as_str().unwrap_or("").to_string())
}

/// The kernel counts no connection of [`MODEL`] in flight: the front door ends an upstream
/// connection's count before the response's last byte reaches the client, so the client's
/// next request never sees its previous one in flight (the load bound would divert it).
fn assert_idle(bin: &Path, bpffs: &Path, before: usize) {
    let status = ailb_status(bin, bpffs).unwrap_or_else(|e| panic!("ailb status: {e}"));
    let n = model_inflight(&status).get(MODEL).copied();
    assert_eq!(n, Some(0), "in flight before request {before}, after the previous one was answered");
}

fn session(i: usize) -> String {
    format!("gw-session-{i}")
}

#[test]
fn gateway_steers_each_request_on_one_keepalive_connection() {
    let bin = preflight();
    let cg = CgroupGuard::new("gateway");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let accepted: Vec<_> = BACKENDS.iter().map(|b| start_backend(&rt, b.0)).collect();
    // A second model with no backend at all: `/v1/models` must not list it.
    let mut cfg = base_config("gateway", &cg).service(MODEL, VIP).service(EMPTY_MODEL, EMPTY_VIP);
    cfg.listen = Some(format!("127.0.0.1:{}", ailb_tests::nacos::free_port()));
    for (addr, w) in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, w));
    }
    // A fresh upstream connection (and kernel pick) per request: what this test counts.
    // Kept connections are `gateway_reuse.rs`'s.
    cfg.extra = format!("[gateway]\nlisten = [\"{GATEWAY}\"]\nupstream_reuse = \"never\"\n");
    let daemon = Daemon::start(&bin, &cfg);
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, GATEWAY.parse().unwrap());
    // Its memory on small pages: a huge page zeroed whole on a request's path cost milliseconds.
    let status = std::fs::read_to_string(format!("/proc/{}/status", gateway.pid())).expect("the gateway's status");
    let thp = status.lines().find_map(|l| l.strip_prefix("THP_enabled:")).map(str::trim);
    assert_eq!(thp, Some("0"), "the gateway runs with transparent huge pages off:\n{status}");

    // Before any traffic: the pick of each session is the weighted table's (its primary slot).
    let predicted: BTreeMap<String, String> = (0..SESSIONS)
        .map(|i| {
            let (backend, outcome) = explain(&bin, daemon.bpffs(), &session(i));
            assert_eq!(outcome, "Primary", "a fresh session {} is picked from the table: {backend}", session(i));
            (session(i), backend)
        })
        .collect();

    let started = Instant::now();
    let (by_session, spread, turns, next_turn) = rt.block_on(async {
        let mut c = connect_client().await;
        // The catalog has two models; only one has a live backend (the daemon's plan says so).
        c.ready().await.unwrap();
        let req = Request::get("/v1/models").header("host", "gw").body(Full::new(Bytes::new())).unwrap();
        let resp = c.send_request(req).await.unwrap();
        let listed: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        let ids: Vec<(&str, bool)> = listed["data"]
            .as_array()
            .unwrap_or_else(|| panic!("/v1/models: {listed}"))
            .iter()
            .map(|m| (m["id"].as_str().unwrap_or(""), m["ailb_live"] == true))
            .collect();
        assert_eq!(ids, [(MODEL, true)], "/v1/models lists the models with a live backend: {listed}");
        let mut by_session: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for i in 0..REQUESTS {
            let session = session(i % SESSIONS);
            if i < 3 * SESSIONS {
                // (This blocks the test's own thread only; the backends and the client
                // connection run on the runtime's workers.)
                assert_idle(&bin, daemon.bpffs(), i);
            }
            let body = json!({"model": MODEL, "messages": [{"role": "user", "content": format!("request {i}")}]});
            let (backend, conv, answered) = chat(&mut c, Some(&session), &body).await;
            assert_eq!(backend, answered, "x-ailb-backend must be the backend that answered");
            let want = format!("{:#018x}", ailb_common::hash::conversation_hash(session.as_bytes()));
            assert_eq!(conv, want, "x-ailb-conversation is the kernel's hash of the session id");
            by_session.entry(session).or_default().insert(backend);
        }
        let mut spread: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..SPREAD {
            let session = format!("gw-spread-{i}");
            let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "one question"}]});
            let (backend, _, answered) = chat(&mut c, Some(&session), &body).await;
            assert_eq!(backend, answered, "x-ailb-backend must be the backend that answered");
            *spread.entry(backend).or_default() += 1;
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
        messages.push(json!({"role": "user", "content": "and one more turn"}));
        (by_session, spread, turns, json!({"model": MODEL, "messages": messages}))
    });
    let took = started.elapsed();
    assert!(took < TRAFFIC_LIMIT, "{} requests took {took:?}", REQUESTS + SPREAD + TURNS);

    let log = gateway.log();
    assert_eq!(by_session.len(), SESSIONS);
    for (session, backends) in &by_session {
        assert_eq!(backends.len(), 1, "session {session} reached {backends:?}; gateway log:\n{log}");
        let reached = backends.iter().next().expect("one backend");
        assert_eq!(reached, &predicted[session], "session {session}: reached {reached}, the table's pick was another");
        // And the kernel's affinity entry names the backend the header named.
        let (now, outcome) = explain(&bin, daemon.bpffs(), session);
        assert_eq!((now.as_str(), outcome.as_str()), (reached.as_str(), "AffinityHit"), "session {session}");
    }
    let used: BTreeSet<&String> = by_session.values().flatten().collect();
    assert!(used.len() > 1, "{SESSIONS} sessions all went to {used:?}: the pick happened once, not per request");
    let total_weight: u32 = BACKENDS.iter().map(|b| b.1).sum();
    for (addr, w) in BACKENDS {
        let n = spread.get(addr).copied().unwrap_or(0);
        let share = percent(n, SPREAD);
        let expected = f64::from(w) * 100.0 / f64::from(total_weight);
        assert!(
            (share - expected).abs() <= TOLERANCE_PP,
            "backend {addr} (weight {w}/{total_weight}) got {n} of {SPREAD} one-request sessions = {share:.1} %, \
             expected {expected:.1} % +- {TOLERANCE_PP} pp; all counts {spread:?}"
        );
    }
    assert!(spread.keys().all(|b| BACKENDS.iter().any(|c| c.0 == b)), "an answer from elsewhere: {spread:?}");
    let turn_backends: BTreeSet<&String> = turns.iter().map(|t| &t.0).collect();
    assert_eq!(turn_backends.len(), 1, "the {TURNS}-turn chat reached {turn_backends:?}");
    let turn_keys: BTreeSet<&String> = turns.iter().map(|t| &t.1).collect();
    assert_eq!(turn_keys.len(), 1, "the chat's derived conversation key changed: {turn_keys:?}");
    // `ailb explain --request` on the chat's next turn (no header) finds the same derived key
    // as the front door and the backend its turns reached.
    let body = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(body.path(), next_turn.to_string()).unwrap();
    let out = run_cmd(
        Command::new(&bin)
            .args(["explain", "--json", "--request"])
            .arg(body.path())
            .arg("--config")
            .arg(daemon.config_path()),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "ailb explain --request failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("ailb explain --json: {e}"));
    assert_eq!(v["request"]["model"], MODEL, "{v}");
    assert_eq!(v["request"]["conversation"]["source"], "derived", "{v}");
    assert_eq!(v["request"]["conversation_hash"].as_str(), turn_keys.first().map(|k| k.as_str()), "{v}");
    assert_eq!(v["conversation"]["backend"].as_str(), turn_backends.first().map(|b| b.as_str()), "{v}");
    let total: u64 = accepted.iter().map(|a| a.load(Ordering::SeqCst)).sum();
    assert_eq!(total, (REQUESTS + SPREAD + TURNS) as u64, "one upstream connection per request");
    eprintln!(
        "sessions per backend: {by_session:?}; spread {spread:?}; chat on {turn_backends:?}; traffic took {took:?}"
    );
    drop(gateway);
    drop(daemon);
}
