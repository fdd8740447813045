use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

use super::*;

/// A one-connection server on loopback that reads a request (head and `Content-Length` body),
/// answers `reply` and returns what it received.
fn serve_once(reply: &'static str) -> (SocketAddrV4, std::thread::JoinHandle<String>) {
    let (addr, t) = serve(1, reply);
    (addr, std::thread::spawn(move || t.join().expect("server").remove(0)))
}

/// [`serve_once`] for `n` connections one after another; returns what each received.
fn serve(n: usize, reply: &'static str) -> (SocketAddrV4, std::thread::JoinHandle<Vec<String>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = match l.local_addr().expect("addr") {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("not v4: {other}"),
    };
    let t = std::thread::spawn(move || (0..n).map(|_| one(&l, reply)).collect());
    (addr, t)
}

fn one(l: &TcpListener, reply: &str) -> String {
    {
        let (s, _) = l.accept().expect("accept");
        let mut r = BufReader::new(s.try_clone().expect("clone"));
        let (mut head, mut line, mut len) = (String::new(), String::new(), 0usize);
        loop {
            line.clear();
            r.read_line(&mut line).expect("read");
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().expect("length");
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).expect("body");
        let mut s = s;
        s.write_all(reply.as_bytes()).expect("write");
        head + &String::from_utf8_lossy(&body)
    }
}

#[test]
fn with_several_addresses_each_tenant_goes_to_one_of_them() {
    const OK: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 61\r\n\r\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";
    let (a, ta) = serve(3, OK);
    let (b, tb) = serve(2, OK);
    // Tenants 0, 1, 2, 0, 1 over two addresses: 0 and 2 to the first, 1 to the second.
    let requests: Vec<RealRequest> = [0, 1, 2, 0, 1]
        .iter()
        .map(|&t| RealRequest { tenant: Some(t), session: Some(format!("tenant-{t}")), ..req(None) })
        .collect();
    let (records, _) = run(&[a, b], &requests, 1, Duration::from_secs(10));
    assert!(records.iter().all(Record::ok), "{records:?}");
    let tenants = |got: Vec<String>| -> Vec<String> {
        got.iter().map(|r| r.split("X-Session-ID: ").nth(1).unwrap_or("").lines().next().unwrap_or("").into()).collect()
    };
    assert_eq!(tenants(ta.join().expect("server a")), ["tenant-0", "tenant-2", "tenant-0"]);
    assert_eq!(tenants(tb.join().expect("server b")), ["tenant-1", "tenant-1"]);
}

fn req(session: Option<&str>) -> RealRequest {
    RealRequest {
        body: serde_json::json!({"model": "m", "messages": [], "stream": true}),
        session: session.map(str::to_string),
        tag_conversation: None,
        memory_mb: 0,
        tenant: None,
    }
}

#[test]
fn a_chunked_stream_split_mid_line_gives_its_first_token_and_usage() {
    // The usage line is cut across two chunks, as a proxy may cut it.
    let (addr, server) = serve_once(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
         2c\r\ndata: {\"choices\":[{\"delta\":{\"role\":\"a\"}}]}\n\n\r\n\
         30\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\r\n\
         22\r\ndata: {\"choices\":[],\"usage\":{\"prom\r\n\
         56\r\npt_tokens\":300,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\n\r\n\
         e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
    );
    let rec = send(addr, 3, &req(Some("conv-1")), Duration::from_secs(10));
    let sent = server.join().expect("server");
    assert!(rec.ok(), "{rec:?}");
    assert_eq!(
        (rec.index, rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens),
        (3, Some(300), Some(256), Some(2))
    );
    assert!(rec.ttft_ms.is_some_and(|t| t <= rec.e2e_ms), "{rec:?}");
    assert!(sent.contains("X-Session-ID: conv-1\r\n") && sent.ends_with("\"stream\":true}"), "{sent}");
}

#[test]
fn a_refusal_and_a_stream_cut_short_are_failures_that_say_why() {
    let (addr, server) = serve_once("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\n\r\nno backend!");
    let rec = send(addr, 0, &req(None), Duration::from_secs(10));
    let sent = server.join().expect("server");
    assert!(!sent.contains("X-Session-ID"), "no session, no header: {sent}");
    assert_eq!(rec.status, Some(503));
    assert_eq!(rec.error.as_deref(), Some("HTTP 503: no backend!"));

    let (addr, server) = serve_once(
        "HTTP/1.1 200 OK\r\nContent-Length: 46\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n",
    );
    let rec = send(addr, 0, &req(None), Duration::from_secs(10));
    server.join().expect("server");
    assert!(!rec.ok() && rec.error.as_deref() == Some("stream ended without data: [DONE]"), "{rec:?}");
}
