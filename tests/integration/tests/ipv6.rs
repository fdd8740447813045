//! IPv6 for local clients (`cgroup/connect6`): the distribution and affinity tests on IPv6
//! backends behind an IPv6 VIP, a model with a backend of each family reached from both
//! families (and through a v4-mapped VIP), and teardown leaving no connect6 program.
//!
//! Every address is loopback: the VIPs and backends are `[::1]` with their own ports (a
//! connect ailb does not rewrite goes to `::1`, where nothing listens on a VIP port) and
//! 127.0.0.0/8.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use ailb_tests::client::{assert_all_ok, backends_by_conversation, count_by_backend, one_backend_per_conversation};
use ailb_tests::nacos::free_port;
use ailb_tests::status::{ailb_explain, backend, stat};
use ailb_tests::{
    base_config, client_bin, percent, preflight, run_cmd, share_tolerance_pp, BackendCfg, BackendServer, CgroupGuard,
    ConnResult, ConnectOpts, Daemon, TestClient,
};

const CONNECTIONS: usize = 8000;

/// Each backend's share of `results` against its weight's share, within the sampling noise of
/// that many picks plus the weighted table's slack of 8 of its 1,021 slots (0.8 pp:
/// [`share_tolerance_pp`]), and every connection on one of `backends`.
fn assert_shares(results: &[ConnResult], backends: &[(&str, u32)], what: &str) -> BTreeMap<String, usize> {
    let counts = count_by_backend(results);
    let names: Vec<&str> = backends.iter().map(|b| b.0).collect();
    for addr in counts.keys() {
        assert!(names.contains(&addr.as_str()), "{what}: a connection reached {addr}, not one of {names:?}");
    }
    let total: u32 = backends.iter().map(|b| b.1).sum();
    for &(addr, w) in backends {
        let n = counts.get(addr).copied().unwrap_or(0);
        let share = percent(n, results.len());
        let expected = f64::from(w) * 100.0 / f64::from(total);
        let tol = share_tolerance_pp(expected / 100.0, results.len(), 0.8);
        assert!(
            (share - expected).abs() <= tol,
            "{what}: {addr} (weight {w}/{total}) got {n} of {} = {share:.2} %, expected {expected:.2} % +- \
             {tol:.1} pp; all {counts:?}",
            results.len()
        );
    }
    counts
}

#[test]
fn ipv6_connections_follow_the_weights() {
    const MODEL: &str = "dist6-7b";
    const VIP: &str = "[::1]:18600";
    const BACKENDS: [(&str, u32); 3] = [("[::1]:18601", 1), ("[::1]:18602", 2), ("[::1]:18603", 5)];
    let bin = preflight();
    let cg = CgroupGuard::new("ipv6-distribution");
    let servers = BackendServer::start_all(&BACKENDS.map(|b| b.0));
    let mut cfg = base_config("ipv6-distribution", &cg).service(MODEL, VIP);
    for (addr, w) in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, w));
    }
    let daemon = Daemon::start(&bin, &cfg);

    // Sequential and unhinted, each closed before the next: the shares are the table's.
    let results = TestClient::new(client_bin!()).connect(Some(&cg), &ConnectOpts::new(VIP, CONNECTIONS));
    assert_all_ok(&results, "unhinted IPv6 connections to the IPv6 VIP");
    let counts = assert_shares(&results, &BACKENDS, "IPv6 VIP, IPv6 backends 1:2:5");
    let status = daemon.status();
    eprintln!("connections per backend: {counts:?}; stats: {}", status["stats"]);
    for (server, (addr, _)) in servers.iter().zip(BACKENDS) {
        assert_eq!(server.accepted(), counts.get(addr).copied().unwrap_or(0) as u64, "{addr}: accepted vs. client");
        // `ailb status` prints the IPv6 address as configured.
        assert!(backend(&status, addr).is_some(), "ailb status lists no backend {addr}: {status}");
    }
    assert_eq!(stat(&status, "picks"), CONNECTIONS as u64, "stats.picks: {}", status["stats"]);
    assert_eq!(status["models"][0]["vips"][0].as_str(), Some(VIP), "the IPv6 VIP in ailb status: {status}");
    daemon.wait_inflight_zero(Duration::from_secs(10));
}

