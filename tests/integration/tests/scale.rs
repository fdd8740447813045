//! Kernel tables sized to the model: 1,024 models of 16 backends, and one model of 16,384
//! backends, load, route and tear down with nothing left pinned.
//!
//! The 1,024 models share 16 real listeners (a backend is a model and an address, so one
//! address serves every model). The 16,384 backends are 16,384 loopback addresses on one port;
//! only those that a checked pick lands on get a listener: `ailb explain` (the kernel's pick
//! run over a copy of the pinned maps) names the backend of a conversation, a listener starts
//! there, and a real connect of that conversation must reach it.

use std::collections::BTreeSet;

use ailb_tests::client::{assert_all_ok, backends_by_conversation, count_by_backend};
use ailb_tests::nacos::free_port;
use ailb_tests::status::{ailb_explain, stat};
use ailb_tests::{
    base_config, client_bin, preflight, BackendCfg, BackendServer, CgroupGuard, ConnectOpts, Daemon, TestClient,
};

const MODELS: usize = 1024;
const PER_MODEL: usize = 16;
const WIDE: usize = 16384;

/// VIP of model `i`: 127.78.(i / 256).(i % 256):8000.
fn vip(i: usize) -> String {
    format!("127.78.{}.{}:8000", i / 256, i % 256)
}

/// The 16 shared listeners' addresses.
fn shared(j: usize) -> String {
    format!("127.0.9.{}:18900", j + 1)
}

/// Backend `k` of the wide model: 127.90.(k / 250).(k % 250 + 1), all on one port.
fn wide(k: usize) -> String {
    format!("127.90.{}.{}:18950", k / 250, k % 250 + 1)
}

fn model(i: usize) -> String {
    format!("scale-{i:04}")
}

#[test]
fn a_thousand_models_of_sixteen_backends_load_route_and_tear_down() {
    let bin = preflight();
    let cg = CgroupGuard::new("scale-models");
    let addrs: Vec<String> = (0..PER_MODEL).map(shared).collect();
    let servers = BackendServer::start_all(&addrs.iter().map(String::as_str).collect::<Vec<_>>());
    let mut cfg = base_config("scale-models", &cg);
    for i in 0..MODELS {
        cfg = cfg.service(&model(i), &vip(i));
        for a in &addrs {
            cfg = cfg.backend(BackendCfg::new(&model(i), a, 1));
        }
    }
    let mut daemon = Daemon::start(&bin, &cfg);
    let status = daemon.status();
    let models = status["models"].as_array().unwrap_or_else(|| panic!("no models: {status}"));
    assert_eq!(models.len(), MODELS, "every model is in the kernel");
    for m in models {
        assert_eq!(m["available"], true, "{}", m["name"]);
        assert_eq!(m["table_size"], 2039, "{}", m["name"]);
        assert_eq!(m["backends"].as_array().map(Vec::len), Some(PER_MODEL), "{}", m["name"]);
    }
    let mem = &status["kernel_memory"];
    eprintln!(
        "kernel memory: total {} B, per model {} B, per backend {} B, per affinity entry {} B, tables {}",
        mem["total_bytes"],
        mem["per_model_bytes"],
        mem["per_backend_bytes"],
        mem["per_affinity_entry_bytes"],
        mem["table_arena"]
    );
    // 1,024 tables of 2,039 slots take 2 chunks of 1,024 slots each, and nothing else does.
    assert_eq!(mem["table_arena"]["used"].as_u64(), Some((MODELS * 2048) as u64), "{mem}");
    assert_eq!(mem["member_arena"]["used"].as_u64(), Some((MODELS * PER_MODEL) as u64), "{mem}");

    // Route: 32 connections to each of 64 models spread over the catalog (the first and the
    // last included) all reach one of the listeners.
    let client = TestClient::new(client_bin!());
    let picked: Vec<usize> = (0..MODELS).step_by(MODELS / 63).chain([MODELS - 1]).collect();
    let mut total = 0;
    for &i in &picked {
        let res = client.connect(Some(&cg), &ConnectOpts::new(&vip(i), 32));
        assert_all_ok(&res, &format!("connections to {} at {}", model(i), vip(i)));
        for addr in count_by_backend(&res).keys() {
            assert!(addrs.contains(addr), "{} reached {addr}, not one of its backends", model(i));
        }
        total += res.len();
    }
    let status = daemon.status();
    assert_eq!(stat(&status, "picks"), total as u64, "every connect was a pick: {}", status["stats"]);
    let accepted: u64 = servers.iter().map(BackendServer::accepted).sum();
    assert_eq!(accepted, total as u64, "the listeners saw every connection");
    daemon.teardown();
}

