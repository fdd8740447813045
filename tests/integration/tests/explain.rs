//! `ailb explain`: per-backend reasons from the daemon's `/v1/plan`, and a conversation's pick
//! computed from the pinned maps, which must name the backend its connections really reach.

use ailb_tests::client::backends_by_conversation;
use ailb_tests::nacos::free_port;
use ailb_tests::status::ailb_explain;
use ailb_tests::{
    base_config, client_bin, preflight, BackendCfg, BackendServer, CgroupGuard, ConnectOpts, Daemon, TestClient,
};

const MODEL: &str = "explain-7b";
const VIP: &str = "127.77.6.1:8000";
const ADDRS: [&str; 3] = ["127.0.6.11:18601", "127.0.6.12:18602", "127.0.6.13:18603"];

fn explain(bin: &std::path::Path, listen: &str, bpffs: &str, args: &[&str]) -> serde_json::Value {
    ailb_explain(bin, MODEL, listen, bpffs, args)
}

#[test]
fn explain_names_the_reasons_and_the_backend_a_conversation_really_gets() {
    let bin = preflight();
    let cg = CgroupGuard::new("explain");
    let _servers = BackendServer::start_all(&ADDRS);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cfg = base_config("explain", &cg).service(MODEL, VIP);
    cfg.listen = Some(listen.clone());
    cfg = cfg
        .backend(BackendCfg::new(MODEL, ADDRS[0], 1).free_memory_mb(80_000))
        .backend(BackendCfg::new(MODEL, ADDRS[1], 3).free_memory_mb(24_000));
    let mut unhealthy = BackendCfg::new(MODEL, ADDRS[2], 2);
    unhealthy.healthy = Some(false);
    cfg = cfg.backend(unhealthy);
    let daemon = Daemon::start(&bin, &cfg);
    let bpffs = daemon.bpffs().to_str().expect("utf-8").to_string();

    // Reasons: the two healthy backends are eligible with their weights; the third is
    // excluded and says why.
    let v = explain(&bin, &listen, &bpffs, &[]);
    let backends = v["plan"]["backends"].as_array().unwrap_or_else(|| panic!("no plan backends: {v}"));
    let by_addr = |a: &str| backends.iter().find(|b| b["address"] == a).unwrap_or_else(|| panic!("{a} missing: {v}"));
    assert_eq!(by_addr(ADDRS[0])["eligible"], true);
    assert_eq!(by_addr(ADDRS[1])["weight"], 3, "{v}");
    assert_eq!(by_addr(ADDRS[2])["eligible"], false);
    let reason = by_addr(ADDRS[2])["reason"].as_str().unwrap_or("");
    assert!(reason.contains("healthy"), "the exclusion names the health flag: {reason}");

    // A conversation: connect a few times, then explain must name the backend they reached,
    // as an affinity hit.
    let client = TestClient::new(client_bin!());
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 6).conversations(2, "exp"));
    let reached = backends_by_conversation(&res);
    for (conv, set) in &reached {
        assert_eq!(set.len(), 1, "{conv} reached {set:?}");
        let v = explain(&bin, &listen, &bpffs, &["--conversation", conv]);
        let c = &v["conversation"];
        assert_eq!(c["backend"].as_str(), set.iter().next().map(String::as_str), "explain vs reality for {conv}: {c}");
        assert_eq!(c["outcome"], "AffinityHit", "{c}");
        assert_eq!(c["affinity_backend"], c["backend"], "{c}");
    }

    // A memory hint that only the A100 fits: explain picks it, and so does a real connection.
    let v = explain(&bin, &listen, &bpffs, &["--conversation", "fresh-one", "--memory-mb", "30000"]);
    assert_eq!(v["conversation"]["backend"].as_str(), Some(ADDRS[0]), "{v}");
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 1).conversations(1, "fresh-two").memory_mb(30_000));
    assert_eq!(res[0].backend.as_deref(), Some(ADDRS[0]), "{res:?}");
}
