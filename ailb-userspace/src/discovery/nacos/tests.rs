//! The source over the one client and a fake transport: API detection, login and renewal,
//! failover, errors, snapshots. The session's own rules are tested in `nacos/tests.rs`, the
//! wire formats in `nacos/wire/tests.rs`; the real servers in `tests/`.

use std::sync::{Arc, Mutex};

use serde_json::json;

use super::*;
use crate::{
    error_chain,
    nacos::{
        fake::{ok, query, status, unreachable, Fake},
        NacosConfig, Secret,
    },
};

fn v1_hosts() -> serde_json::Value {
    json!({ "hosts": [
        { "ip": "10.0.0.1", "port": 8000, "clusterName": "a", "weight": 1.0, "healthy": true, "enabled": true },
        { "ip": "10.0.0.2", "port": 8000, "clusterName": "b" } ] })
}

fn cfg(servers: &[&str], f: impl FnOnce(&mut NacosConfig)) -> ValidNacos {
    let mut c = NacosConfig::with_servers(servers.iter().copied());
    c.udp_push = false;
    f(&mut c);
    c.validate().unwrap()
}
fn catalog() -> Vec<(String, Vec<String>)> {
    vec![("m".into(), vec!["llm".into()])]
}

#[tokio::test]
async fn auto_falls_back_to_v1_once_and_sends_healthy_only_false() {
    let fake = Fake::new(|r| match r.url.path() {
        "/nacos/v3/client/ns/instance/list" => status(404, "<html>not found</html>"),
        "/nacos/v1/ns/instance/list" => ok(v1_hosts()),
        p => panic!("unexpected {p}"),
    });
    let mut src =
        NacosSource::with_transport(&cfg(&["http://s1:8848"], |_| {}), &catalog(), fake.clone()).await.unwrap();
    let snap = src.discover().await.unwrap();
    assert_eq!(snap.instances.len(), 2);
    assert_eq!(snap.instances[0].model, "m");
    assert_eq!(snap.instances[0].group, "DEFAULT_GROUP");
    let r = fake.last();
    assert_eq!(query(&r, "healthyOnly").as_deref(), Some("false"));
    assert_eq!(query(&r, "serviceName").as_deref(), Some("llm"));
    assert_eq!(query(&r, "namespaceId"), None, "the public namespace is the default");
    src.discover().await.unwrap();
    assert_eq!(
        fake.paths(),
        ["s1/nacos/v3/client/ns/instance/list", "s1/nacos/v1/ns/instance/list", "s1/nacos/v1/ns/instance/list"]
    );
}

#[tokio::test]
async fn a_v3_server_answering_404_with_an_envelope_is_not_a_missing_api() {
    let fake = Fake::new(|_| status(404, r#"{"code":20004,"message":"resource not found","data":null}"#));
    let mut src = NacosSource::with_transport(&cfg(&["http://s1"], |_| {}), &catalog(), fake.clone()).await.unwrap();
    let e = src.discover().await.unwrap_err();
    assert!(matches!(e, NacosError::Api { code: 20004, .. }), "{e}");
    assert_eq!(fake.paths().len(), 1);
}

#[tokio::test]
async fn v3_clusters_and_namespace_are_sent_and_clusters_filtered_here() {
    let fake = Fake::new(|_| ok(json!({ "code": 0, "message": "success", "data": v1_hosts()["hosts"] })));
    let c = cfg(&["http://s1"], |c| {
        c.api = NacosApi::V3;
        c.clusters = vec!["a".into()];
        c.namespace = "prod".into();
        c.group = "LLM".into();
    });
    let mut src = NacosSource::with_transport(&c, &catalog(), fake.clone()).await.unwrap();
    let snap = src.discover().await.unwrap();
    assert_eq!(snap.instances.len(), 1, "cluster b is filtered even if the server ignores clusterName");
    assert_eq!(snap.instances[0].cluster, "a");
    let r = fake.last();
    assert_eq!(r.url.path(), "/nacos/v3/client/ns/instance/list");
    assert_eq!(query(&r, "clusterName").as_deref(), Some("a"));
    assert_eq!(query(&r, "namespaceId").as_deref(), Some("prod"));
    assert_eq!(query(&r, "groupName").as_deref(), Some("LLM"));
    assert_eq!(
        snap.services,
        vec![ServiceInfo { model: "m".into(), service: "llm".into(), reach_protection_threshold: false }]
    );
}

fn with_login(c: &mut NacosConfig) {
    c.username = Some("nacos".into());
    c.password = Some(Secret::new("pw"));
    c.api = NacosApi::V1;
}

#[tokio::test]
async fn wrong_password_is_a_connect_error_naming_server_and_status() {
    let fake = Fake::new(|_| status(403, "unknown user!"));
    let c = cfg(&["http://s1:8848"], with_login);
    let e = NacosSource::with_transport(&c, &catalog(), fake).await.err().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, NacosError::LoginRefused { status: 403, .. }), "{msg}");
    assert!(msg.contains("http://s1:8848/nacos/") && msg.contains("403") && msg.contains("unknown user!"), "{msg}");
    assert!(!msg.contains("pw"));
}

