//! The Nacos client against a FAKE server (`FakeNacos`: a std TcpListener that answers what
//! each test says): garbage answers, the documented v3 client API shape (which rnacos does
//! not serve), flags rnacos never reports (`healthy = false`, `enabled = false`,
//! `reachProtectionThreshold`), and the v1 UDP push with its ack (which rnacos does not send).
//! Nothing here says how a real server behaves; `nacos_client.rs` does that with rnacos.

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use ailb_tests::nacos::{FakeNacos, FakeRequest, FakeResponse};
use ailb_userspace::{
    discovery::nacos::NacosSource,
    error_chain,
    nacos::{NacosApi, NacosConfig, NacosError, ValidNacos},
};
use serde_json::json;

fn config(url: String, f: impl FnOnce(&mut NacosConfig)) -> ValidNacos {
    let mut c = NacosConfig::with_servers([url]);
    c.timeout = "1s".into();
    f(&mut c);
    c.validate().unwrap_or_else(|e| panic!("test config: {e}"))
}

fn catalog() -> Vec<(String, Vec<String>)> {
    vec![("llm".to_string(), vec!["llm".to_string()])]
}

/// A v1-only fake answering every list with `body`.
fn v1_fake(resp: impl Fn() -> FakeResponse + Send + Sync + 'static) -> FakeNacos {
    FakeNacos::start(move |r| match r.path.as_str() {
        "/nacos/v1/ns/instance/list" => resp(),
        _ => FakeResponse::new(404, "not found"),
    })
}

#[tokio::test]
async fn fake_v1_flags_rnacos_never_reports() {
    let fake = v1_fake(|| {
        FakeResponse::json(json!({ "name": "DEFAULT_GROUP@@llm", "reachProtectionThreshold": true, "hosts": [
            { "ip": "10.9.0.1", "port": 8000, "weight": 2.0, "healthy": false, "enabled": true, "clusterName": "c",
              "metadata": { "free_memory_mb": 1024, "tags": ["a"], "ok": true } },
            { "ip": "10.9.0.2", "port": 8000, "healthy": true, "enabled": false } ] }))
    });
    let mut src = NacosSource::connect(&config(fake.url(), |_| {}), &catalog()).await.unwrap();
    let snap = src.discover().await.unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert_eq!(snap.instances.len(), 2);
    let by = |ip: &str| snap.instances.iter().find(|i| i.address.ip().to_string() == ip).expect(ip);
    let (a, b) = (by("10.9.0.1"), by("10.9.0.2"));
    assert_eq!((a.healthy, a.enabled, a.weight), (false, true, 2.0));
    assert_eq!(a.metadata["free_memory_mb"], "1024");
    assert_eq!(a.metadata["tags"], "[\"a\"]");
    assert_eq!(a.metadata["ok"], "true");
    assert_eq!((b.healthy, b.enabled), (true, false));
    assert!(snap.services[0].reach_protection_threshold);
    let list = fake.requests().into_iter().find(|r| r.path == "/nacos/v1/ns/instance/list").unwrap();
    assert_eq!(list.query.get("healthyOnly").map(String::as_str), Some("false"));
}

type Answer = Box<dyn Fn() -> FakeResponse + Send + Sync>;

