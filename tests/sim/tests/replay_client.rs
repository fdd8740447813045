//! The `ailb-replay` client and runner against a tiny fake SSE server on 127.0.0.1 (no root:
//! without ailb the ABI `setsockopt` gets `ENOPROTOOPT` and the client connects untagged).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver};
use std::thread::sleep;
use std::time::{Duration, Instant};

use ailb_sim::replay::client::send;
use ailb_sim::replay::{run, RequestSpec, RunOpts};
use serde_json::Value;

/// Gap between the fake server's token chunks.
const STEP: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Chunked SSE: header, STEP, token, STEP, token, usage chunk, [DONE].
    Chunked,
    /// The same events without chunked encoding, ended by closing.
    Plain,
    /// HTTP 503 with a message.
    Unavailable,
    /// One token, then the connection closes without [DONE].
    Truncated,
    /// Reads the request and says nothing.
    Silent,
}

/// Reads one HTTP request and returns its JSON body.
/// The request's JSON body and its `X-Session-ID` header.
fn read_request(s: &mut TcpStream) -> (Value, Option<String>) {
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let (mut line, mut len, mut session) = (String::new(), 0usize, None);
    loop {
        line.clear();
        r.read_line(&mut line).expect("read request head");
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().expect("content length");
        }
        if l.starts_with("x-session-id:") {
            session = line.trim_end().split_once(':').map(|(_, v)| v.trim().to_string());
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).expect("read request body");
    (serde_json::from_slice(&body).expect("request body is JSON"), session)
}

fn serve(mut s: TcpStream, mode: Mode, backend: &str) {
    let events = [
        r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"tok "}}]}"#.to_string(),
        format!(r#"{{"system_fingerprint":"{backend}","choices":[{{"index":0,"delta":{{"content":"tok "}}}}]}}"#),
        r#"{"choices":[],"usage":{"prompt_tokens":1200,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1024}}}"#
            .to_string(),
        "[DONE]".to_string(),
    ];
    let chunk = |s: &mut TcpStream, data: &str, chunked: bool| {
        let ev = format!("data: {data}\n\n");
        let out = if chunked { format!("{:x}\r\n{ev}\r\n", ev.len()) } else { ev };
        let _ = s.write_all(out.as_bytes());
    };
    match mode {
        Mode::Chunked | Mode::Plain => {
            let chunked = mode == Mode::Chunked;
            let te = if chunked { "Transfer-Encoding: chunked\r\n" } else { "" };
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{te}\r\n");
            sleep(STEP);
            chunk(&mut s, &events[0], chunked);
            sleep(STEP);
            for e in &events[1..] {
                chunk(&mut s, e, chunked);
            }
            if chunked {
                let _ = s.write_all(b"0\r\n\r\n");
            }
        }
        Mode::Unavailable => {
            let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 8\r\n\r\nno slots");
        }
        Mode::Truncated => {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n");
            chunk(&mut s, &events[0], false);
        }
        Mode::Silent => sleep(Duration::from_secs(3)),
    }
}

/// A fake server on 127.0.0.1 that serves `conns` connections (each on its own thread) and
/// hands every request body to the returned receiver.
fn fake(mode: Mode, conns: usize) -> (SocketAddrV4, Receiver<(Value, Option<String>)>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = match l.local_addr().expect("local addr") {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("expected an IPv4 address, got {other}"),
    };
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for i in 0..conns {
            let (mut s, _) = l.accept().expect("accept");
            let tx = tx.clone();
            std::thread::spawn(move || {
                let body = read_request(&mut s);
                let _ = tx.send(body);
                serve(s, mode, &format!("fake-{}", i % 2));
            });
        }
    });
    (addr, rx)
}

