//! The front door's reserve of fleet memory and its wait for a backend under `max_inflight`
//! (`[gateway.admission] mode = "fleet_memory"`, `reserve = 0.5`), end to end, against a
//! socket-ABI competitor: two `ailb-sim` servers declared with 1000 MB free and `max_inflight =
//! 2` each (a limit of 2000 MB, four connections). A client in the cgroup, outside the
//! gateway, holds three tagged streams of 700 MB each through the VIP: 2100 MB, over the limit
//! by itself, and three of the four slots.
//!
//! - A 600 MB front-door stream is admitted (the front door's 600 of its 1000 MB reserve),
//!   where without a reserve it would wait out `max_wait` for room the ABI never gives back.
//! - With that stream the four slots are taken: a 300 MB request (inside the reserve) waits,
//!   and is admitted once the stream ends and frees a slot, instead of being sent to a connect
//!   the kernel refuses.
//! - Past the reserve (600 MB held again, 600 MB more) a request waits `max_wait` and gets 503
//!   `model_overloaded` with `Retry-After`.
//!
//! The competitor is a short Python script (the socket ABI needs only `setsockopt`); without
//! `python3` the test says skipped.

mod gateway_async;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::nacos::free_port;
use ailb_tests::{base_config, preflight, BackendCfg, CgroupGuard, Daemon, GatewayProcess, SimServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "reserve-7b";
const VIP: &str = "127.77.17.1:8000";
const LISTEN: &str = "127.0.17.1:18170";
const BACKENDS: [&str; 2] = ["127.0.17.11:18171", "127.0.17.12:18172"];
const FREE_MB: u32 = 1000;
const CAP: u32 = 2;
const MAX_WAIT_MS: u64 = 1500;
const ABI_STREAMS: usize = 3;
const ABI_MB: u32 = 700;

/// Holds `n` tagged streams of `mb` each to the VIP until its stdin has a line (or closes).
const COMPETITOR: &str = r#"
import json, socket, struct, sys
SOL_AILB, AILB_REQUIRED_MEMORY_MB = 0x41494C, 2
vip, n, mb, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
host, port = vip.rsplit(":", 1)
socks = []
for i in range(n):
    s = socket.socket()
    s.setsockopt(SOL_AILB, AILB_REQUIRED_MEMORY_MB, struct.pack("=I", mb))
    s.connect((host, int(port)))
    body = json.dumps({"model": model, "stream": True, "max_tokens": 4000,
                       "messages": [{"role": "user", "content": "abi %d" % i}]})
    s.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: abi\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    socks.append(s)
for s in socks:
    head = s.recv(12)
    if not head.startswith(b"HTTP/1.1 200"):
        sys.exit("not answered 200: %r" % head)
print("HOLDING", flush=True)
sys.stdin.readline()
"#;

/// The competitor's process, killed by pid when dropped.
struct Competitor(Child);

impl Competitor {
    /// Starts it in `cg` and waits (bounded) until it holds its streams.
    fn hold(cg: &CgroupGuard) -> Self {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", COMPETITOR, VIP, &ABI_STREAMS.to_string(), &ABI_MB.to_string(), MODEL])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut me = Competitor(spawn_in_cgroup(&mut cmd, cg.path()));
        let out = me.0.stdout.take().expect("the competitor's stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("the competitor holds its streams within 30 s");
        assert_eq!(line.trim(), "HOLDING", "the competitor's streams: {line:?}");
        me
    }
}

impl Drop for Competitor {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.0.stdin.take() {
            let _ = stdin.write_all(b"done\n");
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn request(i: usize, mb: u32, stream: bool) -> String {
    gateway_async::chat_request(MODEL, &format!("front door {i}"), if stream { 400 } else { 1 }, stream, mb)
}

/// Sends a streamed request and reads until its first token event (it is then admitted), or
/// returns the whole answer when it is refused.
async fn open_stream(i: usize, mb: u32) -> (TcpStream, String) {
    let mut s = TcpStream::connect(LISTEN).await.expect("connect to the gateway");
    s.write_all(request(i, mb, true).as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("chat.completion.chunk") {
        let n = s.read(&mut buf).await.expect("read the stream");
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    (s, String::from_utf8_lossy(&raw).into_owned())
}

async fn exchange(i: usize, mb: u32) -> String {
    gateway_async::exchange_raw(LISTEN, &request(i, mb, false)).await
}

async fn metrics() -> String {
    gateway_async::metrics(LISTEN).await
}

fn decisions(text: &str, outcome: &str) -> u64 {
    gateway_async::decisions(text, MODEL, outcome)
}

async fn wait_for_waiting(n: u64) {
    gateway_async::wait_for_waiting(LISTEN, MODEL, n).await
}

#[test]
fn the_front_door_keeps_its_reserve_and_waits_for_a_slot_while_the_socket_abi_holds_the_fleet() {
    if let Err(e) = Command::new("python3").arg("-c").arg("pass").output() {
        let why = format!("python3 is needed for the socket-ABI competitor ({e})");
        return ailb_tests::report_skipped(
            "the_front_door_keeps_its_reserve_and_waits_for_a_slot_while_the_socket_abi_holds_the_fleet",
            &why,
        );
    }
    let bin = preflight();
    let cg = CgroupGuard::new("gw-reserve");
    let _sims: Vec<SimServer> = BACKENDS.iter().map(|b| SimServer::start(b, MODEL, &["--time-scale", "1"])).collect();
    let mut cfg = base_config("gw-reserve", &cg).service(MODEL, VIP);
    for addr in BACKENDS {
        let mut b = BackendCfg::new(MODEL, addr, 1).free_memory_mb(FREE_MB);
        b.max_inflight = Some(CAP);
        cfg = cfg.backend(b);
    }
    cfg.listen = Some(format!("127.0.0.1:{}", free_port()));
    cfg.extra = format!(
        "[gateway]\nlisten = [\"{LISTEN}\"]\nadmission_retry_after = \"2s\"\n\
         [gateway.admission]\nmode = \"fleet_memory\"\nmax_wait = \"{MAX_WAIT_MS}ms\"\nreserve = 0.5\n"
    );
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = LISTEN.parse().unwrap();
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, listen);
    gateway.wait_for_log("admission per model by fleet memory on");
    let competitor = Competitor::hold(&cg);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // The ABI's 2100 MB are over the 2000 MB limit alone: the reserve admits 600 MB.
        let sent = Instant::now();
        let (held, h) = open_stream(0, 600).await;
        assert!(h.starts_with("HTTP/1.1 200"), "600 MB of the 1000 MB reserve: {h}");
        assert!(sent.elapsed() < Duration::from_millis(MAX_WAIT_MS), "admitted at once ({:?})", sent.elapsed());

        // Four connections at two caps of two: inside the reserve, but no slot: it waits.
        let waiter = tokio::spawn(exchange(1, 300));
        wait_for_waiting(1).await;
        drop(held);
        let answer = waiter.await.expect("the waiting request");
        assert!(answer.starts_with("HTTP/1.1 200"), "admitted once the stream freed a slot: {answer}");

        // Past the reserve: 600 MB held again, 600 MB more waits max_wait, then 503.
        let (held, h) = open_stream(2, 600).await;
        assert!(h.starts_with("HTTP/1.1 200"), "{h}");
        let sent = Instant::now();
        let answer = exchange(3, 600).await;
        let waited = sent.elapsed();
        let head = answer.split("\r\n\r\n").next().unwrap_or("").to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 503"), "past the reserve, with the ABI over the limit: {answer}");
        assert!(head.contains("retry-after: 2"), "with Retry-After: {answer}");
        assert!(waited >= Duration::from_millis(MAX_WAIT_MS), "it waited max_wait first ({waited:?})");
        let body: serde_json::Value =
            serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or("")).expect("a JSON error body");
        assert_eq!(body["error"]["code"], "model_overloaded", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("2000 MB"), "the limit named: {message}");
        drop(held);

        let m = metrics().await;
        assert_eq!(decisions(&m, "admitted"), 2, "the two streams: {m}");
        assert_eq!(decisions(&m, "queued"), 1, "the request that waited for a slot: {m}");
        assert_eq!(decisions(&m, "shed_wait"), 1, "{m}");
    });
    drop(competitor);
    drop(gateway);
}
