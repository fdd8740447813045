//! The front door under misbehaving clients, end to end: `ailb gateway` runs INSIDE the test's
//! child cgroup in front of `ailb-sim` servers (one VIP), the clients are outside it.
//! - Slow clients (a request head cut short, a head sent a byte at a time, a body sent a byte
//!   at a time, a kept-alive connection left idle after one answer) are cut off by the gateway
//!   after `gateway.header_timeout` (the head, closed; the body, counted from the end of the
//!   head, answered 408; the idle connection, counted from the end of its answer, closed), and
//!   while they hang, 50 other clients on their own connections are answered in normal time.
//! - A client that goes away in the middle of a streamed chat completion frees the model
//!   server's running slot at once (the simulator's `vllm:num_requests_running` drops back to 0
//!   long before the stream would have ended), and the gateway logs the request as
//!   "client gone".

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ailb_tests::sim::{http_get, metric_value};
use ailb_tests::{base_config, preflight, wait_until, BackendCfg, CgroupGuard, Daemon, GatewayProcess, SimServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "faults-7b";

/// `ailb run` with one `ailb-sim` per address behind `vip` (weight 1 each), and the gateway
/// on `listen` inside `cg` with `gateway_toml` (lines of the `[gateway]` section).
fn front_door(
    name: &str,
    cg: &CgroupGuard,
    vip: &str,
    listen: &str,
    backends: &[&str],
    sim_args: &[&str],
    gateway_toml: &str,
) -> (Vec<SimServer>, Daemon, GatewayProcess) {
    let bin = preflight();
    let sims: Vec<SimServer> = backends.iter().map(|b| SimServer::start(b, MODEL, sim_args)).collect();
    let mut cfg = base_config(name, cg).service(MODEL, vip);
    for addr in backends {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1));
    }
    cfg.extra = format!("[gateway]\nlisten = [\"{listen}\"]\n{gateway_toml}");
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = listen.parse().expect("gateway address");
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), cg, listen);
    (sims, daemon, gateway)
}

/// A chat completion request as raw HTTP/1.1 bytes.
fn chat_request(body: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The gateway of the slow-client test.
const GATEWAY: &str = "127.0.12.1:18120";
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
const TOTAL_TIMEOUT: Duration = Duration::from_secs(6);
/// How long after its timeout the gateway may take to close a slow connection.
const CUT_SLACK: Duration = Duration::from_secs(2);
/// Each normal request's bound while the slow clients hang: half the header timeout (a slow
/// client that held up the others would push them past it).
const NORMAL_LIMIT: Duration = Duration::from_secs(1);
const NORMAL_CLIENTS: usize = 50;
/// A trickling client sends one byte this often.
const DRIP_EVERY: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slow {
    /// Sends part of a request head, then nothing.
    PartialHead,
    /// Sends part of a head, then one byte of a header that never ends every [`DRIP_EVERY`].
    TrickleHead,
    /// Sends a whole head announcing a 1,000-byte body, then one body byte every [`DRIP_EVERY`].
    TrickleBody,
    /// Waits [`FIRST_AFTER`], sends one whole request, reads its answer and then sends nothing:
    /// the kept-alive connection waits idle for its next head, which `header_timeout` bounds
    /// from the end of the answer (not from the connect).
    IdleAfterAnswer,
}

/// How long an [`Slow::IdleAfterAnswer`] client waits before its one request (within
/// `header_timeout`, so the request is taken).
const FIRST_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct SlowOutcome {
    kind: Slow,
    /// From just before the connect to the gateway's close (EOF or reset).
    closed_after: Option<Duration>,
    /// What the gateway sent before closing.
    answer: String,
}

/// One slow client: connects, sends its first bytes, says so on `ready`, then keeps dripping
/// (if it does) and reading until the gateway closes the connection or `give_up` passes.
async fn slow_client(kind: Slow, ready: tokio::sync::mpsc::Sender<()>, give_up: Duration) -> SlowOutcome {
    let t0 = Instant::now();
    let stream = TcpStream::connect(GATEWAY).await.expect("connect to the gateway");
    let (mut rd, mut wr) = stream.into_split();
    let first = match kind {
        Slow::PartialHead => "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Ty".to_string(),
        Slow::TrickleHead => "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Slow: ".to_string(),
        Slow::TrickleBody => format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n\
             Content-Length: 1000\r\n\r\n{{\"model\": \"{MODEL}\", \"x\": \""
        ),
        Slow::IdleAfterAnswer => String::new(),
    };
    wr.write_all(first.as_bytes()).await.expect("the first bytes of a slow client");
    let _ = ready.send(()).await;
    if kind == Slow::IdleAfterAnswer {
        tokio::time::sleep(FIRST_AFTER).await;
        let body =
            format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"idle after"}}],"max_tokens":1}}"#);
        wr.write_all(chat_request(&body).as_bytes()).await.expect("the idle client's one request");
    }
    let mut dripping = matches!(kind, Slow::TrickleHead | Slow::TrickleBody);
    let mut tick = tokio::time::interval(DRIP_EVERY);
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + give_up;
    let closed_after = loop {
        tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(0) | Err(_) => break Some(t0.elapsed()),
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            _ = tick.tick(), if dripping => {
                // A write can fail once the gateway has closed; the read then sees the end.
                dripping = wr.write_all(b"a").await.is_ok();
            }
            _ = tokio::time::sleep_until(deadline) => break None,
        }
    };
    SlowOutcome { kind, closed_after, answer: String::from_utf8_lossy(&answer).into_owned() }
}