#[test]
fn ipv6_conversations_stick_to_one_backend() {
    const MODEL: &str = "aff6-7b";
    const VIP: &str = "[::1]:18610";
    const BACKENDS: [(&str, u32); 4] = [("[::1]:18611", 2), ("[::1]:18612", 2), ("[::1]:18613", 3), ("[::1]:18614", 3)];
    const CONVERSATIONS: usize = 200;
    const PER_CONVERSATION: usize = 20;
    let bin = preflight();
    let cg = CgroupGuard::new("ipv6-affinity");
    let _servers = BackendServer::start_all(&BACKENDS.map(|b| b.0));
    let mut cfg = base_config("ipv6-affinity", &cg).service(MODEL, VIP);
    for (addr, w) in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, w));
    }
    let daemon = Daemon::start(&bin, &cfg);

    // Connection i is tagged with conversation i % 200: a conversation's connections are
    // interleaved with all the others'.
    let opts = ConnectOpts::new(VIP, CONVERSATIONS * PER_CONVERSATION).conversations(CONVERSATIONS, "aff6");
    let results = TestClient::new(client_bin!()).connect(Some(&cg), &opts);
    assert_all_ok(&results, "tagged IPv6 connections");
    let by_conv = backends_by_conversation(&results);
    assert_eq!(by_conv.len(), CONVERSATIONS, "conversations seen");
    let mut spread: BTreeMap<String, usize> = BTreeMap::new();
    for (conv, set) in &by_conv {
        assert_eq!(set.len(), 1, "the connections of conversation {conv} reached several backends: {set:?}");
        *spread.entry(set.iter().next().expect("one").clone()).or_default() += 1;
    }
    eprintln!("conversations per backend: {spread:?}");
    assert!(spread.len() > 1, "all 200 conversations on one backend: {spread:?}");
    let status = daemon.status();
    // Each conversation's first connect made its entry; the other 19 were hits.
    let hits = stat(&status, "affinity_hits");
    assert_eq!(hits, (CONVERSATIONS * (PER_CONVERSATION - 1)) as u64, "stats: {}", status["stats"]);
    daemon.wait_inflight_zero(Duration::from_secs(10));
}

