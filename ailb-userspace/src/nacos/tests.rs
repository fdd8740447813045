//! The session's rules, the same for reads (the gateway) and writes (the agent), over a fake
//! transport: login order, the envelope check before a server counts as v1-only, token
//! lifetime and renewal, failover. `discovery/nacos/tests.rs` and `agent/tests.rs` test the
//! two users over the same session.

use std::{
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::json;

use super::{
    fake::{ok, query, status, unreachable, Fake},
    http::Method,
    session::{renew_after, DEFAULT_TOKEN_TTL, MAX_TOKEN_TTL},
    *,
};

fn cfg(servers: &[&str], api: NacosApi, login: bool) -> ValidNacos {
    let mut c = NacosConfig::with_servers(servers.iter().copied());
    c.api = api;
    if login {
        c.username = Some("nacos".into());
        c.password = Some(Secret::new("pw"));
    }
    c.validate().unwrap()
}

fn ep() -> Endpoint {
    Endpoint { service: "llm".into(), ip: Ipv4Addr::new(10, 0, 0, 7), port: 8000, cluster: "DEFAULT".into() }
}

fn reg() -> Registration {
    Registration { metadata: [("model_id".to_string(), "llm".to_string())].into(), weight: 1.0, enabled: true }
}

const V1_LOGIN: &str = "/nacos/v1/auth/login";
const V3_LOGIN: &str = "/nacos/v3/auth/user/login";

/// A v1-only server (the v3 paths answer 404 with an HTML page), tokens `t1`, `t2`, ...
fn v1_server(logins: Arc<Mutex<u32>>) -> Fake {
    Fake::new(move |r| match r.url.path() {
        p if p.contains("/v3/") => status(404, "<html>not found</html>"),
        V1_LOGIN => {
            let mut n = logins.lock().unwrap();
            *n += 1;
            ok(json!({ "accessToken": format!("t{n}"), "tokenTtl": 18000 }))
        }
        _ => status(200, "ok"),
    })
}

#[tokio::test]
async fn a_write_logs_in_v3_first_then_v1_and_then_uses_the_detected_api() {
    let fake = v1_server(Arc::default());
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::Auto, true), fake.clone());
    s.register(&ep(), &reg()).await.unwrap();
    assert_eq!(
        fake.paths(),
        [
            "s1/nacos/v3/auth/user/login",
            "s1/nacos/v1/auth/login",
            "s1/nacos/v3/client/ns/instance",
            "s1/nacos/v1/ns/instance"
        ]
    );
    // The API is known now: a renewed login goes straight to v1.
    s.expire_tokens();
    s.register(&ep(), &reg()).await.unwrap();
    assert_eq!(fake.paths()[4..], ["s1/nacos/v1/auth/login", "s1/nacos/v1/ns/instance"]);
}

#[tokio::test]
async fn a_configured_api_logs_in_with_that_api_only() {
    for (api, want) in [(NacosApi::V1, V1_LOGIN), (NacosApi::V3, V3_LOGIN)] {
        let fake = Fake::new(|r| match r.url.path() {
            V1_LOGIN | V3_LOGIN => ok(json!({ "accessToken": "t" })),
            _ => ok(json!({ "code": 0, "message": "success", "data": "ok" })),
        });
        let mut s = Session::with_transport(&cfg(&["http://s1"], api, true), fake.clone());
        s.login_first().await.unwrap();
        assert_eq!(fake.paths(), [format!("s1{want}")], "{api:?}");
    }
}

#[tokio::test]
async fn a_404_with_a_nacos_envelope_is_an_answer_not_a_missing_api() {
    // A v3 server's own "not found" for a write: no switch to v1.
    let fake = Fake::new(|_| status(404, r#"{"code":20004,"message":"resource not found","data":null}"#));
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::Auto, false), fake.clone());
    let e = s.register(&ep(), &reg()).await.unwrap_err();
    assert!(matches!(e, NacosError::Api { code: 20004, op: Op::Register, .. }), "{e}");
    assert_eq!(fake.paths(), ["s1/nacos/v3/client/ns/instance"]);
    // The same for the login: no v1 login after a v3 login answered with an envelope.
    let fake = Fake::new(|_| status(404, r#"{"code":404,"message":"user not found"}"#));
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::Auto, true), fake.clone());
    let e = s.login_first().await;
    assert!(e.is_ok(), "a server that does not log in is retried later, not a start-up error");
    let e = s.register(&ep(), &reg()).await.unwrap_err();
    assert!(matches!(e, NacosError::LoginStatus { status: 404, .. }), "{e}");
    assert!(fake.paths().iter().all(|p| p.ends_with(V3_LOGIN)), "{:?}", fake.paths());
}

#[tokio::test]
async fn without_any_login_api_the_error_says_so() {
    let fake = Fake::new(|_| status(404, "no"));
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::Auto, true), fake.clone());
    let e = s.register(&ep(), &reg()).await.unwrap_err();
    assert!(matches!(e, NacosError::NoLoginApi { .. }), "{e}");
    assert_eq!(fake.paths(), ["s1/nacos/v3/auth/user/login", "s1/nacos/v1/auth/login"]);
}

#[tokio::test]
async fn a_login_answer_is_read_by_one_parser_for_reads_and_writes() {
    // 200 without a usable token: the same error, whoever asked.
    let fake =
        Fake::new(|r| if r.url.path() == V1_LOGIN { ok(json!({ "accessToken": "" })) } else { status(200, "ok") });
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::V1, true), fake);
    let e = s.register(&ep(), &reg()).await.unwrap_err();
    assert!(matches!(e, NacosError::LoginAnswer { .. }), "{e}");
    assert!(crate::error_chain(&e).contains("accessToken is empty"), "{}", crate::error_chain(&e));
    let e = s.list_instances("llm").await.unwrap_err();
    assert!(matches!(e, NacosError::LoginAnswer { .. }), "{e}");
}

