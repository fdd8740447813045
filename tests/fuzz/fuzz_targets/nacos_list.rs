//! Nacos instance lists: the first byte picks v1 (even) or v3 (odd), the rest is the answer.
//! Besides no panic: every entry of the answer's array is either kept or dropped with a reason,
//! every kept host is usable, and the kept hosts written back as an answer parse the same.
#![no_main]

use ailb_fuzz::same_f64;
use ailb_userspace::fuzzing::{self, Host, List};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    if which % 2 == 0 {
        if let Ok(list) = fuzzing::nacos_v1_list(body) {
            check(body, "hosts", &list);
            let again = json!({ "hosts": hosts_json(&list.hosts), "reachProtectionThreshold": list.reach_protection_threshold });
            let again = fuzzing::nacos_v1_list(again.to_string().as_bytes()).expect("a written-back v1 list parses");
            assert_eq!(again.reach_protection_threshold, list.reach_protection_threshold);
            same_hosts(&again, &list);
        }
    } else {
        match fuzzing::nacos_v3_list(body) {
            Ok(Ok(list)) => {
                check(body, "data", &list);
                assert_eq!(fuzzing::nacos_v3_envelope(body).map(|e| e.0), Some(0));
                let again = json!({ "code": 0, "message": "success", "data": hosts_json(&list.hosts) });
                let again =
                    fuzzing::nacos_v3_list(again.to_string().as_bytes()).expect("a written-back v3 list parses");
                same_hosts(&again.expect("code 0"), &list);
            }
            Ok(Err((code, message))) => {
                assert_ne!(code, 0);
                assert!(!message.chars().any(char::is_control), "message {message:?} not escaped");
                assert_eq!(fuzzing::nacos_v3_envelope(body), Some((code, message)));
            }
            Err(_) => {}
        }
    }
});

fn check(body: &[u8], key: &str, list: &List) {
    let v: Value = serde_json::from_slice(body).expect("a parsed answer is JSON");
    let entries = v[key].as_array().expect("a parsed answer has its array").len();
    assert_eq!(list.hosts.len() + list.dropped.len(), entries, "every entry kept or dropped");
    for h in &list.hosts {
        let ip = h.address.ip();
        let broadcast = matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast());
        assert!(h.address.port() != 0 && !ip.is_unspecified() && !broadcast && !ip.is_multicast(), "{h:?}");
        assert!(h.weight.is_finite() && h.weight >= 0.0, "{h:?}");
    }
}

fn hosts_json(hosts: &[Host]) -> Value {
    hosts
        .iter()
        .map(|h| {
            json!({
                "ip": h.address.ip().to_string(),
                "port": h.address.port(),
                "weight": h.weight,
                "healthy": h.healthy,
                "enabled": h.enabled,
                "clusterName": h.cluster,
                "metadata": h.metadata,
            })
        })
        .collect()
}

fn same_hosts(again: &List, list: &List) {
    assert!(again.dropped.is_empty(), "{:?}", again.dropped);
    assert_eq!(again.hosts.len(), list.hosts.len());
    for (a, b) in again.hosts.iter().zip(&list.hosts) {
        assert!(same_f64(a.weight, b.weight), "{a:?} != {b:?}");
        assert_eq!(Host { weight: b.weight, ..a.clone() }, *b);
    }
}
