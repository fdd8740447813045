//! The Nacos client against a real Nacos-compatible server: rnacos 0.8.8, one per test, with
//! instances registered, updated and deregistered through the v1 HTTP API as a GPU node
//! would. rnacos speaks the v1 Open API only, so `api = "auto"` is exercised here as "no v3,
//! fall back to v1". Known rnacos differences (noted where a test meets them): every
//! instance registered over HTTP is healthy (it ignores `healthy`; in our runs it did not mark
//! an instance without heartbeats unhealthy within 30s either), disabled instances are left
//! out of lists, it ignores the `clusters` filter, and it does not send v1 UDP pushes (its
//! push listener is never started). `healthy = false` and `enabled = false` are therefore
//! tested against the fake server (`nacos_fake.rs`).

use std::time::{Duration, Instant};

use ailb_tests::nacos::{NacosInstance, RnacosServer};
use ailb_userspace::{
    discovery::{nacos::NacosSource, Instance, Snapshot},
    nacos::{NacosConfig, NacosError, ValidNacos},
};

fn config(servers: &[String], f: impl FnOnce(&mut NacosConfig)) -> ValidNacos {
    let mut c = NacosConfig::with_servers(servers.iter().cloned());
    f(&mut c);
    c.validate().unwrap_or_else(|e| panic!("test config: {e}"))
}

fn catalog(model: &str, services: &[&str]) -> Vec<(String, Vec<String>)> {
    vec![(model.to_string(), services.iter().map(|s| s.to_string()).collect())]
}

async fn connect(cfg: &ValidNacos, cat: &[(String, Vec<String>)]) -> NacosSource {
    NacosSource::connect(cfg, cat).await.unwrap_or_else(|e| panic!("connect: {e}"))
}

async fn discover(src: &mut NacosSource) -> Snapshot {
    src.discover().await.unwrap_or_else(|e| panic!("discover: {}", ailb_userspace::error_chain(&e)))
}

fn find<'a>(s: &'a Snapshot, addr: &str) -> &'a Instance {
    s.instances
        .iter()
        .find(|i| i.address.to_string() == addr)
        .unwrap_or_else(|| panic!("{addr} not in snapshot {:#?}", s.instances))
}

#[tokio::test]
async fn discover_sees_registered_instances_with_weight_cluster_and_metadata() {
    let nacos = RnacosServer::start();
    nacos.register(
        &NacosInstance::new("llama-70b", "10.1.0.1", 8000).meta("gpu_type", "H100").meta("free_memory_mb", "40960"),
    );
    let mut b = NacosInstance::new("llama-70b", "10.1.0.2", 8000);
    b.weight = 3.5;
    b.cluster = "gpu-b".into();
    nacos.register(&b);
    let mut disabled = NacosInstance::new("llama-70b", "10.1.0.3", 8000);
    disabled.enabled = false;
    nacos.register(&disabled);

    let cfg = config(&[nacos.url()], |_| {});
    let mut src = connect(&cfg, &catalog("llama", &["llama-70b"])).await;
    let snap = discover(&mut src).await;

    // Observed: rnacos leaves disabled instances out of the instance list, so the `enabled`
    // flag from a real server is always true here (its parsing is tested with the fake).
    assert_eq!(snap.instances.len(), 2, "{:#?}", snap.instances);
    let a = find(&snap, "10.1.0.1:8000");
    assert_eq!((a.model.as_str(), a.service.as_str(), a.group.as_str()), ("llama", "llama-70b", "DEFAULT_GROUP"));
    assert_eq!((a.cluster.as_str(), a.weight, a.healthy, a.enabled), ("DEFAULT", 1.0, true, true));
    assert_eq!(a.metadata.get("gpu_type").map(String::as_str), Some("H100"));
    assert_eq!(a.metadata.get("free_memory_mb").map(String::as_str), Some("40960"));
    let b = find(&snap, "10.1.0.2:8000");
    assert_eq!((b.cluster.as_str(), b.weight), ("gpu-b", 3.5));
    assert_eq!(snap.services.len(), 1);
    assert!(!snap.services[0].reach_protection_threshold);
    assert_eq!(src.dropped_total(), 0);
}

#[tokio::test]
async fn update_is_seen_at_the_next_poll_and_equal_reads_compare_equal() {
    let nacos = RnacosServer::start();
    let mut inst = NacosInstance::new("qwen", "10.2.0.1", 9000).meta("queue_length", "0");
    nacos.register(&inst);
    let mut src = connect(&config(&[nacos.url()], |_| {}), &catalog("qwen", &["qwen"])).await;
    let before = discover(&mut src).await;
    assert_eq!(before, discover(&mut src).await, "no change: equal snapshots (the daemon's change detection)");

    inst.weight = 0.25;
    inst.metadata.insert("queue_length".into(), "17".into());
    nacos.update(&inst);
    let after = discover(&mut src).await;
    assert_ne!(before, after);
    let i = find(&after, "10.2.0.1:9000");
    assert_eq!(i.weight, 0.25);
    assert_eq!(i.metadata.get("queue_length").map(String::as_str), Some("17"));

    inst.enabled = false;
    nacos.update(&inst);
    assert!(discover(&mut src).await.instances.is_empty(), "rnacos drops a disabled instance from the list");
}

