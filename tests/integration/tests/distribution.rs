//! Issue bullet: weights 1:2:5 over 3 backends: 8,000 unhinted connections land within 3
//! percentage points of 12.5 / 25 / 62.5 %.

use ailb_tests::client::{assert_all_ok, count_by_backend};
use ailb_tests::status::stat;
use ailb_tests::{
    base_config, client_bin, percent, preflight, BackendCfg, BackendServer, CgroupGuard, ConnectOpts, Daemon,
    TestClient,
};

const MODEL: &str = "dist-7b";
const VIP: &str = "127.77.1.1:8000";
const BACKENDS: [(&str, u32); 3] = [("127.0.1.11:18101", 1), ("127.0.1.12:18102", 2), ("127.0.1.13:18103", 5)];
const CONNECTIONS: usize = 8000;
/// The tolerance on each share. It is wide on purpose: the sampling noise of a share p over n =
/// 8000 independent picks has a standard deviation of sqrt(p(1-p)/n) <= 0.54 pp (p = 0.625),
/// and a weighted Maglev table matches the weights to within its fill's slack (at most 8 slots,
/// 0.8 pp of the 1,021 slots this model's table has), so 3 pp (> 4 sigma beyond that) is only
/// exceeded by a real bias in the data plane.
const TOLERANCE_PP: f64 = 3.0;

#[test]
fn unhinted_connections_follow_the_weights() {
    let bin = preflight();
    let cg = CgroupGuard::new("distribution");
    let servers = BackendServer::start_all(&BACKENDS.map(|b| b.0));
    let mut cfg = base_config("distribution", &cg).service(MODEL, VIP);
    for (addr, w) in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, w));
    }
    let daemon = Daemon::start(&bin, &cfg);

    // Sequential, unhinted (no conversation, so each socket gets its own random hash), each
    // connection closed before the next: the load bound never binds (at most the connection
    // itself is in flight), so the shares are the table's.
    let results = TestClient::new(client_bin!()).connect(Some(&cg), &ConnectOpts::new(VIP, CONNECTIONS));
    assert_all_ok(&results, "unhinted connections to the VIP");
    let counts = count_by_backend(&results);
    let status = daemon.status();
    eprintln!("connections per backend: {counts:?}; stats: {}", status["stats"]);

    let configured: Vec<&str> = BACKENDS.iter().map(|b| b.0).collect();
    for addr in counts.keys() {
        assert!(configured.contains(&addr.as_str()), "a connection reached {addr}, which is not a backend of {VIP}");
    }
    let total_weight: u32 = BACKENDS.iter().map(|b| b.1).sum();
    for (server, (addr, w)) in servers.iter().zip(BACKENDS) {
        let n = counts.get(addr).copied().unwrap_or(0);
        let share = percent(n, CONNECTIONS);
        let expected = f64::from(w) * 100.0 / f64::from(total_weight);
        assert!(
            (share - expected).abs() <= TOLERANCE_PP,
            "backend {addr} (weight {w}/{total_weight}) got {n} of {CONNECTIONS} connections = {share:.2} %, \
             expected {expected:.2} % +- {TOLERANCE_PP} pp; all counts {counts:?}"
        );
        // The server saw exactly the connections the client says reached it.
        assert_eq!(server.accepted(), n as u64, "backend {addr}: accepted vs. client count");
    }
    // Every connect was a pick of the data plane (fresh maps, nothing else in the cgroup).
    assert_eq!(stat(&status, "picks"), CONNECTIONS as u64, "stats.picks: {}", status["stats"]);
}

/// `balancer.round_robin` (the baseline of `ailb-compare`): sequential connections take the
/// live backends strictly in turn, whatever their weights, so over 3 x 300 connections each
/// backend gets exactly 300, and consecutive connections never land on the same backend.
#[test]
fn round_robin_takes_backends_in_turn() {
    let bin = preflight();
    let cg = CgroupGuard::new("distribution-rr");
    let rr: [(&str, u32); 3] = [("127.0.1.21:18111", 1), ("127.0.1.22:18112", 2), ("127.0.1.23:18113", 5)];
    let _servers = BackendServer::start_all(&rr.map(|b| b.0));
    let mut cfg = base_config("distribution-rr", &cg).service(MODEL, VIP);
    cfg.round_robin = true;
    cfg.affinity = false;
    cfg.load_bound = false;
    for (addr, w) in rr {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, w));
    }
    let daemon = Daemon::start(&bin, &cfg);
    let n = 900;
    let results = TestClient::new(client_bin!()).connect(Some(&cg), &ConnectOpts::new(VIP, n));
    assert_all_ok(&results, "round-robin connections");
    let counts = count_by_backend(&results);
    for (addr, _) in rr {
        assert_eq!(counts.get(addr).copied().unwrap_or(0), n / 3, "{addr}: counts {counts:?}");
    }
    let order: Vec<String> = results.iter().filter_map(|r| r.backend.clone()).collect();
    assert_eq!(order.len(), n);
    assert!(order.windows(2).all(|w| w[0] != w[1]), "two consecutive connections on one backend: {order:?}");
    assert!(daemon.status()["config"]["round_robin"].as_bool().unwrap_or(false), "status shows the mode");
}
