//! Draining end to end: two `ailb agent`s register their model servers in rnacos,
//! a gateway `ailb run` (Nacos source) balances connections over both; SIGTERM to one agent
//! disables its instance, and once the gateway has seen that, no new connection reaches it,
//! while the other keeps serving. The drained agent then deregisters and exits 0.

use std::time::Duration;

use ailb_tests::agent_harness::{instance, listed, Agent, FakeVllm, SERVICE};
use ailb_tests::client::count_by_backend;
use ailb_tests::nacos::RnacosServer;
use ailb_tests::status::backend;
use ailb_tests::{
    base_config, client_bin, preflight, wait_until, BackendServer, CgroupGuard, ConnectOpts, Daemon, TestClient,
};

const VIP: &str = "127.77.7.1:8000";

#[test]
fn a_draining_agent_gets_no_new_connection_from_the_gateway() {
    let bin = preflight();
    let nacos = RnacosServer::start();
    let (vllm_a, vllm_b) = (FakeVllm::start(), FakeVllm::start());
    let mut a = Agent::start(&nacos, &vllm_a, "1s");
    let b = Agent::start(&nacos, &vllm_b, "1s");
    let addr = |agent: &Agent| format!("127.0.0.1:{}", agent.instance_port);
    // The "model servers" the connections reach: real listeners on the registered ports.
    let _servers = BackendServer::start_all(&[&addr(&a), &addr(&b)]);
    wait_until("both instances in rnacos", Duration::from_secs(5), || {
        (listed(&nacos, a.instance_port).is_some() && listed(&nacos, b.instance_port).is_some()).then_some(())
    });

    let cg = CgroupGuard::new("agent-gw");
    let mut cfg = base_config("agent-gw", &cg);
    cfg.extra = format!(
        "[[models]]\nname = \"{SERVICE}\"\nvips = [\"{VIP}\"]\n\n[discovery]\nsource = \"nacos\"\n\
         [discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"100ms\"\n",
        nacos.url()
    );
    let daemon = Daemon::start(&bin, &cfg);
    let live = |d: &Daemon, address: &str| backend(&d.status(), address).is_some_and(|v| v["live"] == true);
    wait_until("both agents' instances live in the gateway", Duration::from_secs(5), || {
        (live(&daemon, &addr(&a)) && live(&daemon, &addr(&b))).then_some(())
    });
    let client = TestClient::new(client_bin!());
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 200));
    let counts = count_by_backend(&res);
    assert!(counts.get(&addr(&a)).copied().unwrap_or(0) > 20, "A serves before the drain: {counts:?}");

    // Requests in flight on A keep it draining (not deregistered) for a while.
    vllm_a.set(|s| {
        s.running = 2.0;
        s.waiting = 0.0;
    });
    a.sigterm();
    wait_until("the gateway to drop the draining instance", Duration::from_secs(5), || {
        (!live(&daemon, &addr(&a))).then_some(())
    });
    assert!(instance(&nacos, a.instance_port).is_some(), "A is still registered (draining)");
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 200));
    assert!(res.iter().all(|r| r.ok), "B serves everything");
    let counts = count_by_backend(&res);
    assert_eq!(counts.get(&addr(&a)), None, "no new connection to the draining instance: {counts:?}");
    assert_eq!(counts.get(&addr(&b)).copied(), Some(200), "{counts:?}");

    // In flight reaches 0 (running and waiting): A deregisters and exits cleanly; B is untouched.
    vllm_a.set(|s| s.running = 0.0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.alive() {
        assert!(std::time::Instant::now() < deadline, "the drained agent did not exit; log:\n{}", a.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = a.wait_exit(Duration::from_secs(1));
    assert!(status.success(), "agent exit {status}; log:\n{}", a.log());
    assert!(instance(&nacos, a.instance_port).is_none(), "A deregistered");
    assert!(listed(&nacos, b.instance_port).is_some(), "B still registered");
}
