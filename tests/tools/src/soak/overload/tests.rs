use super::*;

fn rec(status: Option<u16>, error: Option<&str>, retry_after: Option<u32>) -> Rec {
    Rec {
        entry: Entry::FrontDoor,
        conversation: "c".into(),
        sent_s: 0.0,
        end_s: 1.0,
        ok: status == Some(200) && error.is_none(),
        status,
        error: error.map(str::to_string),
        backend: None,
        e2e_ms: 1000.0,
        late_ms: 0.0,
        retry_after,
    }
}

#[test]
fn an_outcome_names_the_code_that_refused() {
    let gate = r#"HTTP 503: {"error":{"message":"the model `m` is overloaded","type":"server_error","param":null,"code":"model_overloaded"}}"#;
    assert_eq!(outcome(&rec(Some(503), Some(gate), Some(1))), "HTTP 503 model_overloaded");
    let kernel = r#"HTTP 503: {"error":{"message":"no live backend","type":"server_error","code":"no_backend"}}"#;
    assert_eq!(outcome(&rec(Some(503), Some(kernel), Some(1))), "HTTP 503 no_backend");
    // Cut before its code (the client keeps 512 bytes): the status alone.
    assert_eq!(outcome(&rec(Some(429), Some(r#"HTTP 429: {"error":{"message":"x"#), None)), "HTTP 429");
    assert_eq!(outcome(&rec(Some(200), None, None)), "200");
    assert_eq!(
        outcome(&rec(None, Some("connect to 127.0.0.1:80: Connection refused (os error 111)"), None)),
        "connect to ...:: Connection refused (os error 111)"
    );
}

#[test]
fn a_refusal_is_a_429_or_503_and_says_whether_it_carried_retry_after() {
    assert_eq!(refusal(&rec(Some(503), Some("HTTP 503: x"), Some(1))), Some(true));
    assert_eq!(refusal(&rec(Some(429), Some("HTTP 429: x"), None)), Some(false));
    assert_eq!(refusal(&rec(Some(502), Some("HTTP 502: x"), None)), None);
    assert_eq!(refusal(&rec(Some(200), None, None)), None);
}
