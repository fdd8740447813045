use super::*;

#[test]
fn renders_every_section() {
    let t = TestConfig::new("/sys/fs/bpf/x", "/sys/fs/cgroup/unified/y")
        .service("m", "127.77.0.1:8000")
        .backend(BackendCfg::new("m", "127.0.0.11:1", 2).free_memory_mb(8000))
        .to_toml();
    assert!(t.contains("[daemon]\nbpffs = \"/sys/fs/bpf/x\"\ncgroup = \"/sys/fs/cgroup/unified/y\""));
    assert!(
            t.contains("load_factor = 1.25\nprobes = 4\naffinity = true\nload_bound = true\nround_robin = false\naffinity_ttl = \"30m\"")
        );
    assert!(t.contains("[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\""));
    assert!(t.contains("[[backends]]\nmodel = \"m\"\naddress = \"127.0.0.11:1\"\nweight = 2\nfree_memory_mb = 8000"));
}

#[test]
fn load_factor_is_always_a_toml_float() {
    let mut c = TestConfig::new("a", "b");
    c.load_factor = 2.0;
    assert!(c.to_toml().contains("load_factor = 2.0\n"));
}

#[test]
fn quotes_strings() {
    assert_eq!(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
}
