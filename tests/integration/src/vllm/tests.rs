use super::*;

#[test]
fn metric_sum_adds_every_label_set_and_ignores_longer_names() {
    let text =
        "# HELP x\nvllm:hits_total{engine=\"0\"} 3\nvllm:hits_total{engine=\"1\"} 4.5\nvllm:hits_total_created 9\n";
    assert_eq!(metric_sum(text, "vllm:hits_total"), Some(7.5));
    assert_eq!(metric_sum(text, "vllm:missing"), None);
    assert_eq!(metric_sum("plain 2\n", "plain"), Some(2.0));
}

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

#[test]
fn filler_is_deterministic_and_differs_by_seed() {
    assert_eq!(filler(1, 50), filler(1, 50));
    assert_ne!(filler(1, 50), filler(2, 50));
    assert_eq!(filler(4, 300).split_whitespace().count(), 300);
}
