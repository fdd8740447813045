//! End to end: rnacos (a real Nacos-compatible server, v1 Open API) -> `ailb run` with
//! `discovery.source = "nacos"` -> the kernel tables -> connections from the child cgroup.
//! Instances are registered, updated and deregistered over the Nacos HTTP API as a GPU node
//! would. The server here is rnacos 0.8.8, persistent instances (ephemeral ones need the
//! agent's heartbeats, which is the next issue).

use std::time::{Duration, Instant};

use ailb_tests::client::count_by_backend;
use ailb_tests::nacos::{free_port, NacosInstance, RnacosServer};
use ailb_tests::status::backend;
use ailb_tests::{
    base_config, client_bin, preflight, wait_until, BackendServer, CgroupGuard, ConnectOpts, Daemon, TestClient,
};

const MODEL: &str = "llm";
const VIP: &str = "127.77.5.1:8000";
const ADDRS: [&str; 3] = ["127.0.5.11:18501", "127.0.5.12:18502", "127.0.5.13:18503"];

fn instance(addr: &str, util: &str, health: &str) -> NacosInstance {
    instance_at(addr, util, health, "40", 0)
}

/// `updated_at_ms` makes every publish a new sample for the policy's smoothing, as the agent's are.
fn instance_at(addr: &str, util: &str, health: &str, mem_gb: &str, updated_at_ms: u64) -> NacosInstance {
    let (ip, port) = addr.split_once(':').expect("ip:port");
    let mut i = NacosInstance::new(MODEL, ip, port.parse().expect("port"))
        .meta("model_id", MODEL)
        .meta("gpu_type", "A100-80GB")
        .meta("remaining_memory", mem_gb)
        .meta("updated_at_ms", &updated_at_ms.to_string())
        .meta("gpu_util", util)
        .meta("current_requests", "0")
        .meta("queue_length", "0")
        .meta("health_status", health);
    i.ephemeral = false;
    i
}

/// (live, weight) of a backend in the kernel maps; a backend that left and drained is no
/// longer listed at all: (false, 0).
fn weight_of(d: &Daemon, addr: &str) -> (bool, u64) {
    let st = d.status();
    match backend(&st, addr) {
        Some(b) => (b["live"].as_bool().unwrap_or(false), b["weight"].as_u64().unwrap_or(0)),
        None => (false, 0),
    }
}

fn get(listen: &str, path: &str) -> String {
    let port = listen.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let (status, body) =
        ailb_tests::nacos::http_request(port, "GET", path, &[]).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(status, 200, "GET {path}");
    String::from_utf8_lossy(&body).into_owned()
}

/// The smoothed GPU utilisation the daemon's policy holds for `addr` (from `/v1/plan`).
fn smoothed_util(listen: &str, addr: &str) -> Option<f64> {
    let plan: serde_json::Value = serde_json::from_str(&get(listen, "/v1/plan")).expect("plan JSON");
    plan["models"][MODEL]["backends"]
        .as_array()?
        .iter()
        .find(|b| b["address"] == addr)
        .and_then(|b| b["explain"]["util"]["smoothed"].as_f64())
}

fn metric(listen: &str, name: &str) -> f64 {
    let text = get(listen, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()))
        .unwrap_or_else(|| panic!("metric {name} not found in:\n{text}"))
}