/// A model with an IPv4 and an IPv6 backend (equal weights) and a VIP of each family.
#[test]
fn a_mixed_model_is_reached_from_both_families() {
    const MODEL: &str = "mixed-7b";
    const VIP4: &str = "127.77.6.1:8000";
    const VIP6: &str = "[::1]:18620";
    /// The IPv4 VIP as a dual-stack socket writes it.
    const VIP4_MAPPED: &str = "[::ffff:127.77.6.1]:8000";
    const V4: &str = "127.0.6.11:18621";
    const V6: &str = "[::1]:18622";
    const BOTH: [(&str, u32); 2] = [(V4, 1), (V6, 1)];
    const N: usize = 2000;
    let bin = preflight();
    let cg = CgroupGuard::new("ipv6-mixed");
    let _servers = BackendServer::start_all(&[V4, V6]);
    let cfg = base_config("ipv6-mixed", &cg)
        .service(MODEL, VIP4)
        .service(MODEL, VIP6)
        .backend(BackendCfg::new(MODEL, V4, 1))
        .backend(BackendCfg::new(MODEL, V6, 1));
    let daemon = Daemon::start(&bin, &cfg);
    let client = TestClient::new(client_bin!());

    // An IPv4 socket reaches only the IPv4 backend.
    let from4 = client.connect(Some(&cg), &ConnectOpts::new(VIP4, N));
    assert_all_ok(&from4, "IPv4 client, IPv4 VIP");
    assert_eq!(count_by_backend(&from4), BTreeMap::from([(V4.to_string(), N)]), "IPv4 client");

    // An IPv6 socket reaches both, by weight (the IPv4 one through its v4-mapped address,
    // which the client prints as the IPv4 address), through either VIP.
    for vip in [VIP6, VIP4_MAPPED] {
        let from6 = client.connect(Some(&cg), &ConnectOpts::new(vip, N));
        assert_all_ok(&from6, &format!("IPv6 client, VIP {vip}"));
        let counts = assert_shares(&from6, &BOTH, &format!("IPv6 client, VIP {vip}"));
        eprintln!("IPv6 client through {vip}: {counts:?}");
    }

    // An IPV6_V6ONLY socket cannot reach the IPv4 backend: those connects fail
    // (ENETUNREACH), the others reach the IPv6 backend, and nothing stays counted in flight.
    let only6 = client.connect(Some(&cg), &ConnectOpts::new(VIP6, 200).v6only());
    let failed: Vec<&ConnResult> = only6.iter().filter(|r| !r.ok).collect();
    assert!(failed.iter().all(|r| r.errno == Some(libc::ENETUNREACH)), "V6ONLY failures: {failed:?}");
    assert!(only6.iter().filter(|r| r.ok).all(|r| r.backend.as_deref() == Some(V6)), "V6ONLY: {only6:?}");
    assert!(!failed.is_empty() && failed.len() < only6.len(), "V6ONLY: {} of 200 failed", failed.len());

    let status = daemon.status();
    let vips: Vec<&str> =
        status["models"][0]["vips"].as_array().expect("vips").iter().filter_map(|v| v.as_str()).collect();
    assert!(vips.contains(&VIP4) && vips.contains(&VIP6), "ailb status VIPs: {vips:?}");
    assert!(backend(&status, V4).is_some() && backend(&status, V6).is_some(), "ailb status: {status}");
    daemon.wait_inflight_zero(Duration::from_secs(10));
}

/// A mixed model's conversations from IPv6 clients: `ailb explain` names the backend they
/// really reach (and, for an IPv4 client, never the IPv6 one); they keep their backends with
/// the daemon killed and after its restart; `bpftool` prints the IPv6 maps with field names.
#[test]
fn ipv6_conversations_survive_kill_and_restart_and_explain_agrees() {
    const MODEL: &str = "fs6-7b";
    const VIP6: &str = "[::1]:18640";
    const V4: &str = "127.0.6.41:18641";
    const V6: &str = "[::1]:18642";
    let bin = preflight();
    let cg = CgroupGuard::new("ipv6-restart");
    let _servers = BackendServer::start_all(&[V4, V6]);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cfg = base_config("ipv6-restart", &cg)
        .service(MODEL, VIP6)
        .backend(BackendCfg::new(MODEL, V4, 1))
        .backend(BackendCfg::new(MODEL, V6, 1));
    cfg.listen = Some(listen.clone());
    let mut daemon = Daemon::start(&bin, &cfg);
    let bpffs = daemon.bpffs().to_str().expect("UTF-8").to_string();
    let client = TestClient::new(client_bin!());
    let convs = |per: usize| ConnectOpts::new(VIP6, 40 * per).conversations(40, "fs6");

    let placed = one_backend_per_conversation(&client.connect(Some(&cg), &convs(2)), "placed");
    let on: BTreeMap<&str, usize> = placed.values().fold(BTreeMap::new(), |mut m, b| {
        *m.entry(b.as_str()).or_default() += 1;
        m
    });
    assert_eq!(on.len(), 2, "40 conversations should use both backends: {on:?}");
    for (conv, b) in placed.iter().take(8) {
        let c = &ailb_explain(&bin, MODEL, &listen, &bpffs, &["--conversation", conv])["conversation"];
        assert_eq!(c["backend_ipv6_client"].as_str(), Some(b.as_str()), "explain vs reality for {conv}: {c}");
        assert_eq!(c["affinity_backend"].as_str(), Some(b.as_str()), "{c}");
        // An IPv4 client of the same conversation can only get the IPv4 backend.
        assert_eq!(c["backend"].as_str(), Some(V4), "{c}");
        // Its entry holds for it only when it names the IPv4 backend.
        assert_eq!(c["outcome"] == "AffinityHit", b == V4, "{conv} on {b}: {c}");
    }

    daemon.kill9();
    let during = one_backend_per_conversation(&client.connect(Some(&cg), &convs(1)), "with the daemon killed");
    assert_eq!(during, placed, "with the daemon killed, conversations must keep their backends");
    daemon.restart();
    let after = one_backend_per_conversation(&client.connect(Some(&cg), &convs(1)), "after the restart");
    assert_eq!(after, placed, "after the restart, conversations must keep their backends");
    let status = daemon.status();
    assert!(backend(&status, V6).is_some_and(|b| b["live"] == true), "after the restart: {status}");

    for (map, fields) in
        [("AILB_SERVICES6", ["\"addr\"", "\"port\""]), ("AILB_BACKEND_ADDRS6", ["\"addr\"", "\"value\""])]
    {
        let pin = format!("{bpffs}/{map}");
        let out = run_cmd(Command::new("bpftool").args(["map", "dump", "pinned", &pin]), Duration::from_secs(30));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && fields.iter().all(|f| text.contains(f)), "bpftool map dump {pin}: {text}");
    }
    daemon.wait_inflight_zero(Duration::from_secs(10));
}

