//! The autoscaling signal against a running daemon: `/metrics` serves per model the kernel's
//! in-flight count (`ailb_model_inflight`), the live backends' capacity (`ailb_model_capacity`,
//! their `max_inflight`), the ratio (`ailb_model_saturation`), the queues the backends report
//! (`ailb_model_queued_requests`, here from a fake vLLM sampled by `ailb run` itself) and the memory
//! free for new requests (`ailb_model_memory_headroom_mb`: free minus the hints in flight).

use std::time::Duration;

use ailb_tests::agent_harness::FakeVllm;
use ailb_tests::nacos::{free_port, http_request};
use ailb_tests::status::inflight_mem_by_address;
use ailb_tests::{
    base_config, client_bin, preflight, wait_until, BackendCfg, BackendServer, CgroupGuard, ConnectOpts, Daemon,
    TestClient,
};

const MODEL: &str = "sat-7b";
const VIP: &str = "127.77.34.1:8000";
/// (address, free memory MB): declared; the third backend is sampled (memory unknown).
const DECLARED: [(&str, u32); 2] = [("127.0.34.11:18341", 8000), ("127.0.34.12:18342", 16000)];
const SAMPLED: &str = "127.0.34.13:18343";

/// The value of `name{model="sat-7b"}` on the daemon's `/metrics`, if served.
fn gauge(port: u16, name: &str) -> Option<f64> {
    let (status, body) = http_request(port, "GET", "/metrics", &[]).ok()?;
    assert_eq!(status, 200);
    let prefix = format!("{name}{{model=\"{MODEL}\"}} ");
    String::from_utf8_lossy(&body).lines().find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
}

fn wait_gauge(port: u16, name: &str, want: f64) {
    let mut last = None;
    wait_until(&format!("{name} = {want}"), Duration::from_secs(5), || {
        last = gauge(port, name);
        (last.is_some_and(|v| (v - want).abs() < 1e-9)).then_some(())
    });
}

#[test]
fn per_model_saturation_gauges_follow_connections_queues_and_memory() {
    let bin = preflight();
    let cg = CgroupGuard::new("saturation");
    let _servers = BackendServer::start_all(&[DECLARED[0].0, DECLARED[1].0, SAMPLED]);
    let vllm = FakeVllm::start(); // 2 running, 1 waiting
    let port = free_port();
    let mut cfg = base_config("saturation", &cg).service(MODEL, VIP);
    cfg.listen = Some(format!("127.0.0.1:{port}"));
    cfg.daemon_extra = "sample_interval = \"100ms\"\n".into();
    for (addr, mem) in DECLARED {
        let mut b = BackendCfg::new(MODEL, addr, 1).free_memory_mb(mem);
        b.max_inflight = Some(4);
        cfg = cfg.backend(b);
    }
    let mut sampled = BackendCfg::new(MODEL, SAMPLED, 1);
    sampled.max_inflight = Some(4);
    sampled.extra = format!("metrics_url = \"http://127.0.0.1:{}/metrics\"\n", vllm.port);
    cfg = cfg.backend(sampled);
    let daemon = Daemon::start(&bin, &cfg);

    // Idle: three live backends of 4 slots each.
    wait_gauge(port, "ailb_model_capacity", 12.0);
    wait_gauge(port, "ailb_model_inflight", 0.0);
    wait_gauge(port, "ailb_model_saturation", 0.0);
    wait_gauge(port, "ailb_model_queued_requests", 1.0);
    wait_gauge(port, "ailb_model_memory_headroom_mb", 24000.0);

    // Six held connections hinting 1000 MB each: 6 of 12 slots, and the hints on the two
    // backends with known memory leave the headroom.
    let client = TestClient::new(client_bin!());
    let held = client.hold(Some(&cg), &ConnectOpts::new(VIP, 6).memory_mb(1000));
    assert!(held.results().iter().all(|r| r.ok), "{:?}", held.results());
    wait_gauge(port, "ailb_model_inflight", 6.0);
    wait_gauge(port, "ailb_model_saturation", 0.5);
    let mem = inflight_mem_by_address(&daemon.status());
    let hinted: u64 = DECLARED.iter().map(|(a, _)| mem.get(*a).copied().unwrap_or(0)).sum();
    assert!(hinted > 0, "precondition: a held connection on a backend with known memory: {mem:?}");
    wait_gauge(port, "ailb_model_memory_headroom_mb", 24000.0 - hinted as f64);

    // The sampled server's queue grows past the agent's 1-request threshold: reported.
    vllm.set(|s| s.waiting = 5.0);
    wait_gauge(port, "ailb_model_queued_requests", 5.0);

    held.release();
    wait_gauge(port, "ailb_model_inflight", 0.0);
    wait_gauge(port, "ailb_model_saturation", 0.0);
    wait_gauge(port, "ailb_model_memory_headroom_mb", 24000.0);
}
