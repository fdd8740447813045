use super::*;
use crate::gateway::client::h1::head::{parse, Parsed};
use hyper::Version;
use proptest::prelude::*;

fn raw(text: &str) -> ReqHead {
    match parse(text.as_bytes()) {
        Parsed::Request(h) => h.into_raw(Bytes::copy_from_slice(text.as_bytes())).into(),
        other => panic!("{text:?}: {other:?}"),
    }
}

fn up(head: ReqHead, body: &'static str) -> UpRequest {
    UpRequest {
        head,
        body: Bytes::from_static(body.as_bytes()),
        client: ClientIp::new("10.0.0.9:5000".parse().unwrap()),
    }
}

fn encoded(r: &UpRequest) -> String {
    let mut out = Vec::new();
    r.encode_head(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn hop_by_hop_and_connection_named_headers_stay_behind() {
    let text = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive, X-Secret\r\n\
                Keep-Alive: 5\r\nX-Secret: s\r\nTE: trailers\r\nX-Session-ID: a\r\nContent-Length: 2\r\n\r\n";
    let r = up(raw(text), "{}");
    assert_eq!(
        encoded(&r),
        "POST /v1/completions?x=1 HTTP/1.1\r\nHost: gw\r\nX-Session-ID: a\r\nContent-Length: 2\r\n\
         x-forwarded-for: 10.0.0.9\r\n\r\n"
    );
    let h = r.to_hyper();
    assert_eq!(h.uri(), "/v1/completions?x=1");
    let names: Vec<&str> = h.headers().keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["host", "x-session-id", "content-length", "x-forwarded-for"]);
}

#[test]
fn a_plain_head_is_copied_as_it_came_and_reads_as_a_rewritten_one_does() {
    let heads = [
        ("POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nX-Session-ID: a\r\nContent-Length: 2\r\n\r\n", "{}"),
        ("GET /v1/models HTTP/1.1\r\nHost: gw\r\nAccept: */*\r\n\r\n", ""),
        ("POST /v1/embeddings HTTP/1.1\r\n\r\n", ""),
    ];
    for (text, body) in heads {
        let ReqHead::Raw(h) = raw(text) else { unreachable!() };
        assert!(h.plain().is_some(), "{text:?}");
        let copied = encoded(&up(ReqHead::Raw(h), body));
        let ReqHead::Raw(h) = raw(text) else { unreachable!() };
        let rewritten = encoded(&up(h.not_plain().into(), body));
        assert_eq!(copied, rewritten, "{text:?}");
    }
    // Spaces around a value go as they came (a rewrite trims them; both mean the same).
    let r = up(raw("GET / HTTP/1.1\r\nX-A:  v \r\n\r\n"), "");
    assert_eq!(encoded(&r), "GET / HTTP/1.1\r\nX-A:  v \r\nx-forwarded-for: 10.0.0.9\r\ncontent-length: 0\r\n\r\n");
}

#[test]
fn the_client_address_is_appended_to_the_first_forwarded_for() {
    let text = "GET / HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4\r\nA: b\r\nx-forwarded-for: 5.6.7.8\r\n\r\n";
    let r = up(raw(text), "");
    assert_eq!(
        encoded(&r),
        "GET / HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4, 10.0.0.9\r\nA: b\r\ncontent-length: 0\r\n\r\n"
    );
    assert_eq!(r.to_hyper().headers().get_all(FORWARDED_FOR).iter().collect::<Vec<_>>(), ["1.2.3.4, 10.0.0.9"]);
    let blank = up(raw("GET / HTTP/1.1\r\nX-Forwarded-For:  \r\n\r\n"), "");
    assert!(encoded(&blank).contains("\r\nX-Forwarded-For: 10.0.0.9\r\n"), "{}", encoded(&blank));
}

#[test]
fn an_http2_authority_becomes_host() {
    let mut parts = Request::new(()).into_parts().0;
    parts.uri = "http://gw.example:8080/v1/models".parse().unwrap();
    parts.version = Version::HTTP_2;
    let r = up(parts.into(), "");
    assert_eq!(
        encoded(&r),
        "GET /v1/models HTTP/1.1\r\nx-forwarded-for: 10.0.0.9\r\nhost: gw.example:8080\r\ncontent-length: 0\r\n\r\n"
    );
    assert_eq!(r.to_hyper().headers()[HOST], "gw.example:8080");
}

/// The (name, value) pairs and request line of an encoded head, as a server reads them.
fn read_back(encoded: &[u8]) -> (String, Vec<(String, String)>) {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut slots);
    assert!(matches!(req.parse(encoded), Ok(httparse::Status::Complete(n)) if n == encoded.len()), "{encoded:?}");
    let line = format!("{} {} HTTP/1.{}", req.method.unwrap(), req.path.unwrap(), req.version.unwrap());
    let headers = req
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).trim().to_string()))
        .collect();
    (line, headers)
}

fn header_line() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("Host"),
        Just("x-session-id"),
        Just("X-Model-Id"),
        Just("Content-Type"),
        Just("Accept"),
        Just("Connection"),
        Just("connection"),
        Just("Keep-Alive"),
        Just("TE"),
        Just("Proxy-Authorization"),
        Just("X-Forwarded-For"),
        Just("X-Other"),
    ];
    let space = prop_oneof![Just(""), Just(" "), Just("  "), Just("\t")];
    let end = prop_oneof![8 => Just("\r\n"), 1 => Just("\n")];
    let value = prop_oneof![
        3 => "[a-z0-9.,=/]{0,12}",
        1 => Just("keep-alive".to_string()),
        1 => Just("Keep-Alive, ".to_string()),
        1 => Just("keep-alive, close".to_string()),
        1 => Just("keep-alive, X-Other".to_string()),
    ];
    (name, space.clone(), value, space, end).prop_map(|(n, s1, v, s2, e)| format!("{n}:{s1}{v}{s2}{e}"))
}

proptest! {
    // Enough cases that heads with both a `Connection` naming a header and that header come up.
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Whether a head is copied as it came or rewritten header by header, the model server
    /// reads the same request line and the same headers, in the same order.
    #[test]
    fn a_copied_head_reads_as_the_rewritten_one(
        version in prop_oneof![4 => Just("1.1"), 1 => Just("1.0")],
        target in prop_oneof![Just("/v1/chat/completions"), Just("/v1/models?x=1"), Just("/a#frag")],
        lines in proptest::collection::vec(header_line(), 0..8),
        end in prop_oneof![8 => Just("\r\n"), 1 => Just("\n")],
    ) {
        let text = format!("POST {target} HTTP/{version}\r\n{}{end}", lines.concat());
        let Parsed::Request(h) = parse(text.as_bytes()) else { return Ok(()) };
        let raw = h.into_raw(Bytes::copy_from_slice(text.as_bytes()));
        let plain = raw.plain().is_some();
        let copied = up(raw.into(), "{}");
        let Parsed::Request(h) = parse(text.as_bytes()) else { unreachable!() };
        let rewritten = up(h.into_raw(Bytes::copy_from_slice(text.as_bytes())).not_plain().into(), "{}");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        copied.encode_head(&mut a);
        rewritten.encode_head(&mut b);
        prop_assert_eq!(read_back(&a), read_back(&b));
        if plain {
            let cut = text.lines().any(|l| l.to_ascii_lowercase().starts_with("connection:"));
            prop_assert!(cut || a.starts_with(&text.as_bytes()[..text.len() - 2]), "copied as it came");
        } else {
            prop_assert_eq!(a, b);
        }
    }
}
