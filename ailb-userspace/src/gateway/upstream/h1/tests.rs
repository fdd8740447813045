use super::*;
use crate::gateway::http::HOP_BY_HOP;

#[test]
fn response_heads_are_framed_as_http_says() {
    let (len, resp, f, _) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").unwrap().unwrap();
    assert_eq!((len, resp.status(), f), (38, StatusCode::OK, Framing::Length(5)));
    let (_, _, f, _) = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap().unwrap();
    assert_eq!(f, Framing::Chunked);
    let (_, resp, f, _) = parse(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
    assert_eq!((resp.version(), f), (Version::HTTP_10, Framing::Close));
    let (_, _, f, _) = parse(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().unwrap();
    assert_eq!(f, Framing::Length(0));
    assert!(parse(b"HTTP/1.1 200 OK\r\nContent-").unwrap().is_none());
    assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").is_err());
    assert!(parse(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    for bad in ["+5", "5 5", "", "x", "18446744073709551616"] {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
        assert!(parse(head.as_bytes()).is_err(), "content-length {bad:?}");
    }
    let (_, _, f, _) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n").unwrap().unwrap();
    assert_eq!(f, Framing::Length(u64::MAX));
}

#[test]
fn a_head_with_more_headers_than_the_first_slots_is_scanned_whole() {
    let many = |n: usize| {
        let headers: String = (0..n).map(|i| format!("X-H{i}: {i}\r\n")).collect();
        format!("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n{headers}\r\n")
    };
    let head = many(FEW_HEADERS + 6);
    let (len, _, f, lines) = parse(head.as_bytes()).unwrap().unwrap();
    assert_eq!((len, f), (head.len(), Framing::Length(0)));
    assert_eq!(lines.iter().count(), FEW_HEADERS + 7);
    assert_eq!(lines.iter().last(), Some((&b"X-H29"[..], &b"29"[..])));
    assert!(parse(many(FEW_HEADERS + 6).as_bytes()[..head.len() - 2].as_ref()).unwrap().is_none());
    assert!(parse(many(MAX_HEADERS).as_bytes()).unwrap_err().contains("more than 100 headers"));
}

#[test]
fn end_to_end_headers_become_lines_and_connection_stays_in_the_map() {
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\nConnection: close, X-Hop\r\n\
                 X-Hop: 1\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nDate: Wed, 02 Dec 2026 01:00:00 GMT\r\n\
                 X-Request-Id: r1\r\n\r\n";
    let (_, resp, f, lines) = parse(head).unwrap().unwrap();
    assert_eq!(f, Framing::Chunked);
    assert_eq!(resp.headers().get_all(CONNECTION).iter().collect::<Vec<_>>(), ["close, X-Hop"]);
    assert_eq!(
        lines.as_bytes(),
        b"Content-Type: Text/Event-Stream; charset=utf-8\r\nDate: Wed, 02 Dec 2026 01:00:00 GMT\r\nX-Request-Id: r1\r\n"
    );
    assert!(lines.event_stream && lines.has_date);
    assert_eq!(lines.content_length, None);
    let (_, resp, _, lines) =
        parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n").unwrap().unwrap();
    assert!(resp.headers().is_empty());
    assert_eq!((lines.content_length, lines.has_date, lines.event_stream), (Some(2), false, false));
    assert!(parse(b"HTTP/1.1 200 OK\r\nX-Bad: a\x7fb\r\n\r\n").is_err());
}

#[test]
fn every_hop_by_hop_header_and_the_gateways_own_are_kept_out_of_the_lines() {
    for name in HOP_BY_HOP.iter().chain(&[BACKEND_HEADER, CONVERSATION_HEADER]) {
        for spelled in [name.to_string(), name.to_ascii_uppercase()] {
            let k = kind(spelled.as_bytes());
            assert!(matches!(k, Kind::Drop | Kind::Connection | Kind::TransferEncoding), "{spelled}: {k:?}");
        }
    }
    let looked_for =
        [("content-length", Kind::ContentLength), ("Date", Kind::Date), ("CONTENT-TYPE", Kind::ContentType)];
    for (name, want) in looked_for {
        assert_eq!(kind(name.as_bytes()), want, "{name}");
    }
    for name in ["x-request-id", "content-lengthx", "dat", "tx", "server", "x-ailb-backends"] {
        assert_eq!(kind(name.as_bytes()), Kind::Other, "{name}");
    }
}

#[test]
fn the_upstreams_own_ailb_headers_are_left_for_the_gateway_to_write() {
    let head =
        b"HTTP/1.1 200 OK\r\nX-Ailb-Backend: 10.0.0.9:80\r\nx-ailb-conversation: 0x1\r\nX-Request-Id: r1\r\n\r\n";
    let (_, _, _, lines) = parse(head).unwrap().unwrap();
    assert_eq!(lines.as_bytes(), b"X-Request-Id: r1\r\n");
}