/// `bpftool cgroup show` lines of the ailb programs attached to `cg`.
fn ailb_programs(cg: &CgroupGuard) -> Vec<String> {
    let path = cg.path().to_str().expect("UTF-8 cgroup path");
    let out = run_cmd(Command::new("bpftool").args(["cgroup", "show", path]), Duration::from_secs(30));
    assert!(out.status.success(), "bpftool cgroup show {path}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("ailb")).map(str::to_owned).collect()
}

#[test]
fn teardown_detaches_connect6_and_removes_its_pins() {
    const MODEL: &str = "td6-7b";
    const VIP: &str = "[::1]:18630";
    const B: &str = "[::1]:18631";
    let bin = preflight();
    let cg = CgroupGuard::new("ipv6-teardown");
    let _server = BackendServer::start(B);
    let cfg = base_config("ipv6-teardown", &cg).service(MODEL, VIP).backend(BackendCfg::new(MODEL, B, 1));
    let mut daemon = Daemon::start(&bin, &cfg);
    let client = TestClient::new(client_bin!());
    let before = client.connect(Some(&cg), &ConnectOpts::new(VIP, 10));
    assert_all_ok(&before, "before teardown");
    let attached = ailb_programs(&cg);
    assert!(attached.iter().any(|l| l.contains("ailb_connect6")), "connect6 not attached: {attached:?}");
    let bpffs = daemon.bpffs().to_path_buf();
    for pin in ["links/ailb_connect6", "AILB_SERVICES6", "AILB_BACKEND_ADDRS6"] {
        assert!(bpffs.join(pin).exists(), "{pin} is not pinned");
    }

    daemon.teardown();
    assert!(!bpffs.exists(), "{} still exists after teardown", bpffs.display());
    let left = ailb_programs(&cg);
    assert!(left.is_empty(), "after teardown the cgroup still has: {left:?}");
    // Connects are no longer rewritten: nothing listens on the VIP's own port of ::1.
    for r in client.connect(Some(&cg), &ConnectOpts::new(VIP, 3)) {
        assert_eq!(r.errno, Some(libc::ECONNREFUSED), "after teardown, a connect to the bare VIP: {r:?}");
    }
}
