use super::*;

fn resp(status: u16, headers: &[(&str, &str)], body: Body) -> Response<Body> {
    let mut b = Response::builder().status(status);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(body).unwrap()
}

fn full(s: &'static str) -> Body {
    crate::gateway::http::full(Bytes::from_static(s.as_bytes()))
}

#[test]
fn framing_follows_the_header_then_the_size_then_the_version() {
    let with_header = resp(200, &[("content-length", "3")], full("abc"));
    assert_eq!(framing(&with_header, None, Version::HTTP_11), Framing::Length(3, false));
    assert_eq!(framing(&resp(200, &[], full("abc")), None, Version::HTTP_11), Framing::Length(3, true));
    let (_tx, chan) = http_body_util::channel::Channel::<Bytes, BoxError>::new(1);
    let stream = || resp(200, &[], chan.boxed_unsync());
    assert_eq!(framing(&stream(), None, Version::HTTP_11), Framing::Chunked);
    let (_tx, chan) = http_body_util::channel::Channel::<Bytes, BoxError>::new(1);
    let stream10 = resp(200, &[], chan.boxed_unsync());
    assert_eq!(framing(&stream10, None, Version::HTTP_10), Framing::Close);
    assert_eq!(framing(&resp(204, &[], full("")), None, Version::HTTP_11), Framing::None);
}

#[test]
fn the_head_has_a_date_a_length_and_closes_when_asked() {
    let mut out = Vec::new();
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    let both = (None, &h);
    encode_head(&mut out, Version::HTTP_11, StatusCode::PAYLOAD_TOO_LARGE, both, Framing::Length(5, true), true);
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ndate: "), "{text}");
    assert!(text.ends_with("\r\ncontent-length: 5\r\nconnection: close\r\n\r\n"), "{text}");
    let mut out = Vec::new();
    encode_head(&mut out, Version::HTTP_10, StatusCode::OK, (None, &h), Framing::Close, true);
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n") && !text.contains("connection"), "{text}");
}

#[test]
fn upstream_lines_come_first_and_their_length_and_date_count() {
    let mut lines = HeadLines::with_capacity(64);
    lines.push("Content-Length", b"3");
    lines.content_length = Some(3);
    lines.push("Date", b"Wed, 02 Dec 2026 01:00:00 GMT");
    lines.has_date = true;
    let r = resp(200, &[("x-ailb-backend", "10.0.0.1:80")], full("abc"));
    assert_eq!(framing(&r, Some(&lines), Version::HTTP_11), Framing::Length(3, false));
    let mut out = Vec::new();
    encode_head(
        &mut out,
        Version::HTTP_11,
        StatusCode::OK,
        (Some(&lines), r.headers()),
        Framing::Length(3, false),
        false,
    );
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nDate: Wed, 02 Dec 2026 01:00:00 GMT\r\nx-ailb-backend: 10.0.0.1:80\r\n\r\n"
    );
}

#[test]
fn chunks_are_framed_and_empty_frames_skipped() {
    let mut out = Vec::new();
    encode_data(&mut out, Framing::Chunked, &Bytes::from_static(b"data: x\n\n"));
    encode_data(&mut out, Framing::Chunked, &Bytes::new());
    assert_eq!(out, b"9\r\ndata: x\n\n\r\n");
}
