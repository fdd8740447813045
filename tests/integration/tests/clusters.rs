//! Several clusters: rnacos 0.8.8 holds one service with instances in two Nacos clusters, and a
//! gateway with `daemon.cluster = "a"` sends the model's connections to cluster a only, spills to
//! cluster b while a is saturated (current_requests at its max_inflight), comes home when a has
//! room again, and spills for good once a's instances are deregistered or excluded.

use std::time::Duration;

use ailb_tests::client::count_by_backend;
use ailb_tests::nacos::{NacosInstance, RnacosServer};
use ailb_tests::status::backend;
use ailb_tests::{
    base_config, client_bin, preflight, wait_until, BackendServer, CgroupGuard, ConnectOpts, Daemon, TestClient,
};

const MODEL: &str = "llm-clusters";
const VIP: &str = "127.77.33.1:8000";
const A: [&str; 2] = ["127.0.33.11:18331", "127.0.33.12:18332"];
const B: &str = "127.0.33.21:18333";

/// A persistent instance of `cluster` with a cap of 4 and `running` requests.
fn instance(addr: &str, cluster: &str, running: u32) -> NacosInstance {
    let (ip, port) = addr.split_once(':').expect("ip:port");
    let mut i = NacosInstance::new(MODEL, ip, port.parse().expect("port"))
        .meta("model_id", MODEL)
        .meta("max_inflight", "4")
        .meta("current_requests", &running.to_string())
        .meta("queue_length", "0")
        .meta("health_status", "healthy");
    i.cluster = cluster.to_string();
    i.ephemeral = false;
    i
}

/// The addresses live in the kernel's tables.
fn live(d: &Daemon) -> Vec<String> {
    let st = d.status();
    A.iter()
        .copied()
        .chain([B])
        .filter(|a| backend(&st, a).is_some_and(|b| b["live"].as_bool() == Some(true)))
        .map(str::to_owned)
        .collect()
}

fn wait_live(d: &Daemon, want: &[&str], what: &str) {
    wait_until(what, Duration::from_secs(5), || (live(d) == want).then_some(()));
}

#[test]
fn a_gateway_prefers_its_cluster_and_spills_only_when_it_cannot_serve() {
    let bin = preflight();
    let nacos = RnacosServer::start();
    let cg = CgroupGuard::new("clusters");
    let _servers = BackendServer::start_all(&[A[0], A[1], B]);
    for a in A {
        nacos.register(&instance(a, "a", 0));
    }
    nacos.register(&instance(B, "b", 0));
    let mut cfg = base_config("clusters", &cg);
    cfg.daemon_extra = "cluster = \"a\"\n".into();
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = [\"{VIP}\"]\n\n\
         [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"100ms\"\n",
        nacos.url()
    );
    let daemon = Daemon::start(&bin, &cfg);
    let client = TestClient::new(client_bin!());

    // 1. Cluster a serves: cluster b's backend is not in the table, no connection reaches it.
    wait_live(&daemon, &A, "cluster a live, cluster b out");
    let counts = count_by_backend(&client.connect(Some(&cg), &ConnectOpts::new(VIP, 100)));
    assert_eq!(counts.get(B), None, "no connection leaves cluster a while it serves: {counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 100, "{counts:?}");

    // 2. Cluster a saturated (8 running of 8 slots): b takes connections too; then back home.
    for a in A {
        nacos.register(&instance(a, "a", 4));
    }
    wait_live(&daemon, &[A[0], A[1], B], "spill to cluster b while a is saturated");
    let counts = count_by_backend(&client.connect(Some(&cg), &ConnectOpts::new(VIP, 100)));
    assert!(counts.get(B).copied().unwrap_or(0) > 0, "cluster b gets part of the spill: {counts:?}");
    for a in A {
        nacos.register(&instance(a, "a", 1));
    }
    wait_live(&daemon, &A, "home again once cluster a has room");

    // 3. Cluster a gone: one instance deregistered, the other disabled (excluded).
    nacos.deregister(&instance(A[0], "a", 1));
    let mut off = instance(A[1], "a", 1);
    off.enabled = false;
    nacos.register(&off);
    wait_live(&daemon, &[B], "everything to cluster b once a cannot serve");
    let counts = count_by_backend(&client.connect(Some(&cg), &ConnectOpts::new(VIP, 50)));
    assert_eq!(counts.get(B).copied(), Some(50), "{counts:?}");
    assert!(daemon.log().contains("spilling to the other clusters"), "the spill is logged");
}