#[test]
fn nacos_changes_reach_the_kernel_and_an_outage_keeps_the_tables() {
    let bin = preflight();
    let nacos = RnacosServer::start();
    let cg = CgroupGuard::new("nacos-e2e");
    let _servers = BackendServer::start_all(&ADDRS);
    for a in ADDRS {
        nacos.register(&instance(a, "50", "healthy"));
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cfg = base_config("nacos-e2e", &cg);
    cfg.listen = Some(listen.clone());
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = [\"{VIP}\"]\nrequired_memory_mb = 8000\n\n\
         [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"100ms\"\n",
        nacos.url()
    );
    let daemon = Daemon::start(&bin, &cfg);
    let client = TestClient::new(client_bin!());

    // 1. All three registered instances are live and get connections.
    wait_until("three live backends from Nacos", Duration::from_secs(5), || {
        ADDRS.iter().all(|a| weight_of(&daemon, a).0).then_some(())
    });
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 300));
    assert!(res.iter().all(|r| r.ok), "all connects succeed: {:?}", res.iter().find(|r| !r.ok));
    let counts = count_by_backend(&res);
    for a in ADDRS {
        assert!(
            counts.get(a).copied().unwrap_or(0) > 30,
            "{a} gets about a third of 300 equal-weight connections: {counts:?}"
        );
    }

    // 2a. A memory change: 4 GB free < the model's 8 GB requirement excludes the backend.
    // The goal for metadata propagation is 1 s; the poll interval is 100 ms.
    let t0 = Instant::now();
    nacos.register(&instance_at(ADDRS[0], "50", "healthy", "4", 1));
    wait_until("the backend without enough memory to leave the table", Duration::from_secs(3), || {
        (!weight_of(&daemon, ADDRS[0]).0).then_some(())
    });
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(1), "metadata propagated in {took:?}, the goal is 1 s");
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 200));
    assert_eq!(count_by_backend(&res).get(ADDRS[0]), None, "no connection to the excluded backend");
    nacos.register(&instance_at(ADDRS[0], "50", "healthy", "40", 2));
    wait_until("the backend to come back", Duration::from_secs(3), || weight_of(&daemon, ADDRS[0]).0.then_some(()));

    // 2b. GPU utilisation 95%: smoothed (EWMA) over the agent's samples, so it takes a few
    // publishes; each is waited for (the smoothed value moves) before the next.
    // Table weights are rescaled per model, so compare A's weight to B's (equal before).
    let ratio = |d: &Daemon| weight_of(d, ADDRS[0]).1 as f64 / weight_of(d, ADDRS[1]).1.max(1) as f64;
    let before = ratio(&daemon);
    let mut last = smoothed_util(&listen, ADDRS[0]);
    let mut dropped = false;
    for sample in 3..12u64 {
        nacos.register(&instance_at(ADDRS[0], "95", "healthy", "40", sample));
        last = wait_until("the daemon to take the utilisation sample", Duration::from_secs(3), || {
            let now = smoothed_util(&listen, ADDRS[0]);
            (now != last).then_some(now)
        });
        if ratio(&daemon) < before {
            dropped = true;
            break;
        }
    }
    assert!(dropped, "95% GPU utilisation never lowered the weight (smoothed {last:?})");

    // 3. health_status=unhealthy: no new connection reaches it once the change is seen.
    nacos.register(&instance(ADDRS[1], "50", "unhealthy"));
    wait_until("the unhealthy backend to leave the table", Duration::from_secs(3), || {
        (!weight_of(&daemon, ADDRS[1]).0).then_some(())
    });
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 200));
    let counts = count_by_backend(&res);
    assert_eq!(counts.get(ADDRS[1]), None, "the unhealthy backend got connections: {counts:?}");

    // 4. Deregistered: gone from the table, no connection.
    nacos.deregister(&instance(ADDRS[2], "50", "healthy"));
    wait_until("the deregistered backend to leave the table", Duration::from_secs(3), || {
        (!weight_of(&daemon, ADDRS[2]).0).then_some(())
    });
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 200));
    let counts = count_by_backend(&res);
    assert!(res.iter().all(|r| r.ok), "connects still succeed");
    assert_eq!(counts.keys().collect::<Vec<_>>(), vec![ADDRS[0]], "only the remaining backend: {counts:?}");

    // 5. Nacos down: routing continues on the last tables; staleness grows; errors are counted.
    let generation = ailb_tests::status::generation(&daemon.status());
    let mut nacos = nacos;
    nacos.stop();
    let stale0 = wait_until("discovery errors after the outage", Duration::from_secs(5), || {
        (metric(&listen, "ailb_discovery_errors_total") > 0.0).then(|| metric(&listen, "ailb_discovery_stale_seconds"))
    });
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 100));
    assert!(res.iter().all(|r| r.ok), "routing continues with Nacos down");
    wait_until("staleness to grow", Duration::from_secs(5), || {
        (metric(&listen, "ailb_discovery_stale_seconds") > stale0 + 0.5).then_some(())
    });
    assert_eq!(ailb_tests::status::generation(&daemon.status()), generation, "no table was written during the outage");

    // 6. Nacos back (same port and data: persistent instances survive): the same fleet is read
    // again, so nothing is rewritten (no table flap), and staleness returns to 0.
    let rebuilds_before = metric(&listen, "ailb_table_rebuilds_total{model=\"llm\"}");
    nacos.restart();
    wait_until("staleness back to 0", Duration::from_secs(10), || {
        (metric(&listen, "ailb_discovery_stale_seconds") == 0.0).then_some(())
    });
    let res = client.connect(Some(&cg), &ConnectOpts::new(VIP, 100));
    assert!(res.iter().all(|r| r.ok));
    assert_eq!(count_by_backend(&res).keys().collect::<Vec<_>>(), vec![ADDRS[0]]);
    assert_eq!(
        metric(&listen, "ailb_table_rebuilds_total{model=\"llm\"}"),
        rebuilds_before,
        "recovery rebuilt a table although the fleet is unchanged"
    );
}

/// `ailb run` against a Nacos with auth on and a wrong password stops at start-up with an
/// error naming the server and the refusal, and pins nothing.
#[test]
fn a_wrong_nacos_password_stops_the_daemon_at_start_up() {
    let bin = preflight();
    let nacos = RnacosServer::start_with(&[
        ("RNACOS_ENABLE_OPEN_API_AUTH", "true"),
        ("RNACOS_INIT_ADMIN_USERNAME", "ailb"),
        ("RNACOS_INIT_ADMIN_PASSWORD", "s3cret-pw"),
    ]);
    let cg = CgroupGuard::new("nacos-auth");
    let mut cfg = base_config("nacos-auth", &cg);
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = [\"{VIP}\"]\n\n[discovery]\nsource = \"nacos\"\n\
         [discovery.nacos]\nservers = [\"{}\"]\nusername = \"ailb\"\npassword = \"not-the-password\"\n",
        nacos.url()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ailb.toml");
    std::fs::write(&path, cfg.to_toml()).expect("write config");
    let out = ailb_tests::run_cmd(
        std::process::Command::new(&bin).arg("run").arg("--config").arg(&path),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ailb run must fail with a wrong password; stderr:\n{stderr}");
    assert!(
        stderr.contains("login") && stderr.contains(&nacos.url().replace("http://", "")),
        "the error names the login and the server: {stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "the password must not be printed: {stderr}");
    assert!(!std::path::Path::new(&cfg.bpffs).exists(), "nothing may be pinned after a failed start");
}