#[tokio::test]
async fn unreachable_at_connect_is_not_an_error_and_login_is_retried() {
    let up = Arc::new(Mutex::new(false));
    let up2 = up.clone();
    let fake = Fake::new(move |r| {
        if !*up2.lock().unwrap() {
            return unreachable();
        }
        match r.url.path() {
            "/nacos/v1/auth/login" => {
                assert_eq!(r.form, vec![("username", "nacos".to_string()), ("password", "pw".to_string())]);
                ok(json!({ "accessToken": "tok1", "tokenTtl": 18000 }))
            }
            _ => ok(v1_hosts()),
        }
    });
    let c = cfg(&["http://s1"], with_login);
    let mut src = NacosSource::with_transport(&c, &catalog(), fake.clone()).await.unwrap();
    assert!(src.discover().await.is_err());
    *up.lock().unwrap() = true;
    src.discover().await.unwrap();
    let r = fake.last();
    assert_eq!(query(&r, "accessToken").as_deref(), Some("tok1"));
    assert!(r.headers.contains(&("accessToken", "tok1".to_string())));
}

#[tokio::test]
async fn v3_login_first_then_v1() {
    let fake = Fake::new(|r| match r.url.path() {
        "/nacos/v3/auth/user/login" => status(404, "no"),
        "/nacos/v1/auth/login" => ok(json!({ "accessToken": "t", "tokenTtl": 100 })),
        _ => ok(v1_hosts()),
    });
    let c = cfg(&["http://s1"], |c| {
        with_login(c);
        c.api = NacosApi::Auto;
    });
    NacosSource::with_transport(&c, &catalog(), fake.clone()).await.unwrap();
    assert_eq!(fake.paths(), ["s1/nacos/v3/auth/user/login", "s1/nacos/v1/auth/login"]);
}

#[tokio::test]
async fn an_expired_token_is_renewed_after_403() {
    let logins = Arc::new(Mutex::new(0));
    let l2 = logins.clone();
    let fake = Fake::new(move |r| match r.url.path() {
        "/nacos/v1/auth/login" => {
            let mut n = l2.lock().unwrap();
            *n += 1;
            ok(json!({ "accessToken": format!("t{n}"), "tokenTtl": 18000 }))
        }
        _ if query(r, "accessToken").as_deref() == Some("t1") => status(403, "token expired!"),
        _ => ok(v1_hosts()),
    });
    let mut src =
        NacosSource::with_transport(&cfg(&["http://s1"], with_login), &catalog(), fake.clone()).await.unwrap();
    src.discover().await.unwrap();
    assert_eq!(*logins.lock().unwrap(), 2);
    assert_eq!(query(&fake.last(), "accessToken").as_deref(), Some("t2"));
}

#[tokio::test]
async fn failover_sticks_to_the_server_that_answered() {
    let fake = Fake::new(|r| if r.url.host_str() == Some("s1") { unreachable() } else { ok(v1_hosts()) });
    let c = cfg(&["http://s1", "http://s2"], |c| c.api = NacosApi::V1);
    let mut src = NacosSource::with_transport(&c, &catalog(), fake.clone()).await.unwrap();
    src.discover().await.unwrap();
    src.discover().await.unwrap();
    assert_eq!(
        fake.paths(),
        ["s1/nacos/v1/ns/instance/list", "s2/nacos/v1/ns/instance/list", "s2/nacos/v1/ns/instance/list"]
    );
}

#[tokio::test]
async fn one_unreadable_service_fails_the_whole_read() {
    let fake =
        Fake::new(
            |r| if query(r, "serviceName").as_deref() == Some("bad") { status(500, "boom") } else { ok(v1_hosts()) },
        );
    let c = cfg(&["http://s1", "http://s2"], |c| c.api = NacosApi::V1);
    let cat = vec![("m".into(), vec!["llm".into(), "bad".into()])];
    let mut src = NacosSource::with_transport(&c, &cat, fake).await.unwrap();
    let e = src.discover().await.unwrap_err();
    assert!(matches!(&e, NacosError::AllServersFailed { service, servers: 2, .. } if service == "bad"), "{e}");
    assert!(error_chain(&e).contains("http 500: boom"), "{}", error_chain(&e));
}

#[tokio::test]
async fn snapshots_are_sorted_so_reordered_answers_compare_equal() {
    let flip = Arc::new(Mutex::new(false));
    let f2 = flip.clone();
    let fake = Fake::new(move |_| {
        let mut f = f2.lock().unwrap();
        *f = !*f;
        let mut h = v1_hosts();
        if *f {
            h["hosts"].as_array_mut().unwrap().reverse();
        }
        ok(h)
    });
    let c = cfg(&["http://s1"], |c| c.api = NacosApi::V1);
    let mut src = NacosSource::with_transport(&c, &catalog(), fake).await.unwrap();
    assert_eq!(src.discover().await.unwrap(), src.discover().await.unwrap());
}

#[tokio::test]
async fn dropped_hosts_are_counted() {
    let fake = Fake::new(|_| ok(json!({ "hosts": [{ "ip": "ff02::1", "port": 1 }, { "ip": "10.0.0.1", "port": 1 }] })));
    let c = cfg(&["http://s1"], |c| c.api = NacosApi::V1);
    let mut src = NacosSource::with_transport(&c, &catalog(), fake).await.unwrap();
    assert_eq!(src.discover().await.unwrap().instances.len(), 1);
    src.discover().await.unwrap();
    assert_eq!(src.dropped_total(), 2);
}
