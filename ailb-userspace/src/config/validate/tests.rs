use super::super::{load_valid, Config};

fn err(text: &str) -> String {
    match Config::parse(text, "test").and_then(|c| c.validate()) {
        Ok(_) => panic!("config should be rejected:\n{text}"),
        Err(e) => e.to_string(),
    }
}

const OK: &str = r#"
[[services]]
model = "m"
vip = "127.77.0.1:8000"
[[backends]]
model = "m"
address = "127.0.0.11:18001"
"#;

#[test]
fn embedded_default_is_valid() {
    let c = load_valid(None).unwrap();
    assert_eq!(c.backends.len(), 3);
    assert_eq!(c.cgroup, "ailb-demo", "the default must not attach to the cgroup2 root");
    assert_eq!(c.balancer.load_factor_milli, 1250);
}

#[test]
fn minimal_config_gets_documented_defaults() {
    let c = Config::parse(OK, "t").unwrap().validate().unwrap();
    assert_eq!(c.bpffs.to_str(), Some("/sys/fs/bpf/ailb"));
    assert_eq!(c.cgroup, "ailb");
    assert_eq!((c.balancer.probes, c.balancer.affinity, c.balancer.load_bound), (4, true, true));
    assert_eq!(c.balancer.affinity_ttl.as_secs(), 1800);
    assert_eq!(c.balancer.affinity_wait.as_secs(), 20);
    assert_eq!(c.balancer.prefix_load_factor_milli, 2000);
    assert_eq!(c.backends[0].weight, 1);
}

#[test]
fn the_prefix_holders_factor_defaults_to_2_or_the_tables_if_larger() {
    let factor = |balancer: &str| Config::parse(&format!("{balancer}{OK}"), "t").unwrap().validate().unwrap().balancer;
    let b = factor("[balancer]\nload_factor = 3.0\n");
    assert_eq!((b.load_factor_milli, b.prefix_load_factor_milli), (3000, 3000));
    let b = factor("[balancer]\nload_factor = 1.1\n");
    assert_eq!((b.load_factor_milli, b.prefix_load_factor_milli), (1100, 2000));
    let b = factor("[balancer]\nload_factor = 1.1\nprefix_load_factor = 1.5\n");
    assert_eq!((b.load_factor_milli, b.prefix_load_factor_milli), (1100, 1500));
}

#[test]
fn bad_values_name_field_and_value() {
    let cases: &[(&str, &str, &str)] = &[
        ("127.0.0.11:18001\"", "127.0.0.999:1\"", "backends[0].address"),
        ("127.0.0.11:18001\"", "127.0.0.11:18001\"\nweight = 70000", "backends[0].weight"),
        ("127.0.0.11:18001\"", "[::ffff:10.0.0.1]:80\"", "v4-mapped"),
        ("127.0.0.11:18001\"", "127.0.0.11:0\"", "port 0"),
        ("127.77.0.1:8000\"", "nonsense\"", "services[0].vip"),
    ];
    for (from, to, want) in cases {
        let e = err(&OK.replace(from, to));
        assert!(e.contains(want), "error {e:?} should mention {want:?}");
    }
    let e = err(&format!("[balancer]\nload_factor = 0.5\n{OK}"));
    assert!(e.contains("balancer.load_factor") && e.contains("0.5"), "{e}");
    let e = err(&format!("[balancer]\nprefix_load_factor = 1.0\n{OK}"));
    assert!(e.contains("balancer.prefix_load_factor") && e.contains('1'), "{e}");
    let e = err(&format!("[balancer]\nprefix_load_factor = 11\n{OK}"));
    assert!(e.contains("balancer.prefix_load_factor") && e.contains("11"), "{e}");
    let e = err(&format!("[balancer]\nprobes = 0\n{OK}"));
    assert!(e.contains("balancer.probes"), "{e}");
    let e = err(&format!("[balancer]\naffinity_ttl = \"soon\"\n{OK}"));
    assert!(e.contains("balancer.affinity_ttl") && e.contains("soon"), "{e}");
    let e = err(&format!("[balancer]\naffinity_wait = \"-1s\"\n{OK}"));
    assert!(e.contains("balancer.affinity_wait") && e.contains("-1s"), "{e}");
    let e = err(&OK.replace("model = \"m\"\naddress", "model = \"other\"\naddress"));
    assert!(e.contains("backends[0].model") && e.contains("other"), "{e}");
    let e = err(&format!("{OK}{}", &OK[OK.find("[[backends]]").unwrap()..]));
    assert!(e.contains("listed twice"), "{e}");
    let e = err("[[backends]]\nmodel = \"m\"\naddress = \"127.0.0.1:1\"\n");
    assert!(e.contains("models"), "{e}");
    let e = err(&format!("bogus = 1\n{OK}"));
    assert!(e.contains("bogus"), "{e}");
    let e = err("this is not toml");
    assert!(e.contains("config test"), "{e}");
}

