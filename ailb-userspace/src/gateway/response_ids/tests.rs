use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use super::*;

fn stored(port: u16) -> Stored {
    Stored {
        model: "m".into(),
        backend: SocketAddrV4::new([127, 0, 0, 1].into(), port),
        conversation: Some(format!("c{port}")),
    }
}

/// The id found when `body` comes in pieces of `step` bytes.
fn scan(sse: bool, body: &[u8], step: usize) -> Option<String> {
    let mut s = IdScanner::new(sse);
    let mut found = None;
    for piece in body.chunks(step.max(1)) {
        if let Some(id) = s.feed(piece) {
            assert!(found.is_none(), "found twice");
            found = Some(id);
        }
    }
    found
}

#[test]
fn the_top_level_id_of_a_json_answer_is_found_in_any_split() {
    let body = br#" {"object":"response","nested":{"id":"inner","a":[1,{"id":"x"}],"s":"q\"}"},"n":-1.5e3,"t":true,"id":"resp_\u0041bc","output":[]}"#;
    for step in [1, 2, 3, 7, 64, body.len()] {
        assert_eq!(scan(false, body, step).as_deref(), Some("resp_Abc"), "step {step}");
    }
    assert_eq!(scan(false, br#"{"id":"resp_1","id":"resp_2"}"#, 1).as_deref(), Some("resp_1"), "the first");
    for none in [&br#"{"object":"x"}"#[..], br#"{"id":7}"#, br#"[{"id":"a"}]"#, b"null", br#"{"id":""}"#, b"{bad"] {
        let mut s = IdScanner::new(false);
        assert_eq!(s.feed(none), None, "{}", String::from_utf8_lossy(none));
        assert!(s.done(), "{} gives up at once", String::from_utf8_lossy(none));
    }
    let mut s = IdScanner::new(false);
    assert_eq!(s.feed(br#"{"object":"respo"#), None);
    assert!(!s.done(), "a cut body waits for more");
}

#[test]
fn the_id_of_a_stream_is_the_response_created_events() {
    let stream = concat!(
        ": comment\n\n",
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\n",
        "data: \"response\":{\"id\":\"resp_s1\",\"status\":\"in_progress\"}}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n",
    );
    for step in [1, 5, 13, stream.len()] {
        assert_eq!(scan(true, stream.as_bytes(), step).as_deref(), Some("resp_s1"), "step {step}");
    }
    let crlf = "event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r2\"}}\r\n\r\n";
    assert_eq!(scan(true, crlf.as_bytes(), 3).as_deref(), Some("r2"));
    let mut s = IdScanner::new(true);
    assert_eq!(s.feed(b"data: {\"type\":\"response.created\",\"response\":{}}\n\n"), None);
    assert!(s.done(), "a created event without an id ends the search");
}

#[test]
fn the_scan_gives_up_past_its_limit() {
    let mut s = IdScanner::new(true);
    let filler = format!("data: {}\n\n", "x".repeat(1000));
    while !s.done() {
        assert_eq!(s.feed(filler.as_bytes()), None);
        assert!(s.seen <= SCAN_LIMIT + filler.len(), "it stops at its limit");
    }
    let mut s = IdScanner::new(false);
    let big = format!("{{\"text\":\"{}\",\"id\":\"late\"}}", "y".repeat(SCAN_LIMIT));
    assert_eq!(s.feed(big.as_bytes()), None, "an id past the limit is not looked for");
    assert!(s.done());
}

#[test]
fn the_table_keeps_at_most_its_entries_oldest_forgotten_first() {
    let t0 = Instant::now();
    let mut t = ResponseTable::new(3, None);
    for i in 0..5u16 {
        t.insert(format!("r{i}"), stored(i), t0);
    }
    assert_eq!(t.len(), 3);
    assert_eq!(t.get("r0", t0), None);
    assert_eq!(t.get("r1", t0), None);
    assert_eq!(t.get("r4", t0), Some(stored(4)));
    // Learned again: a new place, and the old place does not evict it.
    t.insert("r2".into(), stored(9), t0);
    t.insert("r5".into(), stored(5), t0);
    assert_eq!(t.get("r2", t0), Some(stored(9)));
    assert_eq!(t.get("r3", t0), None, "the oldest went");
    for i in 0..100u16 {
        t.insert("same".into(), stored(i), t0);
    }
    assert!(t.order.len() <= 6, "places left behind are bounded: {}", t.order.len());
    assert_eq!(t.get("same", t0), Some(stored(99)));
}

#[test]
fn the_table_forgets_entries_past_their_ttl() {
    let t0 = Instant::now();
    let mut t = ResponseTable::new(10, Some(Duration::from_secs(60)));
    t.insert("old".into(), stored(1), t0);
    t.insert("new".into(), stored(2), t0 + Duration::from_secs(30));
    assert_eq!(t.get("old", t0 + Duration::from_secs(59)), Some(stored(1)));
    assert_eq!(t.get("old", t0 + Duration::from_secs(60)), None);
    assert_eq!(t.get("new", t0 + Duration::from_secs(60)), Some(stored(2)));
    assert_eq!(t.len(), 1);
}