/// One normal request on its own connection: (status line, latency).
async fn normal_request(i: usize) -> (String, Duration) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(GATEWAY).await.expect("connect to the gateway");
    let body = format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"normal {i}"}}],"max_tokens":1}}"#);
    let req = chat_request(&body).replace("Host: gw\r\n", "Host: gw\r\nConnection: close\r\n");
    s.write_all(req.as_bytes()).await.expect("send a normal request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read a normal answer");
    let text = String::from_utf8_lossy(&raw);
    (text.lines().next().unwrap_or("").to_string(), t0.elapsed())
}

#[test]
fn slow_clients_are_cut_off_without_delaying_others() {
    let cg = CgroupGuard::new("gw-slow");
    let gateway_toml = format!(
        "header_timeout = \"{}s\"\ntotal_timeout = \"{}s\"\n",
        HEADER_TIMEOUT.as_secs(),
        TOTAL_TIMEOUT.as_secs()
    );
    let backends = ["127.0.12.11:18121", "127.0.12.12:18122"];
    let (sims, daemon, gateway) =
        front_door("gw-slow", &cg, "127.77.12.1:8000", GATEWAY, &backends, &["--time-scale", "50"], &gateway_toml);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    let kinds: Vec<Slow> =
        [(Slow::PartialHead, 10), (Slow::TrickleHead, 10), (Slow::TrickleBody, 5), (Slow::IdleAfterAnswer, 5)]
            .into_iter()
            .flat_map(|(k, n)| std::iter::repeat_n(k, n))
            .collect();
    let give_up = TOTAL_TIMEOUT + CUT_SLACK + Duration::from_secs(5);
    let (slow, normal, normal_done_after) = rt.block_on(async {
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(kinds.len());
        let slow_start = Instant::now();
        let slow: Vec<_> = kinds.iter().map(|&k| tokio::spawn(slow_client(k, ready_tx.clone(), give_up))).collect();
        drop(ready_tx);
        for _ in 0..kinds.len() {
            ready_rx.recv().await.expect("every slow client sends its first bytes");
        }
        // Every slow client hangs now; the normal ones go, all at once, each on its own connection.
        let normal: Vec<_> = (0..NORMAL_CLIENTS).map(|i| tokio::spawn(normal_request(i))).collect();
        let mut answers = Vec::new();
        for n in normal {
            answers.push(n.await.expect("a normal client task"));
        }
        let normal_done_after = slow_start.elapsed();
        let mut outcomes = Vec::new();
        for s in slow {
            outcomes.push(s.await.expect("a slow client task"));
        }
        (outcomes, answers, normal_done_after)
    });
    let log = gateway.log();

    for (i, (status, took)) in normal.iter().enumerate() {
        assert!(status.starts_with("HTTP/1.1 200"), "normal request {i}: {status:?}; gateway log:\n{log}");
        assert!(
            took < &NORMAL_LIMIT,
            "normal request {i} took {took:?} while slow clients hung (limit {NORMAL_LIMIT:?})"
        );
    }
    // The normal requests ran while every slow connection was still open.
    assert!(normal_done_after < HEADER_TIMEOUT, "the {NORMAL_CLIENTS} normal requests took {normal_done_after:?}");
    for o in &slow {
        let closed = o.closed_after.unwrap_or_else(|| {
            panic!("a {:?} client was still connected after {give_up:?}; it got {:?}", o.kind, o.answer)
        });
        // A body is held to `header_timeout` too, from the end of its head (sent at once); an idle
        // kept-alive connection, from the end of its answer.
        let limit = if o.kind == Slow::IdleAfterAnswer { FIRST_AFTER + HEADER_TIMEOUT } else { HEADER_TIMEOUT };
        assert!(
            closed >= limit && closed <= limit + CUT_SLACK,
            "a {:?} client was cut off after {closed:?}, expected {limit:?} to {:?}; it got {:?}",
            o.kind,
            limit + CUT_SLACK,
            o.answer
        );
        // Cut without an answer, or with one that says it timed out; the idle client's one
        // request answered, and nothing after it.
        let allowed: &[&str] = if o.kind == Slow::IdleAfterAnswer { &["HTTP/1.1 200"] } else { &["HTTP/1.1 408"] };
        let answered = !o.answer.is_empty();
        if matches!(o.kind, Slow::TrickleBody | Slow::IdleAfterAnswer) {
            assert!(answered, "a {:?} client gets an answer, not a cut connection", o.kind);
        }
        if o.kind == Slow::IdleAfterAnswer {
            assert_eq!(o.answer.matches("HTTP/1.1 ").count(), 1, "one answer: {:?}", o.answer);
        }
        assert!(
            !answered || allowed.iter().any(|a| o.answer.starts_with(a)),
            "a {:?} client got {:?}, expected nothing or one of {allowed:?}",
            o.kind,
            o.answer
        );
    }
    let worst = normal.iter().map(|n| n.1).max().unwrap_or_default();
    let cut: Vec<(Slow, Option<Duration>, String)> =
        slow.iter().map(|o| (o.kind, o.closed_after, o.answer.lines().next().unwrap_or("").to_string())).collect();
    eprintln!("normal requests: worst {worst:?}, all done after {normal_done_after:?}; slow clients: {cut:?}");
    drop(gateway);
    drop(daemon);
    drop(sims);
}