#[test]
fn token_lifetime_is_80_percent_of_its_ttl_capped_at_a_day() {
    assert_eq!(renew_after(None), DEFAULT_TOKEN_TTL.mul_f64(0.8));
    assert_eq!(renew_after(Some(18_000)), Duration::from_secs(14_400));
    assert_eq!(renew_after(Some(100)), Duration::from_secs(80));
    assert_eq!(renew_after(Some(u64::MAX)), MAX_TOKEN_TTL.mul_f64(0.8));
}

#[tokio::test]
async fn a_due_token_is_renewed_before_the_next_call() {
    let logins = Arc::new(Mutex::new(0));
    let fake = v1_server(logins.clone());
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::V1, true), fake.clone());
    s.register(&ep(), &reg()).await.unwrap();
    s.beat(&ep(), &reg()).await.unwrap();
    assert_eq!(*logins.lock().unwrap(), 1, "one token for both calls");
    s.expire_tokens();
    s.beat(&ep(), &reg()).await.unwrap();
    assert_eq!(*logins.lock().unwrap(), 2);
    let last = fake.last();
    assert_eq!((last.method, query(&last, "accessToken").as_deref()), (Method::Put, Some("t2")));
    assert!(last.headers.contains(&("accessToken", "t2".to_string())));
}

#[tokio::test]
async fn a_403_renews_the_token_once_for_writes_too() {
    let logins = Arc::new(Mutex::new(0));
    let l2 = logins.clone();
    let fake = Fake::new(move |r| match r.url.path() {
        V1_LOGIN => {
            let mut n = l2.lock().unwrap();
            *n += 1;
            ok(json!({ "accessToken": format!("t{n}"), "tokenTtl": 18000 }))
        }
        _ if query(r, "accessToken").as_deref() == Some("t1") => status(403, "token expired!"),
        _ => status(200, "ok"),
    });
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::V1, true), fake.clone());
    s.register(&ep(), &reg()).await.unwrap();
    assert_eq!(*logins.lock().unwrap(), 2);
    // Refused again after the renewal: an error, not a loop.
    let fake =
        Fake::new(|r| if r.url.path() == V1_LOGIN { ok(json!({ "accessToken": "t" })) } else { status(403, "no") });
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::V1, true), fake.clone());
    let e = s.deregister(&ep()).await.unwrap_err();
    assert!(matches!(e, NacosError::Status { status: 403, op: Op::Deregister, .. }), "{e}");
    assert_eq!(fake.paths().len(), 4, "login, call, login, call: {:?}", fake.paths());
}

#[tokio::test]
async fn v3_sends_the_token_in_the_header_only() {
    let fake = Fake::new(|r| match r.url.path() {
        V3_LOGIN => ok(json!({ "accessToken": "t3" })),
        _ => ok(json!({ "code": 0, "message": "success", "data": "ok" })),
    });
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::V3, true), fake.clone());
    s.register(&ep(), &reg()).await.unwrap();
    let r = fake.last();
    assert_eq!(query(&r, "accessToken"), None);
    assert!(r.headers.contains(&("accessToken", "t3".to_string())));
}

#[tokio::test]
async fn a_v3_write_answered_with_a_non_zero_code_is_an_error() {
    let fake = Fake::new(|_| ok(json!({ "code": 21000, "message": "parameter missing" })));
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::V3, false), fake);
    let e = s.register(&ep(), &reg()).await.unwrap_err();
    assert!(matches!(e, NacosError::Api { code: 21000, op: Op::Register, .. }), "{e}");
    assert_eq!(s.beat(&ep(), &reg()).await.unwrap(), Beat::NotFound, "a refused beat: register again");
}

#[tokio::test]
async fn writes_and_reads_fail_over_and_stick_to_the_server_that_answered() {
    let fake = Fake::new(|r| match (r.url.host_str(), r.url.path()) {
        (Some("s1"), _) => unreachable(),
        (_, "/nacos/v1/ns/instance/list") => ok(json!({ "hosts": [] })),
        _ => status(200, "ok"),
    });
    let mut s = Session::with_transport(&cfg(&["http://s1", "http://s2"], NacosApi::V1, false), fake.clone());
    s.register(&ep(), &reg()).await.unwrap();
    s.list_instances("llm").await.unwrap();
    s.deregister(&ep()).await.unwrap();
    assert_eq!(
        fake.paths(),
        [
            "s1/nacos/v1/ns/instance",
            "s2/nacos/v1/ns/instance",
            "s2/nacos/v1/ns/instance/list",
            "s2/nacos/v1/ns/instance"
        ]
    );
}

#[tokio::test]
async fn all_servers_failing_names_the_operation_and_keeps_the_last_error() {
    let fake = Fake::new(|r| if r.url.host_str() == Some("s1") { unreachable() } else { status(500, "boom") });
    let mut s = Session::with_transport(&cfg(&["http://s1", "http://s2"], NacosApi::V1, false), fake);
    let e = s.beat(&ep(), &reg()).await.unwrap_err();
    assert!(matches!(&e, NacosError::AllServersFailed { op: Op::Beat, servers: 2, service, .. } if service == "llm"));
    let chain = crate::error_chain(&e);
    assert!(chain.contains("beat of service \"llm\": http 500: boom"), "{chain}");
    // One server: its own error, unwrapped.
    let mut s = Session::with_transport(&cfg(&["http://s1"], NacosApi::V1, false), Fake::new(|_| unreachable()));
    assert!(matches!(s.register(&ep(), &reg()).await.unwrap_err(), NacosError::Transport { .. }));
}
