use super::*;

#[test]
fn lines_round_trip_and_come_first_for_hyper() {
    let mut lines = HeadLines::with_capacity(64);
    lines.push("Content-Type", b"application/json");
    lines.push("x-multi", b"a");
    lines.push("x-multi", b"b: c");
    assert_eq!(lines.as_bytes(), b"Content-Type: application/json\r\nx-multi: a\r\nx-multi: b: c\r\n");
    let pairs: Vec<(&[u8], &[u8])> = lines.iter().collect();
    assert_eq!(pairs[2], (&b"x-multi"[..], &b"b: c"[..]));
    let mut resp = Response::new(crate::gateway::http::full(Bytes::new()));
    resp.headers_mut().insert("x-ailb-backend", HeaderValue::from_static("10.0.0.1:80"));
    let merged = Answer { resp, lines: Some(lines) }.into_response();
    let names: Vec<&str> = merged.headers().keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["content-type", "x-multi", "x-ailb-backend"]);
    assert_eq!(merged.headers().get_all("x-multi").iter().collect::<Vec<_>>(), ["a", "b: c"]);
}
