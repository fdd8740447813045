//! Issue bullet: in-flight counts return to exactly 0 after all connections close — whichever
//! side closes first, with a FIN or an RST, when the client process dies, and with connects
//! that fail (a configured backend that does not listen).

use std::time::Duration;

use ailb_tests::client::count_by_backend;
use ailb_tests::status::{inflight_by_address, inflight_mem_by_address, model_inflight};
use ailb_tests::{
    base_config, client_bin, preflight, BackendCfg, BackendServer, CgroupGuard, ConnectOpts, Daemon, TestClient,
};

const MODEL: &str = "inflight-7b";
const VIP: &str = "127.77.5.1:8000";
const LIVE: [&str; 3] = ["127.0.5.11:18501", "127.0.5.12:18502", "127.0.5.13:18503"];
/// Configured, but nothing listens there: connects to it fail with ECONNREFUSED.
const DEAD: &str = "127.0.5.14:18504";
/// The deadline for the counts to settle after the last close (the requirement: within 1 s).
const SETTLE: Duration = Duration::from_secs(5);

#[test]
fn inflight_counts_return_to_zero() {
    let bin = preflight();
    let cg = CgroupGuard::new("inflight");
    let _servers = BackendServer::start_all(&LIVE);
    let mut cfg = base_config("inflight", &cg).service(MODEL, VIP);
    for addr in LIVE.iter().chain([&DEAD]) {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1));
    }
    let daemon = Daemon::start(&bin, &cfg);
    let client = TestClient::new(client_bin!());

    // 1. Held conversation connections: the counts equal what is held, then the client
    //    closes first (FIN) and they must drop to 0.
    let held = client.hold(Some(&cg), &ConnectOpts::new(VIP, 90).conversations(30, "inf"));
    let ok: Vec<_> = held.results().iter().filter(|r| r.ok).cloned().collect();
    assert!(!ok.is_empty(), "no held connection succeeded: {:?}", &held.results()[..3]);
    for r in held.results().iter().filter(|r| !r.ok) {
        assert_eq!(r.errno, Some(libc::ECONNREFUSED), "only connects to the dead backend may fail: {r:?}");
    }
    let status = daemon.status();
    let inflight = inflight_by_address(&status);
    let held_counts = count_by_backend(&ok);
    for addr in LIVE.iter().chain([&DEAD]) {
        assert_eq!(
            inflight.get(*addr).copied().unwrap_or(0),
            held_counts.get(*addr).copied().unwrap_or(0) as u64,
            "in-flight of {addr} while {held_counts:?} are held (ailb: {inflight:?})"
        );
    }
    assert_eq!(model_inflight(&status).get(MODEL).copied(), Some(ok.len() as u64), "model in-flight while held");
    held.release();
    daemon.wait_inflight_zero(SETTLE);

    // 2. Short request/response connections, the server closes first; some connects fail on
    //    the dead backend (they were never established, so never counted).
    let short = client.connect(Some(&cg), &ConnectOpts::new(VIP, 300));
    let failed = short.iter().filter(|r| !r.ok).count();
    eprintln!("short connections: {failed} of 300 failed (dead backend)");
    daemon.wait_inflight_zero(SETTLE);

    // 3. Held, then closed with an RST (SO_LINGER 0).
    let held = client.hold(Some(&cg), &ConnectOpts::new(VIP, 60).linger0());
    held.release();
    daemon.wait_inflight_zero(SETTLE);

    // 4. Held with a memory hint: each backend's hinted memory in flight is 700 MB per held
    //    connection, and returns to 0 with the counts (`wait_inflight_zero` checks both).
    let held = client.hold(Some(&cg), &ConnectOpts::new(VIP, 30).memory_mb(700));
    let ok: Vec<_> = held.results().iter().filter(|r| r.ok).cloned().collect();
    let mem = inflight_mem_by_address(&daemon.status());
    for (addr, n) in count_by_backend(&ok) {
        assert_eq!(mem.get(&addr).copied(), Some(700 * n as u64), "memory hints in flight of {addr}: {mem:?}");
    }
    held.release();
    daemon.wait_inflight_zero(SETTLE);

    // 5. Held, then the client process is killed (the kernel closes its sockets).
    let held = client.hold(Some(&cg), &ConnectOpts::new(VIP, 60));
    drop(held); // SIGKILL to the client's pid
    daemon.wait_inflight_zero(SETTLE);
}
