//! The front door's admission by fleet memory (`[gateway.admission] mode = "fleet_memory"`),
//! end to end: two `ailb-sim` servers declared with 1000 MB free each make the model's KV
//! capacity 2000 MB. Three streamed requests of 600 MB each (`X-Required-Memory-MB`) are held
//! open; a 100 MB request still fits and is answered 200 (under capacity nothing is shed); a
//! 600 MB request waits and is admitted once a held stream ends; the next one waits the whole
//! `max_wait` and gets 503 with `Retry-After` and an OpenAI-shaped error body. A second model
//! of the same gateway, without a declared memory, is served meanwhile. The gateway's metrics
//! count the decisions.

mod gateway_async;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ailb_tests::nacos::free_port;
use ailb_tests::{base_config, preflight, BackendCfg, CgroupGuard, Daemon, GatewayProcess, SimServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "fleet-7b";
const OTHER: &str = "other-7b";
const VIP: &str = "127.77.16.1:8000";
const OTHER_VIP: &str = "127.77.16.2:8000";
const LISTEN: &str = "127.0.16.1:18160";
const BACKENDS: [&str; 2] = ["127.0.16.11:18161", "127.0.16.12:18162"];
const OTHER_BACKEND: &str = "127.0.16.13:18163";
const FREE_MB: u32 = 1000;
const MAX_WAIT_MS: u64 = 1500;
/// 200 tokens at the simulator's 40 tokens a second in real time: a stream of about 5 s.
const MAX_TOKENS: u32 = 200;

fn request(model: &str, i: usize, mb: u32, stream: bool) -> String {
    gateway_async::chat_request(model, &format!("request {i}"), if stream { MAX_TOKENS } else { 1 }, stream, mb)
}

/// Sends a streamed request and reads until its first token event (it is then admitted).
async fn open_stream(i: usize, mb: u32) -> (TcpStream, String) {
    let mut s = TcpStream::connect(LISTEN).await.expect("connect to the gateway");
    s.write_all(request(MODEL, i, mb, true).as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("chat.completion.chunk") {
        let n = s.read(&mut buf).await.expect("read the stream");
        assert!(n > 0, "request {i}: closed before its first event: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    (s, String::from_utf8_lossy(&raw).into_owned())
}

/// One whole exchange (`max_tokens` 1 when not streamed: a short answer).
async fn exchange(model: &str, i: usize, mb: u32) -> String {
    gateway_async::exchange_raw(LISTEN, &request(model, i, mb, false)).await
}

async fn metrics() -> String {
    gateway_async::metrics(LISTEN).await
}

fn decisions(text: &str, outcome: &str) -> u64 {
    gateway_async::decisions(text, MODEL, outcome)
}

fn head(answer: &str) -> String {
    answer.split("\r\n\r\n").next().unwrap_or("").to_ascii_lowercase()
}

#[test]
fn past_the_fleets_memory_a_request_waits_then_gets_503_with_retry_after() {
    let bin = preflight();
    let cg = CgroupGuard::new("gw-fleetmem");
    let mut sims: Vec<SimServer> =
        BACKENDS.iter().map(|b| SimServer::start(b, MODEL, &["--time-scale", "1"])).collect();
    sims.push(SimServer::start(OTHER_BACKEND, OTHER, &["--time-scale", "1"]));
    let mut cfg = base_config("gw-fleetmem", &cg).service(MODEL, VIP).service(OTHER, OTHER_VIP);
    for addr in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1).free_memory_mb(FREE_MB));
    }
    cfg = cfg.backend(BackendCfg::new(OTHER, OTHER_BACKEND, 1));
    cfg.listen = Some(format!("127.0.0.1:{}", free_port()));
    cfg.extra = format!(
        "[gateway]\nlisten = [\"{LISTEN}\"]\nadmission_retry_after = \"3s\"\n\
         [gateway.admission]\nmode = \"fleet_memory\"\nmax_wait = \"{MAX_WAIT_MS}ms\"\n"
    );
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = LISTEN.parse().unwrap();
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, listen);
    gateway.wait_for_log("admission per model by fleet memory on");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // 3 x 600 = 1800 MB of the 2000: all admitted.
        let mut held = Vec::new();
        for i in 0..3 {
            let (s, h) = open_stream(i, 600).await;
            assert!(h.starts_with("HTTP/1.1 200"), "request {i} is under the capacity: {h}");
            held.push(s);
        }
        let small = exchange(MODEL, 10, 100).await;
        assert!(small.starts_with("HTTP/1.1 200"), "1900 MB fit 2000: {small}");
        let other = exchange(OTHER, 11, 600).await;
        assert!(other.starts_with("HTTP/1.1 200"), "another model is not held back: {other}");

        // 2400 MB would not fit: it waits, and is admitted once a held stream ends.
        let waiter = tokio::spawn(exchange(MODEL, 12, 600));
        let sent = Instant::now();
        wait_for_waiting(1).await;
        drop(held.remove(0));
        let answer = waiter.await.expect("the waiting request");
        assert!(answer.starts_with("HTTP/1.1 200"), "admitted after the wait: {answer}");
        assert!(sent.elapsed() < Duration::from_millis(MAX_WAIT_MS), "admitted within max_wait");

        // 1800 MB held again (two streams and a new one): the next 600 MB waits max_wait, then 503.
        let (s, h) = open_stream(13, 600).await;
        assert!(h.starts_with("HTTP/1.1 200"), "{h}");
        held.push(s);
        let sent = Instant::now();
        let answer = exchange(MODEL, 14, 600).await;
        let waited = sent.elapsed();
        let h = head(&answer);
        assert!(h.starts_with("http/1.1 503"), "past the fleet's memory for max_wait: {answer}");
        assert!(h.contains("retry-after: 3"), "with Retry-After: {answer}");
        assert!(waited >= Duration::from_millis(MAX_WAIT_MS), "it waited max_wait first ({waited:?})");
        let body: serde_json::Value =
            serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or("")).expect("a JSON error body");
        assert_eq!(body["error"]["code"], "model_overloaded", "{body}");
        assert_eq!(body["error"]["type"], "server_error", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(MODEL) && message.contains("2000 MB"), "{message}");

        let m = metrics().await;
        assert_eq!(decisions(&m, "queued"), 1, "{m}");
        assert_eq!(decisions(&m, "shed_wait"), 1, "{m}");
        assert_eq!(decisions(&m, "admitted"), 5, "the three, the small one and the fourth stream: {m}");
        for (i, mut s) in held.into_iter().enumerate() {
            let mut rest = Vec::new();
            let read = s.read_to_end(&mut rest);
            tokio::time::timeout(Duration::from_secs(30), read).await.expect("the stream ends").expect("read");
            assert!(String::from_utf8_lossy(&rest).contains("[DONE]"), "held request {i} completes");
        }
    });
    drop(gateway);
}

async fn wait_for_waiting(n: u64) {
    gateway_async::wait_for_waiting(LISTEN, MODEL, n).await
}