/// VIPs and backends of either family, a model with both; a bad IPv6 address names the
/// field and the value.
#[test]
fn ipv6_vips_and_backends_are_accepted_and_checked() {
    let mixed = format!(
        "{OK}[[services]]\nmodel = \"m\"\nvip = \"[fd00::77]:8000\"\n\
             [[backends]]\nmodel = \"m\"\naddress = \"[2001:db8::11]:18001\"\nweight = 3\n"
    );
    let c = Config::parse(&mixed, "t").unwrap().validate().unwrap();
    let vips: Vec<String> = c.models["m"].spec.vips.iter().map(ToString::to_string).collect();
    assert_eq!(vips, ["127.77.0.1:8000", "[fd00::77]:8000"]);
    let addrs: Vec<String> = c.backends.iter().map(|b| b.address.to_string()).collect();
    assert_eq!(addrs, ["127.0.0.11:18001", "[2001:db8::11]:18001"]);
    for (value, field, want) in [
        ("[::1]:0", "backends[0].address", "port 0"),
        ("[ff02::1]:80", "backends[0].address", "not a unicast IPv6 address"),
        ("[::]:80", "backends[0].address", "not a unicast IPv6 address"),
        ("[fe80::1%2]:80", "backends[0].address", "zone"),
        ("::1:80", "backends[0].address", "[IPv6 address]:port"),
    ] {
        let e = err(&OK.replace("127.0.0.11:18001", value));
        assert!(e.contains(field) && e.contains(value) && e.contains(want), "{value}: {e}");
    }
    let e = err(&OK.replace("127.77.0.1:8000", "[ff02::1]:8000"));
    assert!(e.contains("services[0].vip") && e.contains("[ff02::1]:8000"), "{e}");
    // The same VIP twice is refused in either family.
    let twice = format!("{OK}[[services]]\nmodel = \"m\"\nvip = \"[fd00::77]:8000\"\n");
    let twice = format!("{twice}[[services]]\nmodel = \"m\"\nvip = \"[fd00::77]:8000\"\n");
    assert!(err(&twice).contains("used twice"));
    // A backend sampled on this node goes through the agent's IPv4-only sampler.
    let live = OK.replace("127.0.0.11:18001\"", "[::1]:18001\"\nmetrics_url = \"http://[::1]:8000/metrics\"");
    let e = err(&live);
    assert!(e.contains("backends[0].address") && e.contains("IPv4"), "{e}");
}

