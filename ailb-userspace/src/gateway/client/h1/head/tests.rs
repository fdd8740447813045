use super::*;
use crate::gateway::http::Headers;

fn head(text: &str) -> Head {
    match parse(text.as_bytes()) {
        Parsed::Request(h) => h,
        other => panic!("{text:?}: expected a head, got {other:?}"),
    }
}

#[test]
fn a_head_goes_upstream_as_it_came_only_when_nothing_in_it_changes() {
    let text =
        "POST /v1/chat/completions?a=1 HTTP/1.1\r\nHost: gw\r\nX-Session-ID:  s1 \r\nContent-Length: 2\r\n\r\n{}";
    let h = head(text);
    assert_eq!(h.plain, Some(Plain { has_length: true, cut: None }));
    let len = h.len;
    let raw = h.into_raw(Bytes::from_static(text.as_bytes()));
    let lines = raw.plain().unwrap();
    assert_eq!(lines.first, &text.as_bytes()[..len - 2], "the request line and header lines, spaces and all");
    assert_eq!(lines.rest, b"");
    assert_eq!(head("GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n").plain, Some(Plain { has_length: false, cut: None }));
    assert_eq!(head("GET / HTTP/1.1\r\n\r\n").plain, Some(Plain { has_length: false, cut: None }));
    // A `Connection: keep-alive` line is cut out, wherever it is.
    for (text, first, rest) in [
        (
            "GET / HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: gw\r\n",
            "Accept: */*\r\n",
        ),
        ("GET / HTTP/1.1\r\nconnection:Keep-Alive , \r\n\r\n", "GET / HTTP/1.1\r\n", ""),
    ] {
        let raw = head(text).into_raw(Bytes::copy_from_slice(text.as_bytes()));
        let lines = raw.plain().unwrap();
        assert_eq!((lines.first, lines.rest), (first.as_bytes(), rest.as_bytes()), "{text:?}");
    }
    let not_plain = [
        "GET / HTTP/1.0\r\nHost: gw\r\n\r\n",
        "GET / HTTP/1.1\nHost: gw\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: gw\n\r\n",
        "GET / HTTP/1.1\r\nHost: gw\r\n\n",
        "GET /#frag HTTP/1.1\r\nHost: gw\r\n\r\n",
        "GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\n\r\n",
        "GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: keep-alive\r\n\r\n",
        "GET / HTTP/1.1\r\nConnection: \r\n\r\n",
        "GET / HTTP/1.1\r\nKEEP-ALIVE: 5\r\n\r\n",
        "GET / HTTP/1.1\r\nTE: trailers\r\n\r\n",
        "GET / HTTP/1.1\r\nTrailer: x\r\n\r\n",
        "GET / HTTP/1.1\r\nProxy-Connection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nProxy-Authorization: x\r\n\r\n",
        "GET / HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
    ];
    for text in not_plain {
        assert_eq!(head(text).plain, None, "{text:?}");
    }
    for name in crate::gateway::http::HOP_BY_HOP.iter().chain(&["x-forwarded-for"]) {
        assert!(matches!(kind(name.as_bytes()), Kind::Rewritten | Kind::Connection | Kind::Framing), "{name}");
    }
}

#[test]
fn a_routing_header_found_while_parsing_is_the_first_of_its_name() {
    let text = "POST / HTTP/1.1\r\nX-SESSION-ID: one\r\ncookie: a=1\r\nx-session-id: two\r\n\
                X-Required-Memory-MB: 700\r\nX-Model-Id: m\r\nCookie: b=2\r\nX-Other: o\r\n\r\n";
    let raw = head(text).into_raw(Bytes::from_static(text.as_bytes()));
    for name in ROUTING.iter().chain(&["x-other", "x-absent", "X-Session-ID"]) {
        assert_eq!(raw.first(name), raw.values(name).next(), "{name}");
    }
    assert_eq!(raw.first("x-session-id"), Some(&b"one"[..]));
    assert_eq!(raw.first("x-required-memory"), None);
    assert_eq!(raw.first("cookie"), Some(&b"a=1"[..]));
    for name in ROUTING {
        assert_eq!(kind(name.as_bytes()), Kind::Routing(ROUTING.iter().position(|r| *r == name).unwrap()));
        assert_eq!(kind(name.to_ascii_uppercase().as_bytes()), kind(name.as_bytes()));
    }
}