#[test]
fn a_client_gone_mid_stream_frees_the_servers_running_slot() {
    // In real time (--time-scale 1) the simulated GPU decodes 40 tokens a second: 400 tokens
    // stream for about 10 s.
    const MAX_TOKENS: u32 = 400;
    const STREAM_TAKES: Duration = Duration::from_secs(10);
    /// From the client's close to the server's slot free again: the gateway notices at its next
    /// write to the client (a token every 25 ms) and closes the upstream, whose server notices
    /// at its next write.
    const FREED_WITHIN: Duration = Duration::from_secs(3);
    const LISTEN: &str = "127.0.12.2:18123";
    let cg = CgroupGuard::new("gw-gone");
    let backend = "127.0.12.21:18124";
    let (sims, daemon, gateway) =
        front_door("gw-gone", &cg, "127.77.12.2:8000", LISTEN, &[backend], &["--time-scale", "1"], "");
    let sim = &sims[0];
    let running = || sim.gauge("vllm:num_requests_running");
    assert_eq!(running(), 0.0, "the server runs nothing before the test's request");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let body = format!(
        r#"{{"model":"{MODEL}","stream":true,"max_tokens":{MAX_TOKENS},"messages":[{{"role":"user","content":"a long answer please"}}]}}"#
    );
    let started = Instant::now();
    let (head, events) = rt.block_on(async {
        let mut s = TcpStream::connect(LISTEN).await.expect("connect to the gateway");
        s.write_all(chat_request(&body).as_bytes()).await.expect("send the streamed request");
        // Read until two token events have come through (the stream is running).
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        let read = async {
            while String::from_utf8_lossy(&raw).matches("chat.completion.chunk").count() < 2 {
                let n = s.read(&mut buf).await.expect("read the stream");
                assert!(n > 0, "the gateway closed the stream early: {}", String::from_utf8_lossy(&raw));
                raw.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read).await.expect("the first events within 10 s");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let head = text.split("\r\n\r\n").next().unwrap_or("").to_string();
        // Still running on the server and in flight in the gateway, with the client connected.
        let events = text.matches("chat.completion.chunk").count();
        assert!(running() >= 1.0, "the server runs the streamed request: {}", http_get(backend, "/metrics"));
        let gw_metrics = http_get(LISTEN, "/metrics");
        assert_eq!(metric_value(&gw_metrics, "ailb_gateway_in_flight"), Some(1.0), "{gw_metrics}");
        drop(s);
        (head, events)
    });
    let dropped_at = Instant::now();
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("text/event-stream"), "{head}");
    assert!(head.contains(backend), "x-ailb-backend names the one backend: {head}");

    wait_until("the server's running slot to be freed", FREED_WITHIN, || (running() == 0.0).then_some(()));
    let freed_after = dropped_at.elapsed();
    let since_start = started.elapsed();
    assert!(
        since_start < STREAM_TAKES - Duration::from_secs(3),
        "freed {since_start:?} after the request: not well before its stream's end ({STREAM_TAKES:?})"
    );
    // The gateway counts it no longer in flight and logs it as ended by the client.
    wait_until("the gateway to count no request in flight", Duration::from_secs(3), || {
        let m = http_get(LISTEN, "/metrics");
        (metric_value(&m, "ailb_gateway_in_flight") == Some(0.0)).then_some(())
    });
    let access = wait_until("the access-log line of the request", Duration::from_secs(3), || {
        gateway
            .log()
            .lines()
            .find(|l| l.contains("ailb::gateway::access") && l.contains("chat/completions"))
            .map(String::from)
    });
    assert!(access.contains("client gone"), "the access log names the client's leaving: {access}");
    eprintln!("{events} events read; slot freed {freed_after:?} after the close; access log: {access}");
    drop(gateway);
    drop(daemon);
    drop(sims);
}
