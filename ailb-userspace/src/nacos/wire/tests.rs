use std::io::Write;

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn v1(hosts: Value) -> Vec<u8> {
    json!({ "name": "DEFAULT_GROUP@@llm", "clusters": "", "cacheMillis": 10000, "hosts": hosts,
            "lastRefTime": 1, "checksum": "", "allIPs": false, "reachProtectionThreshold": false })
    .to_string()
    .into_bytes()
}

#[test]
fn v1_documented_shape() {
    let body = v1(json!([
        { "instanceId": "10.0.0.1#8000#DEFAULT#DEFAULT_GROUP@@llm", "ip": "10.0.0.1", "port": 8000,
          "weight": 2.5, "healthy": false, "enabled": true, "ephemeral": true, "clusterName": "gpu-a",
          "serviceName": "DEFAULT_GROUP@@llm", "metadata": { "gpu_type": "H100", "free_memory_mb": 4096, "x": null } },
        { "ip": "10.0.0.2", "port": 8001 }
    ]));
    let l = parse_v1_list(&body).unwrap();
    assert!(l.dropped.is_empty(), "{:?}", l.dropped);
    assert_eq!(l.hosts.len(), 2);
    let h = &l.hosts[0];
    assert_eq!((h.address.to_string().as_str(), h.weight, h.healthy, h.enabled), ("10.0.0.1:8000", 2.5, false, true));
    assert_eq!(h.cluster, "gpu-a");
    assert_eq!(h.metadata["gpu_type"], "H100");
    assert_eq!(h.metadata["free_memory_mb"], "4096", "non-string values become their JSON text");
    assert_eq!(h.metadata["x"], "null");
    let d = &l.hosts[1];
    assert_eq!((d.weight, d.healthy, d.enabled, d.cluster.as_str()), (1.0, true, true, "DEFAULT"), "Nacos defaults");
}

#[test]
fn v1_protection_threshold() {
    let body = json!({ "hosts": [], "reachProtectionThreshold": true }).to_string();
    assert!(parse_v1_list(body.as_bytes()).unwrap().reach_protection_threshold);
    let body = json!({ "hosts": [], "reachProtectionThreshold": "yes" }).to_string();
    assert!(!parse_v1_list(body.as_bytes()).unwrap().reach_protection_threshold);
}

#[test]
fn v1_bad_hosts_are_dropped_with_a_reason() {
    let cases = [
        (json!({ "port": 1 }), "no ip"),
        (json!({ "ip": 7, "port": 1 }), "ip is not a string"),
        (json!({ "ip": "fe80::1%eth0", "port": 1 }), "not an IPv4 or IPv6 address"),
        (json!({ "ip": "ff02::1", "port": 1 }), "not a unicast address"),
        (json!({ "ip": "::", "port": 1 }), "not a unicast address"),
        (json!({ "ip": "0.0.0.0", "port": 1 }), "unicast"),
        (json!({ "ip": "10.0.0.1" }), "no port"),
        (json!({ "ip": "10.0.0.1", "port": 0 }), "port"),
        (json!({ "ip": "10.0.0.1", "port": 65536 }), "port"),
        (json!({ "ip": "10.0.0.1", "port": -1 }), "port"),
        (json!({ "ip": "10.0.0.1", "port": 80.5 }), "port"),
        (json!({ "ip": "10.0.0.1", "port": "80" }), "port is not a number"),
        (json!({ "ip": "10.0.0.1", "port": 18446744073709551615u64 }), "port"),
        (json!({ "ip": "10.0.0.1", "port": 80, "weight": "1" }), "weight"),
        (json!({ "ip": "10.0.0.1", "port": 80, "weight": -1 }), "weight"),
        (json!({ "ip": "10.0.0.1", "port": 80, "healthy": "true" }), "healthy"),
        (json!({ "ip": "10.0.0.1", "port": 80, "enabled": 1 }), "enabled"),
        (json!({ "ip": "10.0.0.1", "port": 80, "clusterName": [] }), "clusterName"),
        (json!({ "ip": "10.0.0.1", "port": 80, "metadata": "{}" }), "metadata"),
        (json!("10.0.0.1:80"), "not an object"),
        (json!(null), "not an object"),
    ];
    // IPv6 hosts are kept as they are, a v4-mapped one as the IPv4 address it maps.
    let l = parse_v1_list(&v1(json!([{ "ip": "2001:db8::9", "port": 9 }, { "ip": "::ffff:10.0.0.9", "port": 9 }])))
        .unwrap();
    let addrs: Vec<String> = l.hosts.iter().map(|h| h.address.to_string()).collect();
    assert_eq!(addrs, ["[2001:db8::9]:9", "10.0.0.9:9"], "{:?}", l.dropped);
    for (host, why) in cases {
        let l = parse_v1_list(&v1(json!([host, { "ip": "10.0.0.9", "port": 9 }]))).unwrap();
        assert_eq!(l.hosts.len(), 1, "{host}: the good host stays");
        assert_eq!(l.dropped.len(), 1, "{host}");
        assert!(l.dropped[0].contains(why), "{host}: {:?} should say {why:?}", l.dropped);
    }
}

#[test]
fn v1_bad_answers_are_errors() {
    for body in [
        &b""[..],
        b"not json",
        b"{\"hosts\": [",
        b"[]",
        b"{}",
        b"{\"hosts\": {}}",
        b"{\"hosts\": null}",
        b"{\"hosts\": [], \"x\": \"\xff\xfe\"}",
        b"{\"hosts\": [{\"ip\": \"10.0.0.1\", \"port\": 1e999}]}",
    ] {
        assert!(parse_v1_list(body).is_err(), "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn huge_numbers() {
    let l = parse_v1_list(
        br#"{"hosts":[{"ip":"10.0.0.1","port":80,"weight":1e308},
        {"ip":"10.0.0.2","port":80,"weight":123456789012345678901234567890}]}"#,
    )
    .unwrap();
    assert_eq!(l.hosts.len(), 2);
    assert!(l.hosts.iter().all(|h| h.weight.is_finite()));
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let body = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(parse_v1_list(body.as_bytes()).is_err());
}