#[test]
fn the_openai_python_clients_head_goes_upstream_as_it_came_less_its_connection_line() {
    // As the `openai` Python client 3.57.0 (httpx) sent it to a listener.
    let text = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept-Encoding: gzip, deflate\r\n\
                Connection: keep-alive\r\nauthorization: Bearer k\r\naccept: application/json\r\n\
                content-type: application/json\r\nuser-agent: OpenAI/Python 3.57.0\r\nx-stainless-lang: python\r\n\
                x-stainless-package-version: 3.57.0\r\nx-stainless-os: Linux\r\nx-stainless-arch: x64\r\n\
                x-stainless-runtime: CPython\r\nx-stainless-runtime-version: 3.11.7\r\nx-stainless-async: false\r\n\
                x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\nContent-Length: 57\r\n\r\n";
    let raw = head(text).into_raw(Bytes::from_static(text.as_bytes()));
    let lines = raw.plain().expect("plain");
    let (before, after) = text.split_once("Connection: keep-alive\r\n").unwrap();
    assert_eq!((lines.first, lines.rest), (before.as_bytes(), &after.as_bytes()[..after.len() - 2]));
    assert!(lines.has_length);
}

fn fallback(text: &[u8]) -> Fallback {
    match parse(text) {
        Parsed::Fallback(f) => f,
        other => panic!("{:?}: expected a fallback, got {other:?}", String::from_utf8_lossy(text)),
    }
}

#[test]
fn a_post_with_a_body_is_taken_and_its_body_starts_after_the_head() {
    let text =
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 7\r\nX-Session-ID: s\r\n\r\n{\"a\":1}";
    let h = head(text);
    assert_eq!(h.method, Method::POST);
    assert_eq!(h.uri.path(), "/v1/chat/completions");
    assert_eq!(h.uri.query(), Some("x=1"));
    assert_eq!(h.version, Version::HTTP_11);
    assert_eq!(h.body_len, 7);
    assert_eq!(&text[h.len..], "{\"a\":1}");
    assert!(h.keep_alive);
    let raw = h.into_raw(Bytes::from_static(text.as_bytes()));
    assert_eq!(raw.first("x-session-id"), Some(&b"s"[..]));
    assert_eq!(raw.first("HOST"), Some(&b"gw"[..]));
    let names: Vec<&[u8]> = raw.iter().map(|(n, _)| n).collect();
    assert_eq!(names, [&b"Host"[..], b"Content-Length", b"X-Session-ID"]);
    assert!(!raw.has_connection());
}

#[test]
fn a_head_split_anywhere_is_partial_until_its_last_byte() {
    let text = "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n";
    for cut in 0..text.len() {
        assert!(matches!(parse(&text.as_bytes()[..cut]), Parsed::Partial), "cut at {cut}");
    }
    assert_eq!(head(text).len, text.len());
}

#[test]
fn connection_close_and_http10_close_after_the_answer() {
    assert!(!head("GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n").keep_alive);
    assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
    assert!(!head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
    assert_eq!(head("GET / HTTP/1.0\r\n\r\n").version, Version::HTTP_10);
}

#[test]
fn what_the_fast_path_does_not_take_goes_to_hyper() {
    assert_eq!(fallback(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Fallback::Unparsed);
    assert_eq!(fallback(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), Fallback::Framing);
    assert_eq!(fallback(b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n"), Fallback::Framing);
    assert_eq!(fallback(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n"), Fallback::Framing);
    assert_eq!(fallback(b"PUT / HTTP/1.1\r\n\r\n"), Fallback::Method);
    assert_eq!(fallback(b"HEAD / HTTP/1.1\r\n\r\n"), Fallback::Method);
    assert_eq!(fallback(b"OPTIONS * HTTP/1.1\r\n\r\n"), Fallback::Method);
    assert_eq!(fallback(b"GET http://x/ HTTP/1.1\r\n\r\n"), Fallback::Target);
    assert_eq!(fallback(b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n"), Fallback::Length);
    assert_eq!(fallback(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), Fallback::Length);
    assert_eq!(fallback(b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n"), Fallback::Length);
    assert_eq!(fallback(b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"), Fallback::Unparsed);
    assert_eq!(fallback(b"\x16\x03\x01\x02\x00"), Fallback::Unparsed);
}

#[test]
fn the_same_content_length_twice_is_one_length() {
    assert_eq!(head("POST / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nab").body_len, 2);
    assert_eq!(head("POST / HTTP/1.1\r\nContent-Length:  12 \r\n\r\n").body_len, 12);
}

#[test]
fn too_many_headers_or_too_long_a_head_goes_to_hyper() {
    let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
    assert_eq!(fallback(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()), Fallback::TooLarge);
    let long = format!("GET / HTTP/1.1\r\nX-Long: {}", "a".repeat(MAX_HEAD_BYTES));
    assert_eq!(fallback(long.as_bytes()), Fallback::TooLarge);
}
