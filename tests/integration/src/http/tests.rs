use super::*;

#[test]
fn parse_reply_undoes_chunked_coding() {
    let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Ailb-Backend: 1.2.3.4:5\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    let r = parse_reply(raw).unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "hello world"));
    assert_eq!(r.header("x-ailb-backend"), Some("1.2.3.4:5"));
    let plain = parse_reply(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno").unwrap();
    assert_eq!((plain.status, plain.body.as_str()), (404, "no"));
    assert!(parse_reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
}

#[test]
fn sse_data_lists_the_payloads_in_order() {
    let r = Reply { status: 200, headers: vec![], body: "data: {\"a\":1}\n\ndata: [DONE]\n\n".into() };
    assert_eq!(r.sse_data(), vec!["{\"a\":1}".to_string(), "[DONE]".to_string()]);
}
