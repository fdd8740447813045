//! `balancer.affinity_wait`: a conversation whose backend lacks the hinted memory now (but
//! holds it when idle) waits there, for its cached prefix, only if the conversation was active
//! within the wait; otherwise it is placed on a backend with room now. The age counts from the
//! conversation's last connect **or close** (`sock_ops` refreshes the entry at close), so a
//! long answer does not age its own conversation.

use std::time::Duration;

use ailb_tests::client::count_by_backend;
use ailb_tests::nacos::free_port;
use ailb_tests::status::{ailb_explain, stat};
use ailb_tests::{
    base_config, client_bin, preflight, wait_until, BackendCfg, BackendServer, CgroupGuard, ConnectOpts, Daemon,
    TestClient,
};

const MODEL: &str = "wait-7b";
const VIP: &str = "127.77.11.1:8000";
const ADDRS: [&str; 2] = ["127.0.11.11:19101", "127.0.11.12:19102"];
/// Three such hints fill a backend of 24,000 MB exactly.
const NEED_MB: u32 = 8000;
const CONVERSATION: &str = "wait";

/// The conversation's affinity entry as `ailb explain` reads it from the pinned maps:
/// (backend, age in ms).
fn entry(bin: &std::path::Path, listen: &str, bpffs: &str) -> (String, u64) {
    let conversation = format!("{CONVERSATION}-0");
    let v = ailb_explain(bin, MODEL, listen, bpffs, &["--conversation", &conversation]);
    let c = &v["conversation"];
    let backend = c["affinity_backend"].as_str().unwrap_or_else(|| panic!("no affinity entry: {c}")).to_string();
    let age = c["affinity_age_ms"].as_u64().unwrap_or_else(|| panic!("no affinity age: {c}"));
    (backend, age)
}

#[test]
fn a_full_backend_is_waited_for_only_within_the_affinity_wait() {
    let bin = preflight();
    let cg = CgroupGuard::new("affinity-wait");
    let _servers = BackendServer::start_all(&ADDRS);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cfg = base_config("affinity-wait", &cg).service(MODEL, VIP);
    cfg.listen = Some(listen.clone());
    cfg.affinity_wait = "1h".into();
    for a in ADDRS {
        cfg = cfg.backend(BackendCfg::new(MODEL, a, 1).free_memory_mb(24_000));
    }
    let mut daemon = Daemon::start(&bin, &cfg);
    let bpffs = daemon.bpffs().to_str().expect("utf-8").to_string();
    assert_eq!(daemon.status()["config"]["affinity_wait_ms"], 3_600_000, "{}", daemon.status());
    let client = TestClient::new(client_bin!());
    let one = || ConnectOpts::new(VIP, 1).conversations(1, CONVERSATION).memory_mb(NEED_MB);
    let three = || ConnectOpts::new(VIP, 3).conversations(1, CONVERSATION).memory_mb(NEED_MB);

    // Three held connections of one conversation fill its backend (affinity, each fits now).
    let held = client.hold(Some(&cg), &three());
    let per = count_by_backend(held.results());
    assert_eq!(per.len(), 1, "three connections of one conversation, each fitting: one backend, got {per:?}");
    let home = per.keys().next().expect("one backend").clone();
    let other = ADDRS.iter().find(|a| **a != home).expect("two backends").to_string();

    // 1. A fourth: no memory free at home now, 24,000 MB on the other; the conversation was
    //    active a moment ago, within the wait of 1 h: it waits at home for its prefix.
    let r = client.connect(Some(&cg), &one());
    assert_eq!(r[0].backend.as_deref(), Some(home.as_str()), "within the affinity wait: {r:?}");

    // 2. The close refreshes the entry's age. Let it age, then close the held connections:
    //    without the refresh the age could only have grown.
    let aged = wait_until("the affinity entry to age 500 ms", Duration::from_secs(10), || {
        let (b, age) = entry(&bin, &listen, &bpffs);
        (age >= 500).then_some((b, age))
    });
    assert_eq!(aged.0, home, "the entry names the backend its connections reached");
    held.release();
    daemon.wait_inflight_zero(Duration::from_secs(5));
    let (b, age) = entry(&bin, &listen, &bpffs);
    assert_eq!(b, home);
    assert!(age < aged.1, "after the connections closed the entry is {age} ms old, before it was {} ms", aged.1);

    // 3. Never waiting: the same situation sends the fourth to the other backend, as an
    //    affinity break.
    cfg.affinity_wait = "0s".into();
    daemon.reload(&cfg);
    assert_eq!(daemon.status()["config"]["affinity_wait_ms"], 0);
    let held = client.hold(Some(&cg), &three());
    let per = count_by_backend(held.results());
    assert_eq!(per.get(home.as_str()).copied(), Some(3), "the entry still holds while its backend fits: {per:?}");
    let breaks = stat(&daemon.status(), "affinity_breaks");
    let r = client.connect(Some(&cg), &one());
    assert_eq!(r[0].backend.as_deref(), Some(other.as_str()), "affinity_wait 0s: {r:?}");
    assert_eq!(stat(&daemon.status(), "affinity_breaks"), breaks + 1, "counted as an affinity break");
    held.release();
    daemon.wait_inflight_zero(Duration::from_secs(5));
}
