//! The front door's admission per model (`gateway.admission = true`), end to end: two
//! `ailb-sim` servers with `max_inflight = 2` each make the model's capacity 4. Four streamed
//! requests are held open (each is in flight in the kernel before the next is sent); the next
//! two are answered 429 with `Retry-After` at once, by the gateway and not by a refused connect
//! (which would be 503); the four admitted ones complete; once they have, a new request is
//! admitted again.

use std::net::SocketAddr;
use std::time::Duration;

use ailb_tests::nacos::free_port;
use ailb_tests::{base_config, preflight, wait_until, BackendCfg, CgroupGuard, Daemon, GatewayProcess, SimServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "admit-7b";
const VIP: &str = "127.77.14.1:8000";
const LISTEN: &str = "127.0.14.1:18140";
const BACKENDS: [&str; 2] = ["127.0.14.11:18141", "127.0.14.12:18142"];
const CAP: u32 = 2;
/// 200 tokens at the simulator's 40 tokens a second in real time: a stream of about 5 s.
const MAX_TOKENS: u32 = 200;

fn request(i: usize, stream: bool) -> String {
    let body = format!(
        r#"{{"model":"{MODEL}","stream":{stream},"max_tokens":{MAX_TOKENS},"messages":[{{"role":"user","content":"request {i}"}}]}}"#
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The kernel's in-flight count of the model.
fn model_inflight(d: &Daemon) -> u64 {
    let st = d.status();
    st["models"].as_array().and_then(|m| m.first()).and_then(|m| m["inflight"].as_u64()).unwrap_or(u64::MAX)
}

/// Sends a streamed request and reads until its first token event (it is then in flight).
async fn open_stream(i: usize) -> (TcpStream, String) {
    let mut s = TcpStream::connect(LISTEN).await.expect("connect to the gateway");
    s.write_all(request(i, true).as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("chat.completion.chunk") {
        let n = s.read(&mut buf).await.expect("read the stream");
        assert!(n > 0, "request {i}: closed before its first event: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    (s, String::from_utf8_lossy(&raw).into_owned())
}

/// One whole non-streamed exchange.
async fn exchange(i: usize) -> String {
    let mut s = TcpStream::connect(LISTEN).await.expect("connect to the gateway");
    s.write_all(request(i, false).as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read the answer");
    String::from_utf8_lossy(&raw).into_owned()
}

#[test]
fn above_the_models_capacity_the_front_door_answers_429_with_retry_after() {
    let bin = preflight();
    let cg = CgroupGuard::new("gw-admit");
    let _sims: Vec<SimServer> = BACKENDS.iter().map(|b| SimServer::start(b, MODEL, &["--time-scale", "1"])).collect();
    let mut cfg = base_config("gw-admit", &cg).service(MODEL, VIP);
    for addr in BACKENDS {
        let mut b = BackendCfg::new(MODEL, addr, 1);
        b.max_inflight = Some(CAP);
        cfg = cfg.backend(b);
    }
    cfg.listen = Some(format!("127.0.0.1:{}", free_port()));
    cfg.extra = format!("[gateway]\nlisten = [\"{LISTEN}\"]\nadmission = true\n");
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = LISTEN.parse().unwrap();
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, listen);
    gateway.wait_for_log("admission per model on");
    let capacity = (CAP as usize) * BACKENDS.len();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut held = Vec::new();
        for i in 0..capacity {
            let (s, head) = open_stream(i).await;
            assert!(head.starts_with("HTTP/1.1 200"), "request {i} is admitted: {head}");
            held.push(s);
            wait_until("the kernel to count the held request", Duration::from_secs(5), || {
                (model_inflight(&daemon) == (i + 1) as u64).then_some(())
            });
        }
        for i in capacity..capacity + 2 {
            let answer = exchange(i).await;
            let head = answer.split("\r\n\r\n").next().unwrap_or("").to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 429"), "request {i} over the capacity: {answer}");
            assert!(head.contains("retry-after: 1"), "with Retry-After: {answer}");
            assert!(answer.contains("model_at_capacity") && answer.contains(MODEL), "{answer}");
        }
        assert_eq!(model_inflight(&daemon), capacity as u64, "the shed requests never reached a backend");
        for (i, mut s) in held.into_iter().enumerate() {
            let mut rest = Vec::new();
            let read = s.read_to_end(&mut rest);
            tokio::time::timeout(Duration::from_secs(30), read).await.expect("the stream ends").expect("read");
            let rest = String::from_utf8_lossy(&rest);
            assert!(rest.contains("[DONE]"), "admitted request {i} completes: {rest}");
        }
        daemon.wait_inflight_zero(Duration::from_secs(5));
        let answer = exchange(99).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "admitted again once the capacity is free: {answer}");
    });
    drop(gateway);
}
