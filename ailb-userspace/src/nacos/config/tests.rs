use super::*;

fn err(c: &NacosConfig) -> String {
    c.validate().unwrap_err().to_string()
}

#[test]
fn defaults() {
    let v = NacosConfig::with_servers(["http://127.0.0.1:8848"]).validate().unwrap();
    assert_eq!(v.servers[0].as_str(), "http://127.0.0.1:8848/nacos/");
    assert_eq!(v.api, NacosApi::Auto);
    assert_eq!(v.group, "DEFAULT_GROUP");
    assert_eq!(v.namespace, "");
    assert_eq!(v.poll_interval, Duration::from_millis(100));
    assert_eq!(v.timeout, Duration::from_secs(2));
    assert!(v.udp_push && v.credentials.is_none() && v.clusters.is_empty());
}

#[test]
fn context_path() {
    for (s, want) in [
        ("http://h:8848/", "http://h:8848/nacos/"),
        ("http://h:8848/nacos", "http://h:8848/nacos/"),
        ("https://h/reg/", "https://h/reg/"),
    ] {
        assert_eq!(NacosConfig::with_servers([s]).validate().unwrap().servers[0].as_str(), want);
    }
}

#[test]
fn bad_values_name_the_field() {
    let e = err(&NacosConfig::with_servers(["http://ok:1", "ftp://h"]));
    assert!(e.contains("discovery.nacos.servers[1]") && e.contains("scheme"), "{e}");
    let e = err(&NacosConfig::with_servers(Vec::<String>::new()));
    assert!(e.contains("discovery.nacos.servers"), "{e}");
    let e = err(&NacosConfig::with_servers(["http://u:p@h:1"]));
    assert!(e.contains("credentials"), "{e}");
    let mut c = NacosConfig::with_servers(["http://h:1"]);
    c.poll_interval = "5ms".into();
    assert!(err(&c).contains("discovery.nacos.poll_interval"));
    c.poll_interval = "soon".into();
    assert!(err(&c).contains("discovery.nacos.poll_interval"));
    let mut c = NacosConfig::with_servers(["http://h:1"]);
    c.username = Some("nacos".into());
    assert!(err(&c).contains("discovery.nacos.password"));
    c.username = None;
    c.password = Some(Secret::new("x"));
    assert!(err(&c).contains("discovery.nacos.username"));
    let mut c = NacosConfig::with_servers(["http://h:1"]);
    c.clusters = vec!["a,b".into()];
    assert!(err(&c).contains("discovery.nacos.clusters[0]"));
    let mut c = NacosConfig::with_servers(["http://h:1"]);
    c.group = "a@@b".into();
    assert!(err(&c).contains("discovery.nacos.group"));
    let mut c = NacosConfig::with_servers(["http://h:1"]);
    c.timeout = "2m".into();
    assert!(err(&c).contains("discovery.nacos.timeout"));
}

#[test]
fn password_is_never_printed() {
    let mut c = NacosConfig::with_servers(["http://h:1"]);
    c.username = Some("nacos".into());
    c.password = Some(Secret::new("hunter2"));
    let v = c.validate().unwrap();
    assert!(!format!("{c:?}{v:?}").contains("hunter2"));
}

fn with_user() -> NacosConfig {
    let mut c = NacosConfig::with_servers(["http://h:1"]);
    c.username = Some("nacos".into());
    c
}

#[test]
fn password_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nacos.pass");
    std::fs::write(&path, "from-file-pw\n").unwrap();
    let mut c = with_user();
    c.password_file = Some(path.clone());
    assert_eq!(c.validate().unwrap().credentials.unwrap().password.expose(), "from-file-pw");
    std::fs::write(&path, "").unwrap();
    let e = err(&c);
    assert!(e.contains("discovery.nacos.password_file") && e.contains("empty"), "{e}");
    c.password_file = Some(dir.path().join("missing"));
    let e = err(&c);
    assert!(e.contains("discovery.nacos.password_file") && e.contains("cannot read the file"), "{e}");
    c.password_file = Some("relative.pass".into());
    assert!(err(&c).contains("absolute"));
}

#[test]
fn password_from_the_environment() {
    // A variable name of this test only: the tests of this binary share the environment.
    const VAR: &str = "AILB_TEST_NACOS_PASSWORD_CONFIG";
    let mut c = with_user();
    c.password_env = Some(VAR.into());
    let e = err(&c);
    assert!(e.contains("discovery.nacos.password_env") && e.contains(VAR) && e.contains("not set"), "{e}");
    std::env::set_var(VAR, "from-env-pw");
    assert_eq!(c.validate().unwrap().credentials.unwrap().password.expose(), "from-env-pw");
    let e = err(&NacosConfig { password_env: Some("A=B".into()), ..with_user() });
    assert!(e.contains("name of an environment variable"), "{e}");
    std::env::remove_var(VAR);
}

#[test]
fn password_sources_are_exclusive() {
    let mut c = with_user();
    c.password = Some(Secret::new("inline-pw"));
    c.password_env = Some("AILB_NACOS_PASSWORD".into());
    let e = err(&c);
    assert!(e.contains("discovery.nacos.password_env") && e.contains("only one password source"), "{e}");
    assert!(!e.contains("inline-pw"), "{e}");
    c.password = None;
    c.password_file = Some("/etc/ailb/nacos.pass".into());
    let e = err(&c);
    assert!(e.contains("discovery.nacos.password_env") && e.contains("password_file and password_env"), "{e}");
    // A password source without a username is refused as before.
    let mut c = NacosConfig::with_servers(["http://h:1"]);
    c.password_env = Some("AILB_NACOS_PASSWORD".into());
    assert!(err(&c).contains("discovery.nacos.username"));
}

#[test]
fn toml_fields() {
    let c: NacosConfig = toml::from_str(
        "servers = [\"http://h:8848\"]\napi = \"v3\"\nusername = \"u\"\npassword = \"p\"\nudp_push = false\n",
    )
    .unwrap();
    let v = c.validate().unwrap();
    assert_eq!(v.api, NacosApi::V3);
    assert_eq!(v.credentials.unwrap().password.expose(), "p");
    assert!(toml::from_str::<NacosConfig>("servers = []\nbogus = 1\n").is_err());
}
