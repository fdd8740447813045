use std::time::Duration;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

use super::*;
use crate::config::gateway::tenants::{validate, SchedulerTable, TenantTable};
use crate::gateway::inputs::parse_body;

fn sha(key: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, key.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn table(name: &str) -> TenantTable {
    TenantTable {
        name: name.into(),
        api_key_sha256: vec![],
        header_values: vec![],
        cidrs: vec![],
        weight: 1,
        max_priority: None,
        tokens_per_second: None,
        burst_tokens: None,
        concurrency_share: 1.0,
    }
}

fn tenancy() -> Arc<Tenancy> {
    let s = SchedulerTable { tenant_header: Some("x-team".into()), ..SchedulerTable::default() };
    let a = TenantTable { api_key_sha256: vec![sha("key-a")], max_priority: Some(2), ..table("a") };
    let b = TenantTable {
        header_values: vec!["team-b".into()],
        cidrs: vec!["10.1.0.0/16".into()],
        tokens_per_second: Some(100.0),
        burst_tokens: Some(300.0),
        concurrency_share: 0.002,
        ..table("b")
    };
    Tenancy::new(validate(Some(&s), &[a, b], 1024).unwrap().unwrap())
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::try_from(*k).unwrap(), HeaderValue::try_from(*v).unwrap());
    }
    h
}

fn ip(s: &str) -> impl FnOnce() -> Option<IpAddr> + '_ {
    move || Some(s.parse().unwrap())
}