/// Every garbage answer gives an error or dropped hosts; the client keeps working.
#[tokio::test]
async fn fake_garbage_answers_are_errors_or_dropped_hosts_never_panics() {
    let big = || {
        let mut b = b"{\"hosts\":[".to_vec();
        b.resize(50 * 1024 * 1024, b' ');
        b
    };
    let errors: Vec<(&str, Answer)> = vec![
        ("invalid JSON", Box::new(|| FakeResponse::new(200, "{\"hosts\": [{\"ip\": "))),
        ("empty body", Box::new(|| FakeResponse::new(200, ""))),
        ("HTML", Box::new(|| FakeResponse::new(200, "<html>hi</html>"))),
        ("a JSON array", Box::new(|| FakeResponse::new(200, "[]"))),
        ("hosts missing", Box::new(|| FakeResponse::json(json!({ "name": "x" })))),
        ("hosts wrong type", Box::new(|| FakeResponse::json(json!({ "hosts": "10.0.0.1:80" })))),
        ("non-UTF-8 bytes", Box::new(|| FakeResponse::new(200, b"{\"hosts\":[],\"name\":\"\xff\xfe\x80\"}".to_vec()))),
        (
            "a number out of range",
            Box::new(|| FakeResponse::new(200, "{\"hosts\":[{\"ip\":\"10.0.0.1\",\"port\":8000,\"weight\":1e400}]}")),
        ),
        ("50 MB with Content-Length", Box::new(move || FakeResponse::new(200, big()))),
        (
            "50 MB without Content-Length",
            Box::new(move || FakeResponse { content_length: false, ..FakeResponse::new(200, big()) }),
        ),
        ("http 500", Box::new(|| FakeResponse::new(500, "\x00\x01 internal \u{7}"))),
    ];
    for (what, resp) in errors {
        let fake = v1_fake(resp);
        let mut src = NacosSource::connect(&config(fake.url(), |c| c.api = NacosApi::V1), &catalog()).await.unwrap();
        let t = Instant::now();
        let e = match src.discover().await {
            Ok(s) => panic!("{what}: expected an error, got {s:?}"),
            Err(e) => error_chain(&e),
        };
        assert!(t.elapsed() < Duration::from_secs(5), "{what}: took {:?}", t.elapsed());
        assert!(e.contains(&fake.url()), "{what}: the error names the server: {e}");
        assert!(e.len() < 1000, "{what}: the error is bounded: {} bytes", e.len());
        if what.starts_with("50 MB") {
            assert!(e.contains("longer than 16777216 bytes"), "{what}: {e}");
        }
    }

    let dropped = json!({ "hosts": [
        { "ip": "10.9.0.1", "port": 8000 },
        { "ip": "ff02::1", "port": 8000 },
        { "ip": "fe80::1%eth0", "port": 8000 },
        { "ip": "10.9.0.2" },
        { "ip": "10.9.0.3", "port": 70000 },
        { "ip": "10.9.0.4", "port": "8000" },
        { "ip": "10.9.0.5", "port": 8000, "weight": "heavy" },
        { "ip": "10.9.0.6", "port": 8000, "weight": -3 },
        { "ip": "10.9.0.7", "port": 8000, "healthy": "yes" },
        { "ip": "10.9.0.8", "port": 8000, "metadata": [1, 2] },
        { "ip": 167772161u32, "port": 8000 },
        { "ip": "10.9.0.10", "port": 18446744073709551615u64 },
        "10.9.0.11:8000",
        null
    ] });
    let fake = v1_fake(move || FakeResponse::json(dropped.clone()));
    let mut src = NacosSource::connect(&config(fake.url(), |c| c.api = NacosApi::V1), &catalog()).await.unwrap();
    let snap = src.discover().await.unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert_eq!(snap.instances.len(), 1, "{:#?}", snap.instances);
    assert_eq!(snap.instances[0].address.to_string(), "10.9.0.1:8000");
    assert_eq!(src.dropped_total(), 13);
}

#[tokio::test]
async fn fake_server_that_never_answers_times_out() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut src = NacosSource::connect(&config(url, |c| c.timeout = "300ms".into()), &catalog()).await.unwrap();
    let t = Instant::now();
    assert!(src.discover().await.is_err());
    assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
    drop(listener);
}

fn v3_body() -> serde_json::Value {
    json!({ "code": 0, "message": "success", "data": [
        { "ip": "10.10.0.1", "port": 8000, "weight": 1.5, "healthy": true, "enabled": true, "ephemeral": true,
          "clusterName": "DEFAULT", "serviceName": "llm", "metadata": { "model_version": "v2" },
          "instanceId": "10.10.0.1#8000#DEFAULT#DEFAULT_GROUP@@llm" } ] })
}