#[test]
fn v3_shape() {
    let body = json!({ "code": 0, "message": "success", "data": [
        { "ip": "10.0.0.1", "port": 8000, "weight": 1.0, "healthy": true, "enabled": false,
          "clusterName": "DEFAULT", "serviceName": "llm", "metadata": {} } ] })
    .to_string();
    let l = parse_v3_list(body.as_bytes()).unwrap().unwrap();
    assert_eq!(l.hosts.len(), 1);
    assert!(!l.hosts[0].enabled);
    let body = json!({ "code": 21008, "message": "service not found", "data": null }).to_string();
    let f = parse_v3_list(body.as_bytes()).unwrap().unwrap_err();
    assert_eq!((f.code, f.message.as_str()), (21008, "service not found"));
    for bad in [r#"{"data": []}"#, r#"{"code": "0", "data": []}"#, r#"{"code": 0, "data": {}}"#, r#"{"code": 0}"#] {
        assert!(parse_v3_list(bad.as_bytes()).is_err(), "{bad}");
    }
    assert!(v3_envelope(b"<html>404</html>").is_none());
    assert_eq!(v3_envelope(br#"{"code":404,"message":"x"}"#).unwrap().code, 404);
}

#[test]
fn login_answers() {
    let l = parse_login(br#"{"accessToken":"eyJ.abc","tokenTtl":18000,"globalAdmin":true}"#).unwrap();
    assert_eq!((l.access_token.expose(), l.token_ttl), ("eyJ.abc", Some(18000)));
    assert!(!format!("{l:?}").contains("eyJ.abc"), "a token is never printed: {l:?}");
    assert_eq!(parse_login(br#"{"accessToken":"t","tokenTtl":"60"}"#).unwrap().token_ttl, Some(60));
    assert_eq!(parse_login(br#"{"accessToken":"t","tokenTtl":-5}"#).unwrap().token_ttl, None);
    assert_eq!(parse_login(br#"{"accessToken":"t","tokenTtl":1e300}"#).unwrap().token_ttl, None);
    for bad in [
        &br#"{"tokenTtl":1}"#[..],
        br#"{"accessToken":""}"#,
        br#"{"accessToken":5}"#,
        br#"{"accessToken":"a b"}"#,
        b"unknown user!",
    ] {
        assert!(parse_login(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn printable_escapes_and_cuts() {
    assert_eq!(printable(b"unknown user!"), "unknown user!");
    assert_eq!(printable(b"a\nb\xff"), "a\\nb\\u{fffd}");
    let long = printable(&[b'x'; 10_000]);
    assert!(long.len() <= 203 && long.ends_with("..."));
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

#[test]
fn push_packets_and_acks() {
    let data = json!({ "name": "DEFAULT_GROUP@@llm", "hosts": [] }).to_string();
    let raw = json!({ "type": "dom", "data": data, "lastRefTime": 123456789012345u64 }).to_string();
    for bytes in [raw.clone().into_bytes(), gzip(raw.as_bytes())] {
        let p = parse_push(&bytes).unwrap();
        assert_eq!(p.kind, "dom");
        assert_eq!(p.service.as_deref(), Some("DEFAULT_GROUP@@llm"));
        let ack: Value = serde_json::from_slice(&push_ack(&p).unwrap()).unwrap();
        assert_eq!(ack, json!({ "type": "push-ack", "lastRefTime": "123456789012345", "data": "" }));
    }
    let p = parse_push(br#"{"type":"dump","lastRefTime":"7"}"#).unwrap();
    let ack: Value = serde_json::from_slice(&push_ack(&p).unwrap()).unwrap();
    assert_eq!(ack["type"], "dump-ack");
    let p = parse_push(br#"{"type":"dom","data":"not json"}"#).unwrap();
    assert_eq!((p.service, push_ack(&parse_push(br#"{"type":"dom"}"#).unwrap())), (None, None));
    assert!(parse_push(b"\x1f\x8bgarbage").is_err());
    assert!(parse_push(b"{}").is_err());
    let bomb = gzip(&vec![b' '; 8 * 1024 * 1024]);
    assert!(bomb.len() < 65_536);
    assert!(parse_push(&bomb).unwrap_err().to_string().contains("more than"));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_v1_list(&bytes);
        let _ = parse_v3_list(&bytes);
        let _ = parse_login(&bytes);
        let _ = parse_push(&bytes);
        let _ = printable(&bytes);
    }

    #[test]
    fn arbitrary_hosts_never_panic(ip in any::<Option<String>>(), port in any::<Option<i128>>(), w in any::<f64>(),
                                   healthy in any::<Option<u8>>(), meta in any::<Vec<(String, i64)>>()) {
        let mut h = serde_json::Map::new();
        if let Some(ip) = ip { h.insert("ip".into(), json!(ip)); }
        if let Some(p) = port { h.insert("port".into(), serde_json::from_str(&p.to_string()).unwrap_or(Value::Null)); }
        h.insert("weight".into(), json!(w));
        if let Some(x) = healthy { h.insert("healthy".into(), json!(x)); }
        h.insert("metadata".into(), Value::Object(meta.into_iter().map(|(k, v)| (k, json!(v))).collect()));
        let l = parse_v1_list(&v1(json!([Value::Object(h)]))).unwrap();
        prop_assert_eq!(l.hosts.len() + l.dropped.len(), 1);
    }
}