#[test]
fn the_digest_is_sha256_as_sha256sum_prints_it() {
    // SHA-256 of "abc" (FIPS 180-2's example).
    assert_eq!(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

#[test]
fn a_tenant_is_found_by_api_key_then_trusted_header_then_address_else_default() {
    let t = tenancy();
    let id = |h: &[(&str, &str)], addr: &str| t.tenant(t.identify(&headers(h), ip(addr))).name.clone();
    assert_eq!(id(&[("authorization", "Bearer key-a")], "10.1.2.3"), "a", "the key first");
    assert_eq!(id(&[("x-api-key", "key-a")], "127.0.0.1"), "a");
    assert_eq!(id(&[("authorization", "bearer  key-a ")], "127.0.0.1"), "a", "scheme in any case, spaces trimmed");
    assert_eq!(id(&[("authorization", "Bearer key-x"), ("x-team", "team-b")], "127.0.0.1"), "b");
    assert_eq!(id(&[], "10.1.200.1"), "b", "by address");
    assert_eq!(id(&[], "::ffff:10.1.0.9"), "b", "an IPv4-mapped address is its IPv4 address");
    assert_eq!(id(&[("authorization", "Bearer key-x")], "127.0.0.1"), "default");
    assert_eq!(id(&[("x-team", "team-c")], "10.2.0.1"), "default");
}

#[test]
fn an_untrusted_tenant_header_is_not_read() {
    let s = SchedulerTable::default();
    let a = TenantTable { cidrs: vec!["10.0.0.0/8".into()], ..table("a") };
    let t = Tenancy::new(validate(Some(&s), &[a], 64).unwrap().unwrap());
    assert_eq!(t.identify(&headers(&[("x-ailb-tenant", "a")]), ip("127.0.0.1")), t.default_tenant());
}

#[test]
fn priority_comes_from_the_header_then_the_body_and_is_capped_by_the_tenant() {
    let t = tenancy();
    let (a, b) = (0, 1);
    let body = |json: &'static str| parse_body(json.as_bytes()).unwrap();
    let none = headers(&[]);
    let p = |tenant, h: &HeaderMap, json| t.priority(tenant, h, &body(json)).unwrap();
    assert_eq!(p(a, &none, "{}"), (1, None), "the default");
    assert_eq!(p(a, &headers(&[("x-ailb-priority", "2")]), r#"{"priority": 0}"#), (2, Some(2)), "header first");
    assert_eq!(p(a, &none, r#"{"priority": 0}"#), (0, Some(0)));
    assert_eq!(p(a, &none, r#"{"priority": 9}"#), (2, Some(2)), "above the levels: the top one");
    assert_eq!(p(a, &none, r#"{"service_tier": "flex"}"#), (0, Some(0)));
    assert_eq!(p(a, &none, r#"{"service_tier": "priority"}"#), (2, Some(2)));
    assert_eq!(p(a, &none, r#"{"service_tier": "auto"}"#), (1, None));
    assert_eq!(p(b, &headers(&[("x-ailb-priority", "2")]), "{}"), (1, Some(2)), "b's ceiling is the default, 1");
    let e = t.priority(a, &headers(&[("x-ailb-priority", "high")]), &body("{}")).unwrap_err();
    assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("x-ailb-priority")));
    assert!(e.message.contains("\"high\""), "{}", e.message);
    let e = t.priority(a, &none, &body(r#"{"priority": -1}"#)).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("priority"));
}

#[test]
fn the_bucket_refills_at_its_rate_and_says_when_to_retry() {
    let t0 = Instant::now();
    let mut b = Bucket::new(100.0, 300.0, t0);
    assert_eq!(b.take(250, t0), Ok(()));
    assert_eq!(b.take(100, t0), Err(1), "50 left, 50 more in 0.5 s");
    assert_eq!(b.take(100, t0 + Duration::from_millis(500)), Ok(()));
    assert_eq!(b.take(300, t0 + Duration::from_millis(500)), Err(3), "0 left: 300 take 3 s");
    // A cost above the bucket: from a full bucket only, leaving it in debt.
    assert_eq!(b.take(1000, t0 + Duration::from_secs(2)), Err(2), "200 of 300 after 2 s");
    assert_eq!(b.take(1000, t0 + Duration::from_secs(10)), Ok(()));
    assert_eq!(b.take(1, t0 + Duration::from_secs(11)), Err(7), "700 in debt, 100 back: 601 to go, 6.01 s");
}

#[test]
fn a_tenant_over_its_rate_gets_429_with_retry_after() {
    let t = tenancy();
    let now = Instant::now();
    t.take_tokens(1, 300, now).unwrap();
    let e = t.take_tokens(1, 200, now).unwrap_err();
    assert_eq!((e.status.as_u16(), e.code, e.retry_after), (429, Some("tenant_rate_limited"), Some(2)));
    assert!(e.message.contains("tenant `b`") && e.message.contains("200 tokens"), "{}", e.message);
    t.take_tokens(0, 1_000_000, now).unwrap();
    t.take_tokens(0, 1_000_000, now).expect("a has no rate");
}

#[test]
fn a_tenant_at_its_concurrency_share_gets_429_until_one_finishes() {
    let t = tenancy();
    // b: 0.002 x 1024 = 2.05, rounded up to 3.
    let held: Vec<_> = (0..3).map(|_| t.enter(1, 4).unwrap()).collect();
    let e = t.enter(1, 4).unwrap_err();
    assert_eq!((e.status.as_u16(), e.code, e.retry_after), (429, Some("tenant_concurrency"), Some(4)));
    drop(held);
    t.enter(1, 4).expect("room again");
}

#[test]
fn explain_shows_the_tenant_how_it_was_found_its_priority_and_cost() {
    let t = tenancy();
    let body = br#"{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"12345678"}]}"#;
    let h = headers(&[("authorization", "Bearer key-a"), ("x-ailb-priority", "9")]);
    let v = explain(t.config(), "/v1/chat/completions", &h, body, None).unwrap();
    assert_eq!(
        v,
        TenantView {
            tenant: "a".into(),
            matched_by: MatchedBy::ApiKey,
            weight: 1,
            priority: 2,
            asked: Some(2),
            max_priority: 2,
            cost_tokens: 102,
        }
    );
    let v = explain(t.config(), "/v1/chat/completions", &headers(&[]), body, Some("10.1.0.1".parse().unwrap()));
    assert_eq!(v.map(|v| (v.tenant, v.matched_by)), Ok(("b".into(), MatchedBy::Address)));
    let v = explain(t.config(), "/v1/embeddings", &headers(&[]), br#"{"model":"m","input":"1234"}"#, None).unwrap();
    assert_eq!((v.matched_by, v.cost_tokens), (MatchedBy::Default, 1), "an embedding generates nothing");
    assert_eq!(explain(t.config(), "/nope", &headers(&[]), b"{}", None).unwrap_err().status.as_u16(), 404);
}
