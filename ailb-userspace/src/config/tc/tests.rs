use std::time::Duration;

use super::*;

fn settings(mode: &str, nat: Option<&str>, ports: &str) -> TcSettings {
    TcSettings { mode: mode.into(), nat_address: nat.map(Into::into), nat_ports: ports.into(), ..Default::default() }
}

fn err(interfaces: &[&str], s: &TcSettings) -> String {
    let names: Vec<String> = interfaces.iter().map(|s| s.to_string()).collect();
    validate(&names, s).expect_err("must be refused").to_string()
}

#[test]
fn defaults_are_off_and_masquerade() {
    let v = validate(&[], &TcSettings::default()).unwrap();
    assert!(v.interfaces.is_empty());
    assert_eq!((v.mode, v.nat_ports, v.idle_timeout), (TcMode::Masquerade, (20000, 29999), Duration::from_secs(300)));
    assert_eq!((v.attach, v.nat_address6), (TcAttach::Auto, None));
    let s = TcSettings { nat_address6: Some("fd00:a1b::1".into()), ..settings("masquerade", Some("10.0.2.1"), "1-2") };
    assert_eq!(validate(&["veth0".into()], &s).unwrap().nat_address6, Some("fd00:a1b::1".parse().unwrap()));
    let v = validate(&["veth0".into()], &settings("routed", None, "1-1")).unwrap();
    assert_eq!((v.mode, v.nat_ports), (TcMode::Routed, (1, 1)));
    for (text, want) in [("tcx", TcAttach::Tcx), ("clsact", TcAttach::Clsact), ("auto", TcAttach::Auto)] {
        let s = TcSettings { attach: text.into(), ..settings("routed", None, "1-1") };
        assert_eq!(validate(&["veth0".into()], &s).unwrap().attach, want);
    }
}

#[test]
fn bad_values_name_the_field_and_the_value() {
    let ok = settings("masquerade", Some("10.0.2.1"), "20000-29999");
    for (interfaces, s, field, value) in [
        (&["a/b"][..], &ok, "daemon.interfaces[0]", "a/b"),
        (&["averyveryverylongname"], &ok, "daemon.interfaces[0]", "averyveryverylongname"),
        (&["eth9", "eth9"], &ok, "daemon.interfaces[1]", "eth9"),
        (&["v0"], &settings("nat", Some("10.0.2.1"), "1-2"), "daemon.tc.mode", "nat"),
        (&["v0"], &settings("masquerade", None, "1-2"), "daemon.tc.nat_address", "(absent)"),
        (&["v0"], &settings("masquerade", Some("10.0.2"), "1-2"), "daemon.tc.nat_address", "10.0.2"),
        (&["v0"], &settings("masquerade", Some("0.0.0.0"), "1-2"), "daemon.tc.nat_address", "0.0.0.0"),
        (&["v0"], &settings("masquerade", Some("10.0.2.1"), "30000-20000"), "daemon.tc.nat_ports", "30000-20000"),
        (&["v0"], &settings("masquerade", Some("10.0.2.1"), "0-10"), "daemon.tc.nat_ports", "0-10"),
        (&["v0"], &settings("masquerade", Some("10.0.2.1"), "20000"), "daemon.tc.nat_ports", "20000"),
        (&["v0"], &settings("masquerade", Some("10.0.2.1"), "1-70000"), "daemon.tc.nat_ports", "1-70000"),
        (&["v0"], &TcSettings { attach: "xdp".into(), ..ok.clone() }, "daemon.tc.attach", "xdp"),
        (
            &["v0"],
            &TcSettings { nat_address6: Some("10.0.2.1".into()), ..ok.clone() },
            "daemon.tc.nat_address6",
            "10.0.2.1",
        ),
        (&["v0"], &TcSettings { nat_address6: Some("::".into()), ..ok.clone() }, "daemon.tc.nat_address6", "::"),
        (
            &["v0"],
            &TcSettings { nat_address6: Some("ff02::1".into()), ..ok.clone() },
            "daemon.tc.nat_address6",
            "ff02::1",
        ),
        (
            &["v0"],
            &TcSettings { nat_address6: Some("::ffff:10.0.2.1".into()), ..ok.clone() },
            "daemon.tc.nat_address6",
            "::ffff:10.0.2.1",
        ),
    ] {
        let e = err(interfaces, s);
        assert!(e.contains(field) && e.contains(value), "{e:?} should name {field} and {value}");
    }
    let e = remote_affinity("models[0].remote_affinity".into(), Some("ip")).unwrap_err().to_string();
    assert!(e.contains("models[0].remote_affinity") && e.contains("ip"), "{e}");
    assert!(remote_affinity("f".into(), Some("client_address")).unwrap());
}