#[tokio::test]
async fn deregistration_is_seen() {
    let nacos = RnacosServer::start();
    let a = NacosInstance::new("svc", "10.3.0.1", 8000);
    let b = NacosInstance::new("svc", "10.3.0.2", 8000);
    nacos.register(&a);
    nacos.register(&b);
    let mut src = connect(&config(&[nacos.url()], |_| {}), &catalog("m", &["svc"])).await;
    assert_eq!(discover(&mut src).await.instances.len(), 2);
    nacos.deregister(&a);
    let snap = discover(&mut src).await;
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.instances[0].address.to_string(), "10.3.0.2:8000");
    nacos.deregister(&b);
    let snap = discover(&mut src).await;
    assert!(snap.instances.is_empty(), "{:#?}", snap.instances);
    assert_eq!(snap.services.len(), 1, "an empty service is still a read service");
}

#[tokio::test]
async fn two_services_for_one_model_and_a_service_with_no_instances() {
    let nacos = RnacosServer::start();
    nacos.register(&NacosInstance::new("llm-vllm", "10.4.0.1", 8000));
    nacos.register(&NacosInstance::new("llm-sglang", "10.4.0.2", 30000));
    nacos.register(&NacosInstance::new("other", "10.4.0.3", 8000));
    let cat = vec![
        ("llm".to_string(), vec!["llm-vllm".to_string(), "llm-sglang".to_string()]),
        ("later".to_string(), vec!["not-registered-yet".to_string()]),
    ];
    let mut src = connect(&config(&[nacos.url()], |_| {}), &cat).await;
    let snap = discover(&mut src).await;
    let mut got: Vec<_> = snap.instances.iter().map(|i| (i.model.as_str(), i.service.as_str())).collect();
    got.sort();
    assert_eq!(got, [("llm", "llm-sglang"), ("llm", "llm-vllm")]);
    assert_eq!(snap.services.len(), 3);

    // A reload that drops a service stops reading it.
    src.set_catalog(&catalog("llm", &["llm-vllm"]));
    let snap = discover(&mut src).await;
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.instances[0].service, "llm-vllm");
}

#[tokio::test]
async fn namespace_group_and_clusters() {
    let nacos = RnacosServer::start();
    let mut a = NacosInstance::new("llm", "10.5.0.1", 8000);
    a.namespace = "prod".into();
    a.group = "LLM".into();
    a.cluster = "a".into();
    let mut b = a.clone();
    b.ip = "10.5.0.2".into();
    b.cluster = "b".into();
    nacos.register(&a);
    nacos.register(&b);
    nacos.register(&NacosInstance::new("llm", "10.5.0.9", 8000)); // public namespace, DEFAULT_GROUP

    let cat = catalog("llm", &["llm"]);
    let mut public = connect(&config(&[nacos.url()], |_| {}), &cat).await;
    let snap = discover(&mut public).await;
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.instances[0].address.to_string(), "10.5.0.9:8000");

    let mut prod = connect(
        &config(&[nacos.url()], |c| {
            c.namespace = "prod".into();
            c.group = "LLM".into();
        }),
        &cat,
    )
    .await;
    let snap = discover(&mut prod).await;
    assert_eq!(snap.instances.len(), 2);
    assert!(snap.instances.iter().all(|i| i.group == "LLM"));

    // rnacos ignores the `clusters` query parameter; ailb applies the filter to the answer too.
    let mut only_a = connect(
        &config(&[nacos.url()], |c| {
            c.namespace = "prod".into();
            c.group = "LLM".into();
            c.clusters = vec!["a".into()];
        }),
        &cat,
    )
    .await;
    let snap = discover(&mut only_a).await;
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.instances[0].cluster, "a");
}

#[tokio::test]
async fn unreachable_servers_fail_static_and_fail_over() {
    let nacos = RnacosServer::start();
    nacos.register(&NacosInstance::new("llm", "10.7.0.1", 8000));
    let dead = format!("http://127.0.0.1:{}", ailb_tests::nacos::free_port());
    let cat = catalog("llm", &["llm"]);

    // Only a dead server: connect succeeds (the daemon starts fail-static), reads fail.
    let mut src = connect(&config(std::slice::from_ref(&dead), |c| c.timeout = "500ms".into()), &cat).await;
    let e = src.discover().await.expect_err("reading from a dead server");
    assert!(matches!(e, NacosError::Transport { .. }), "{e}");
    assert!(e.to_string().contains(&dead), "the error names the server: {e}");

    // Dead first, rnacos second: the read fails over and stays on rnacos.
    let mut src = connect(&config(&[dead, nacos.url()], |c| c.timeout = "500ms".into()), &cat).await;
    assert_eq!(discover(&mut src).await.instances.len(), 1);
    let t = Instant::now();
    discover(&mut src).await;
    assert!(t.elapsed() < Duration::from_millis(400), "the second read went to the dead server first");
}

#[tokio::test]
async fn rnacos_accepts_the_push_registration_but_sends_no_push() {
    // ailb sends udpPort/clientIP with every v1 read; rnacos 0.8.8 accepts them and answers,
    // but its UDP push listener is never started, so `changed()` stays pending and the poll
    // alone carries changes. (The push protocol itself is tested against the fake server.)
    let nacos = RnacosServer::start();
    let mut inst = NacosInstance::new("llm", "10.8.0.1", 8000);
    nacos.register(&inst);
    let mut src = connect(&config(&[nacos.url()], |_| {}), &catalog("llm", &["llm"])).await;
    assert!(src.push_port().is_some());
    discover(&mut src).await;
    inst.weight = 2.0;
    nacos.update(&inst);
    let pushed = tokio::time::timeout(Duration::from_millis(500), src.changed()).await.is_ok();
    assert!(!pushed, "rnacos sent a UDP push: update this test and the module docs");
    assert_eq!(src.pushes_received(), 0);
    assert_eq!(find(&discover(&mut src).await, "10.8.0.1:8000").weight, 2.0);
}
