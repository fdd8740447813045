//! The front door's HTTP/1 fast path: a client's bytes at a request boundary
//! (`ailb_userspace::gateway::client::h1::head::parse`, run on every request head `ailb gateway` reads
//! while `gateway.http1_fast_path` is on). Besides no panic: a head it takes is GET or POST,
//! HTTP/1.0 or 1.1, ends inside the input, frames its body by its one `Content-Length` and has
//! none of the headers it leaves to hyper; the same bytes cut before the head's end are only
//! the start of a head; and reading it from a longer buffer (a pipelined next request) finds
//! the same head.
#![no_main]

use ailb_userspace::gateway::client::h1::head::{parse, Parsed};
use ailb_userspace::gateway::http::{Headers, MAX_HEAD_BYTES};
use hyper::{Method, Version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Parsed::Request(h) = parse(data) else { return };
    assert!(h.len > 0 && h.len <= data.len(), "{} of {}", h.len, data.len());
    assert!(h.method == Method::GET || h.method == Method::POST, "{:?}", h.method);
    assert!(h.version == Version::HTTP_10 || h.version == Version::HTTP_11);
    assert!(h.uri.path().starts_with('/'), "{:?}", h.uri);
    if h.version == Version::HTTP_10 {
        assert!(!h.keep_alive, "HTTP/1.0 closes after the answer");
    }
    let (len, body_len) = (h.len, h.body_len);
    let raw = h.into_raw(hyper::body::Bytes::copy_from_slice(data));
    for name in ["transfer-encoding", "upgrade", "expect"] {
        assert!(raw.first(name).is_none(), "{name} is hyper's");
    }
    let mut lengths: Vec<u64> = Vec::new();
    raw.find_value("content-length", |v| {
        lengths.push(std::str::from_utf8(v).expect("digits").trim().parse().expect("a number"));
        None::<()>
    });
    assert!(lengths.iter().all(|n| *n == body_len), "{lengths:?} vs {body_len}");
    if lengths.is_empty() {
        assert_eq!(body_len, 0, "no Content-Length, no body");
    }
    if len <= MAX_HEAD_BYTES {
        assert!(matches!(parse(&data[..len - 1]), Parsed::Partial), "a head cut short is partial");
    }
    let mut longer = data[..len].to_vec();
    longer.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    match parse(&longer) {
        Parsed::Request(again) => assert_eq!((again.len, again.body_len), (len, body_len)),
        other => panic!("the same head before more bytes: {other:?}"),
    }
});
