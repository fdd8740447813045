use super::*;

#[test]
fn a_request_prints_no_token_and_no_password() {
    let req = Request {
        method: Method::Post,
        url: Url::parse("http://h:8848/nacos/v1/ns/instance/list?serviceName=llm&accessToken=tok-123").unwrap(),
        headers: vec![("accessToken", "tok-123".into())],
        form: vec![("username", "ailb".into()), ("password", "pw-456".into())],
    };
    let s = format!("{req:?}");
    assert!(!s.contains("tok-123") && !s.contains("pw-456") && !s.contains("llm"), "{s}");
    assert!(s.contains("http://h:8848/nacos/v1/ns/instance/list") && s.contains("\"password\""), "{s}");
}