fn spec(index: usize, at_ms: u64, conversation: &str) -> RequestSpec {
    RequestSpec {
        index,
        line: Some(index + 1),
        at_ms,
        conversation: conversation.into(),
        memory_mb: 3629,
        prompt_tokens: 1200,
        max_tokens: 2,
        hash_ids: vec![0, 5, 6],
        message_ends: Vec::new(),
        model: "sim-7b".into(),
        tag_socket: true,
        prefix_keys: false,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
fn streamed_response_gives_ttft_e2e_tokens_cache_and_backend() {
    for mode in [Mode::Chunked, Mode::Plain] {
        let (vip, bodies) = fake(mode, 1);
        let rec = send(vip, &spec(0, 0, "conv-5"), Duration::from_secs(10));
        assert!(rec.ok(), "request failed: {rec:?}");
        assert_eq!(rec.status, Some(200));
        let ttft = rec.ttft_ms.expect("a first token");
        // The first token leaves one STEP after the head and the end a second STEP later: those
        // are lower bounds. The upper bounds only catch a client that waits for something else
        // (a full second of slack for a loaded CI machine).
        assert!(ttft >= ms(STEP) && ttft < ms(STEP) + 1000.0, "ttft {ttft} ms with a {STEP:?} step");
        assert!(rec.e2e_ms >= 2.0 * ms(STEP) && rec.e2e_ms < 2.0 * ms(STEP) + 1000.0, "e2e {} ms", rec.e2e_ms);
        assert!(ttft < rec.e2e_ms, "ttft {ttft} ms, e2e {} ms", rec.e2e_ms);
        assert_eq!(rec.tokens, 2, "usage.completion_tokens");
        assert_eq!(rec.cached_tokens, Some(1024));
        assert_eq!(rec.backend.as_deref(), Some("fake-0"), "system_fingerprint");
        assert!(!rec.tagged, "no ailb here: setsockopt must have said ENOPROTOOPT");
        let (body, session) = bodies.recv_timeout(Duration::from_secs(5)).expect("the server saw a body");
        assert_eq!(body["stream"], true);
        assert_eq!(body["model"], "sim-7b");
        // The prompt as text, no side channel: blocks 0, 5, 6 rendered, 1200 tokens of 4 bytes.
        let content = body["messages"][0]["content"].as_str().expect("a text prompt");
        assert_eq!(content, ailb_sim::text::prompt_text(&[0, 5, 6], 1200, 0));
        assert_eq!(content.len(), 4800);
        assert_eq!(body["max_tokens"], 2);
        assert!(body.get("ailb_sim").is_none(), "{body}");
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(session.as_deref(), Some("conv-5"), "the conversation as X-Session-ID");
    }
}

#[test]
fn failures_are_recorded_not_fatal() {
    let (vip, _b) = fake(Mode::Unavailable, 1);
    let rec = send(vip, &spec(0, 0, "c"), Duration::from_secs(5));
    assert_eq!(rec.status, Some(503));
    assert!(!rec.ok() && rec.error.as_deref().is_some_and(|e| e.contains("503") && e.contains("no slots")), "{rec:?}");

    let (vip, _b) = fake(Mode::Truncated, 1);
    let rec = send(vip, &spec(0, 0, "c"), Duration::from_secs(5));
    assert!(rec.error.as_deref().is_some_and(|e| e.contains("[DONE]")), "{rec:?}");
    assert!(rec.ttft_ms.is_some(), "the one token still counts for TTFT");

    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let std::net::SocketAddr::V4(closed) = closed else { panic!("IPv4 expected") };
    let rec = send(closed, &spec(0, 0, "c"), Duration::from_secs(5));
    assert!(rec.error.as_deref().is_some_and(|e| e.contains("connect")), "{rec:?}");
    assert_eq!(rec.status, None);

    let (vip, _b) = fake(Mode::Silent, 1);
    let t = Instant::now();
    let rec = send(vip, &spec(0, 0, "c"), Duration::from_millis(300));
    assert!(rec.error.is_some(), "{rec:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "the request timeout bounds a silent server: {:?}", t.elapsed());
}

#[test]
fn runner_scales_arrivals_and_summarises() {
    let (vip, bodies) = fake(Mode::Chunked, 6);
    // Two conversations of three turns; the fake alternates fake-0 / fake-1 by connection.
    let specs: Vec<RequestSpec> =
        (0..6).map(|i| spec(i, i as u64 * 1000, if i % 2 == 0 { "a" } else { "b" })).collect();
    let opts = RunOpts {
        vip,
        speed: 10.0,
        concurrency: 4,
        request_timeout: Duration::from_secs(5),
        deadline: Duration::from_secs(20),
        progress: false,
    };
    let (records, summary) = run(&specs, &opts);
    assert_eq!(records.len(), 6);
    assert_eq!(summary.failures, 0, "{records:#?}");
    for r in &records {
        // Sent at at_ms / speed, never early.
        assert!(r.sent_ms + 1.0 >= r.at_ms as f64 / 10.0, "{r:?}");
    }
    assert_eq!(summary.output_tokens, 12);
    assert_eq!(summary.prefix_cache_hit_rate, Some(1024.0 / 1200.0));
    assert!(summary.affinity_hit_rate.is_some());
    let e2e = summary.e2e_ms.expect("e2e percentiles");
    assert!(e2e.p50 >= 2.0 * ms(STEP) && e2e.p99 >= e2e.p50);
    assert_eq!(bodies.try_iter().count(), 6);
    let json = ailb_sim::replay::report_json(&summary, &records);
    assert_eq!(json["requests"].as_array().map(Vec::len), Some(6));
    assert_eq!(json["summary"]["failure_rate"], 0.0);
}

#[test]
fn the_global_deadline_bounds_the_replay() {
    let (vip, _b) = fake(Mode::Chunked, 1);
    let specs = vec![spec(0, 0, "a"), spec(1, 3_600_000, "a")];
    let opts = RunOpts {
        vip,
        speed: 1.0,
        concurrency: 2,
        request_timeout: Duration::from_secs(5),
        deadline: Duration::from_secs(1),
        progress: true,
    };
    let t = Instant::now();
    let (records, summary) = run(&specs, &opts);
    assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
    assert!(records[0].ok(), "{:?}", records[0]);
    assert!(records[1].error.as_deref().is_some_and(|e| e.contains("deadline")), "{:?}", records[1]);
    assert_eq!(summary.failures, 1);
}

#[test]
fn gateway_mode_sends_plain_http_with_the_session_and_the_model_to_the_gateway() {
    let (gateway, bodies) = fake(Mode::Chunked, 3);
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("report.json");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_ailb-replay"))
        .args(["--synthetic", "--limit", "3", "--speed", "100", "--quiet", "--model", "gw-model", "--gateway"])
        .arg(gateway.to_string())
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run ailb-replay");
    assert!(status.success(), "ailb-replay --gateway failed: {status}");
    let got: Vec<(Value, Option<String>)> = bodies.try_iter().collect();
    assert_eq!(got.len(), 3, "every request reached the gateway's address");
    for (body, session) in &got {
        assert_eq!(body["model"], "gw-model", "{body}");
        assert!(session.as_deref().is_some_and(|s| !s.is_empty()), "X-Session-ID carries the conversation");
    }
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("report")).expect("JSON");
    for r in report["requests"].as_array().expect("requests") {
        assert_eq!(r["tagged"], false, "no socket tag in gateway mode: {r}");
        assert_eq!(r["memory_mb"], 0, "no memory tag in gateway mode: {r}");
        assert_eq!(r["status"], 200, "{r}");
    }
    let conflict = std::process::Command::new(env!("CARGO_BIN_EXE_ailb-replay"))
        .args(["--synthetic", "--untagged", "--gateway", "127.0.0.1:1", "--parse-only"])
        .output()
        .expect("run ailb-replay");
    assert!(!conflict.status.success(), "--gateway and --untagged exclude each other");
}