#[test]
fn one_model_of_sixteen_thousand_backends_loads_routes_and_tears_down() {
    let bin = preflight();
    let cg = CgroupGuard::new("scale-wide");
    let listen = format!("127.0.0.1:{}", free_port());
    let name = "scale-wide";
    let mut cfg = base_config("scale-wide", &cg).service(name, &vip(0));
    cfg.listen = Some(listen.clone());
    let addrs: Vec<String> = (0..WIDE).map(wide).collect();
    assert_eq!(addrs.iter().collect::<BTreeSet<_>>().len(), WIDE, "distinct addresses");
    for a in &addrs {
        cfg = cfg.backend(BackendCfg::new(name, a, 1));
    }
    let mut daemon = Daemon::start(&bin, &cfg);
    let status = daemon.status();
    let m = &status["models"][0];
    assert_eq!(m["name"], name);
    assert_eq!(m["available"], true);
    assert_eq!(m["table_size"].as_u64(), Some(u64::from(ailb_common::MAX_TABLE_SIZE)), "{}", m["table_size"]);
    let backends = m["backends"].as_array().unwrap_or_else(|| panic!("no backends: {m}"));
    assert_eq!(backends.len(), WIDE);
    let slots: Vec<u64> = backends.iter().map(|b| b["table_slots"].as_u64().unwrap_or(0)).collect();
    let (lo, hi) = (slots.iter().min().copied(), slots.iter().max().copied());
    eprintln!("table slots per backend: {lo:?}..{hi:?}; kernel memory {}", status["kernel_memory"]["total_bytes"]);
    // 1,048,583 slots / 16,384 = 64.0 each; the fill keeps every share within its slack.
    assert!(lo >= Some(59) && hi <= Some(69), "shares {lo:?}..{hi:?}");

    // Route: explain names each conversation's backend; a listener there receives it.
    let bpffs = daemon.bpffs().to_str().expect("utf-8").to_string();
    let mut servers = Vec::new();
    let mut want = Vec::new();
    for c in 0..4 {
        // The test client names its conversations PREFIX-N; one conversation per prefix.
        let prefix = format!("wide{c}");
        let conv = format!("{prefix}-0");
        let v = ailb_explain(&bin, name, &listen, &bpffs, &["--conversation", &conv]);
        let backend = v["conversation"]["backend"].as_str().unwrap_or_else(|| panic!("explain: {v}")).to_string();
        assert!(addrs.contains(&backend), "explain named {backend}, not a backend");
        if !servers.iter().any(|s: &BackendServer| s.address() == backend) {
            servers.push(BackendServer::start(&backend));
        }
        want.push((prefix, conv, backend));
    }
    let client = TestClient::new(client_bin!());
    for (prefix, conv, backend) in &want {
        let res = client.connect(Some(&cg), &ConnectOpts::new(&vip(0), 1).conversations(1, prefix));
        assert_all_ok(&res, &format!("conversation {conv}"));
        let reached = backends_by_conversation(&res);
        let got: Vec<&String> = reached.values().flatten().collect();
        assert_eq!(got, vec![backend], "conversation {conv}: explain said {backend}, the kernel sent it to {got:?}");
    }
    let status = daemon.status();
    assert_eq!(stat(&status, "picks"), want.len() as u64, "{}", status["stats"]);
    daemon.teardown();
}
