//! The front door's HTTP/1 fast path: a client's bytes at a request boundary
//! (`ailb_userspace::gateway::h1::head::parse`, run on every request head `ailb gateway` reads
//! while `gateway.http1_fast_path` is on). Besides no panic: a head it takes is GET or POST,
//! HTTP/1.0 or 1.1, ends inside the input, frames its body by its one `Content-Length` and has
//! none of the headers it leaves to hyper; the same bytes cut before the head's end are only
//! the start of a head; and reading it from a longer buffer (a pipelined next request) finds
//! the same head.
#![no_main]

use ailb_userspace::gateway::h1::head::{parse, Parsed, MAX_HEAD_BYTES};
use hyper::{Method, Version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Parsed::Request(h) = parse(data) else { return };
    assert!(h.len > 0 && h.len <= data.len(), "{} of {}", h.len, data.len());
    assert!(h.parts.method == Method::GET || h.parts.method == Method::POST, "{:?}", h.parts.method);
    assert!(h.parts.version == Version::HTTP_10 || h.parts.version == Version::HTTP_11);
    assert!(h.parts.uri.path().starts_with('/'), "{:?}", h.parts.uri);
    for name in ["transfer-encoding", "upgrade", "expect"] {
        assert!(!h.parts.headers.contains_key(name), "{name} is hyper's");
    }
    let lengths: Vec<u64> = h
        .parts
        .headers
        .get_all("content-length")
        .iter()
        .map(|v| v.to_str().expect("digits").trim().parse().expect("a number"))
        .collect();
    assert!(lengths.iter().all(|n| *n == h.body_len), "{lengths:?} vs {}", h.body_len);
    if lengths.is_empty() {
        assert_eq!(h.body_len, 0, "no Content-Length, no body");
    }
    if h.parts.version == Version::HTTP_10 {
        assert!(!h.keep_alive, "HTTP/1.0 closes after the answer");
    }
    if h.len <= MAX_HEAD_BYTES {
        assert!(matches!(parse(&data[..h.len - 1]), Parsed::Partial), "a head cut short is partial");
    }
    let mut longer = data[..h.len].to_vec();
    longer.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    match parse(&longer) {
        Parsed::Request(again) => assert_eq!((again.len, again.body_len), (h.len, h.body_len)),
        other => panic!("the same head before more bytes: {other:?}"),
    }
});
