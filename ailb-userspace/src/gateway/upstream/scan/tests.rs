use super::*;

type Headers = Vec<(String, String)>;

fn run(head: &[u8]) -> Result<Option<(Scanned, Headers)>, Malformed> {
    let mut slots = [(&[][..], &[][..]); MAX_HEADERS];
    let scanned = scan(head, &mut slots)?;
    Ok(scanned.map(|s| {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (s, slots[..s.headers].iter().map(|(n, v)| (text(n), text(v))).collect())
    }))
}

#[test]
fn a_head_gives_its_version_status_headers_and_length() {
    let head = b"HTTP/1.1 201 Created\r\nContent-Length:  5 \r\nX-Empty:\r\nX-Tab:\tv\t\r\n\r\nhello";
    let (s, hs) = run(head).unwrap().unwrap();
    assert_eq!((s.len, s.minor, s.code, s.headers), (head.len() - 5, 1, 201, 3));
    assert_eq!(hs, [("Content-Length", "5"), ("X-Empty", ""), ("X-Tab", "v")].map(|(n, v)| (n.into(), v.into())));
    // Bare `\n` line ends, no reason, empty lines before the status line, HTTP/1.0.
    let (s, hs) = run(b"\r\n\nHTTP/1.0 404\nA: b\n\n").unwrap().unwrap();
    assert_eq!((s.len, s.minor, s.code), (22, 0, 404));
    assert_eq!(hs, [("A".to_string(), "b".to_string())]);
    let (s, _) = run(b"HTTP/1.1 200 \r\n\r\n").unwrap().unwrap();
    assert_eq!(s.code, 200);
}

#[test]
fn an_unfinished_head_waits_for_more() {
    for part in
        [&b""[..], b"\r", b"\r\n", b"HT", b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nA: b\r\n"]
    {
        assert_eq!(run(part), Ok(None), "{:?}", String::from_utf8_lossy(part));
    }
}

#[test]
fn malformed_heads_are_refused_with_what_is_wrong() {
    let cases: [(&[u8], Malformed); 12] = [
        (b"SSH-2.0-OpenSSH", Malformed::StatusLine),
        (b"SSH-2.0-OpenSSH\r\n\r\n", Malformed::StatusLine),
        (b"HTTP/2 200 OK\r\n\r\n", Malformed::StatusLine),
        (b"HTTP/1.1  200 OK\r\n\r\n", Malformed::Status),
        (b"HTTP/1.1 20\r\n\r\n", Malformed::Status),
        (b"HTTP/1.1 099 Low\r\n\r\n", Malformed::Status),
        (b"HTTP/1.1 2000 OK\r\n\r\n", Malformed::StatusLine),
        (b"HTTP/1.1 200 O\x7fK\r\n\r\n", Malformed::StatusLine),
        (b"HTTP/1.1 200 OK\r\nNo colon\r\n\r\n", Malformed::NoColon),
        (b"HTTP/1.1 200 OK\r\nName : v\r\n\r\n", Malformed::HeaderName),
        (b"HTTP/1.1 200 OK\r\nA: b\r\n folded: c\r\n\r\n", Malformed::HeaderName),
        (b"HTTP/1.1 200 OK\r\n: v\r\n\r\n", Malformed::HeaderName),
    ];
    for (head, want) in cases {
        assert_eq!(run(head), Err(want), "{:?}", String::from_utf8_lossy(head));
    }
    let many = format!("HTTP/1.1 200 OK\r\n{}\r\n", "A: b\r\n".repeat(MAX_HEADERS + 1));
    assert_eq!(run(many.as_bytes()), Err(Malformed::TooManyHeaders));
    let most = format!("HTTP/1.1 200 OK\r\n{}\r\n", "A: b\r\n".repeat(MAX_HEADERS));
    assert_eq!(run(most.as_bytes()).unwrap().unwrap().0.headers, MAX_HEADERS);
}

#[test]
fn it_agrees_with_httparse_on_what_is_a_whole_head() {
    let heads: [&[u8]; 6] = [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nDate: x\r\n\r\n{}",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.0 500 Internal Server Error\r\nConnection: close\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: \xc3\xa9t\xc3\xa9\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\nX-B: 2\r\n",
        b"\r\nHTTP/1.1 204 No Content\r\n\r\n",
    ];
    for head in heads {
        let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut r = httparse::Response::new(&mut hs);
        let want = match r.parse(head).unwrap() {
            httparse::Status::Complete(n) => Some((n, r.version.unwrap(), r.code.unwrap(), r.headers.len())),
            httparse::Status::Partial => None,
        };
        let got = run(head).unwrap().map(|(s, _)| (s.len, s.minor, s.code, s.headers));
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(head));
    }
}