#[test]
fn live_telemetry_keys_are_checked_as_the_agents() {
    let live = OK.replace("18001\"", "18001\"\nmetrics_url = \"http://127.0.0.1:8000/metrics\"\ngpus = [0, \"GPU-1\"]");
    let c = Config::parse(&live, "t").unwrap().validate().unwrap();
    let t = c.backends[0].telemetry.as_deref().expect("sampled");
    assert!(t.nvml && t.gpus.len() == 2 && t.metrics_url.as_str() == "http://127.0.0.1:8000/metrics");
    assert_eq!(c.sample_interval.as_millis(), 500);
    assert!(Config::parse(OK, "t").unwrap().validate().unwrap().backends[0].telemetry.is_none());
    for (extra, field) in [
        ("gpus = [0]", "backends[0].gpus"),
        ("health_url = \"http://127.0.0.1:1/health\"", "backends[0].health_url"),
        ("server = \"sglang\"", "backends[0].server"),
    ] {
        let e = err(&format!("{OK}{extra}\n"));
        assert!(e.contains(field) && e.contains("metrics_url"), "{e}");
    }
    let e = err(&live.replace("metrics\"", "metrics\"\nfree_memory_mb = 8000"));
    assert!(e.contains("backends[0].free_memory_mb") && e.contains("8000"), "{e}");
    let e = err(&live.replace("http://127.0.0.1:8000/metrics", "ftp://x/metrics"));
    assert!(e.contains("backends[0].metrics_url") && e.contains("ftp://x/metrics"), "{e}");
    let e = err(&live.replace("gpus = [0, \"GPU-1\"]", "server = \"custom\""));
    assert!(e.contains("backends[0].metrics"), "custom needs names: {e}");
    let e = err(&live.replace("gpus = [0", "kv_bytes_per_token = 131072\ngpus = [0"));
    assert!(e.contains("backends[0].kv_bytes_per_token") && e.contains("remove gpus"), "{e}");
    assert!(!e.contains("nvml ="), "a backend has no nvml key: {e}");
    let e = err(&format!("[daemon]\nsample_interval = \"10ms\"\n{OK}"));
    assert!(e.contains("daemon.sample_interval") && e.contains("10ms"), "{e}");
}

/// `models[i].prefix` and a backend's KV-event publisher: the values kept, bad ones named.
#[test]
fn prefix_mode_and_kv_events_are_checked() {
    use crate::policy::PrefixMode;
    let model = "[[models]]\nname = \"m\"\nvips = [\"127.77.0.1:8000\"]\nprefix = \"precise\"\n";
    let backend = "[[backends]]\nmodel = \"m\"\naddress = \"127.0.0.11:18001\"\n";
    let kv = "kv_events = \"tcp://127.0.0.11:5557\"\nkv_replay = \"tcp://127.0.0.11:5558\"\nkv_block_size = 16\n";
    let c = Config::parse(&format!("{model}{backend}{kv}"), "test").and_then(|c| c.validate()).expect("valid");
    assert_eq!(c.models["m"].spec.prefix, PrefixMode::Precise);
    let source = c.backends[0].kv_events.as_ref().expect("a publisher");
    assert_eq!(
        (source.endpoint.as_str(), source.replay.as_deref()),
        ("tcp://127.0.0.11:5557", Some("tcp://127.0.0.11:5558"))
    );
    assert_eq!(source.block_size.get(), 16);
    let c = Config::parse(OK, "test").and_then(|c| c.validate()).expect("valid");
    assert_eq!((c.models["m"].spec.prefix, c.backends[0].kv_events.as_ref()), (PrefixMode::Off, None));
    for (bad, want) in [
        (format!("{}{backend}", model.replace("precise", "exact")), "models[0].prefix"),
        (format!("{model}{backend}{}", kv.replace("tcp://127.0.0.11:5557", "tcp://*:5557")), "backends[0].kv_events"),
        (
            format!("{model}{backend}{}", kv.replace("tcp://127.0.0.11:5558", "127.0.0.11:5558")),
            "backends[0].kv_replay",
        ),
        (format!("{model}{backend}{}", kv.replace("kv_block_size = 16\n", "")), "backends[0].kv_block_size"),
        (format!("{model}{backend}{}", kv.replace("= 16", "= 0")), "backends[0].kv_block_size"),
        (format!("{model}{backend}kv_block_size = 16\n"), "only with kv_events"),
    ] {
        let e = err(&bad);
        assert!(e.contains(want), "error {e:?} should mention {want:?}");
    }
}