#[tokio::test]
async fn fake_v3_client_api_with_auto_detection_and_v3_login() {
    let fake = FakeNacos::start(|r: &FakeRequest| match r.path.as_str() {
        "/nacos/v3/auth/user/login" => {
            let body = String::from_utf8_lossy(&r.body).into_owned();
            if body.contains("password=right") {
                FakeResponse::json(json!({ "accessToken": "v3token", "tokenTtl": 18000, "globalAdmin": false }))
            } else {
                FakeResponse::new(403, "{\"code\":403,\"message\":\"user not found!\"}")
            }
        }
        "/nacos/v3/client/ns/instance/list" if r.headers.get("accesstoken").map(String::as_str) == Some("v3token") => {
            FakeResponse::json(v3_body())
        }
        "/nacos/v3/client/ns/instance/list" => FakeResponse::new(403, "{\"code\":403,\"message\":\"no token\"}"),
        _ => FakeResponse::new(404, "not found"),
    });
    let with = |pw: &str| {
        config(fake.url(), |c| {
            c.username = Some("nacos".into());
            c.password = Some(ailb_userspace::nacos::Secret::new(pw));
        })
    };
    let mut src = NacosSource::connect(&with("right"), &catalog()).await.unwrap();
    let snap = src.discover().await.unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert_eq!(snap.instances.len(), 1);
    assert_eq!((snap.instances[0].weight, snap.instances[0].metadata["model_version"].as_str()), (1.5, "v2"));
    assert!(!snap.services[0].reach_protection_threshold, "the v3 client API does not report it");
    let paths: Vec<_> = fake.requests().into_iter().map(|r| r.path).collect();
    assert!(!paths.iter().any(|p| p.contains("/v1/")), "a v3 server is read with v3 only: {paths:?}");
    let list = fake.requests().into_iter().find(|r| r.path.ends_with("instance/list")).unwrap();
    assert_eq!(list.query.get("healthyOnly").map(String::as_str), Some("false"));
    assert!(!list.query.contains_key("accessToken"), "v3 carries the token in a header");

    let e = NacosSource::connect(&with("wrong"), &catalog()).await.err().expect("wrong password");
    assert!(matches!(e, NacosError::LoginRefused { status: 403, .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&fake.url()) && msg.contains("403") && msg.contains("user not found!"), "{msg}");
}

#[tokio::test]
async fn fake_v3_error_codes_are_errors() {
    let fake = FakeNacos::start(|_| {
        FakeResponse::json(json!({ "code": 21000, "message": "service name error", "data": null }))
    });
    let mut src = NacosSource::connect(&config(fake.url(), |c| c.api = NacosApi::V3), &catalog()).await.unwrap();
    let e = src.discover().await.unwrap_err();
    assert!(matches!(e, NacosError::Api { code: 21000, .. }), "{e}");
}

/// The v1 UDP push as Nacos 1.x sends it: the fake learns `udpPort`/`clientIP` from a list
/// read, sends a push (gzip, as Nacos does for larger payloads), and expects the ack.
#[tokio::test]
async fn fake_v1_udp_push_wakes_changed_and_is_acked() {
    let fake = v1_fake(|| FakeResponse::json(json!({ "hosts": [] })));
    let mut src = NacosSource::connect(&config(fake.url(), |c| c.api = NacosApi::V1), &catalog()).await.unwrap();
    src.discover().await.unwrap();
    let list = fake.requests().into_iter().find(|r| r.path == "/nacos/v1/ns/instance/list").unwrap();
    let port: u16 = list.query["udpPort"].parse().unwrap();
    assert_eq!(Some(port), src.push_port());
    let client_ip = list.query["clientIP"].clone();
    assert_eq!(client_ip, "127.0.0.1", "the address the route to the server leaves from");

    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let push = |service: &str, t: u64, gzip: bool| {
        let data = json!({ "name": service, "hosts": [] }).to_string();
        let raw = json!({ "type": "dom", "data": data, "lastRefTime": t }).to_string().into_bytes();
        let bytes = if gzip {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(&raw).unwrap();
            e.finish().unwrap()
        } else {
            raw
        };
        server.send_to(&bytes, (client_ip.as_str(), port)).unwrap();
    };
    let ack = || {
        let mut buf = [0u8; 2048];
        let (n, _) = server.recv_from(&mut buf).expect("an ack within 5s");
        serde_json::from_slice::<serde_json::Value>(&buf[..n]).unwrap()
    };

    // An unwatched service is acked but does not wake the daemon.
    push("DEFAULT_GROUP@@other", 41, false);
    let woke = tokio::time::timeout(Duration::from_millis(300), src.changed()).await.is_ok();
    assert!(!woke, "a push for an unwatched service woke changed()");
    assert_eq!(ack(), json!({ "type": "push-ack", "lastRefTime": "41", "data": "" }));

    push("DEFAULT_GROUP@@llm", 42, true);
    tokio::time::timeout(Duration::from_secs(5), src.changed()).await.expect("changed() after a push");
    assert_eq!(ack(), json!({ "type": "push-ack", "lastRefTime": "42", "data": "" }));

    // Garbage datagrams are ignored; the receiver keeps working.
    server.send_to(b"\x1f\x8b\x08garbage", (client_ip.as_str(), port)).unwrap();
    server.send_to(&[0xff; 1000], (client_ip.as_str(), port)).unwrap();
    push("llm", 43, false);
    tokio::time::timeout(Duration::from_secs(5), src.changed()).await.expect("changed() after garbage and a push");
    assert_eq!(ack()["lastRefTime"], "43");
    assert_eq!(src.pushes_received(), 3);
}

#[tokio::test]
async fn push_off_means_changed_never_completes_and_no_udp_port_is_sent() {
    let fake = v1_fake(|| FakeResponse::json(json!({ "hosts": [] })));
    let cfg = config(fake.url(), |c| {
        c.api = NacosApi::V1;
        c.udp_push = false;
    });
    let mut src = NacosSource::connect(&cfg, &catalog()).await.unwrap();
    src.discover().await.unwrap();
    assert!(src.push_port().is_none());
    assert!(fake.requests().iter().all(|r| !r.query.contains_key("udpPort")));
    assert!(tokio::time::timeout(Duration::from_millis(100), src.changed()).await.is_err());
}
