//! A daemon killed with SIGKILL and restarted keeps each backend's memory capacity.
//!
//! The kernel queues a request whose memory hint no backend has free now on a backend whose
//! capacity (the most free memory it has reported: what it holds when idle) holds it, and
//! refuses it (`ECONNREFUSED`; the front door answers 503) only when the hint is above every
//! capacity. A restarted daemon used to start its policy afresh and take the free memory of
//! its first poll for the capacity: with every GPU busy at that moment, a request they all
//! hold when idle was refused until they reported more (the soak's two front-door 503s right
//! after the daemon's restart). Here one backend reports 24 GB free, then 4 GB (busy); a
//! connect hinting 8 GB is queued on it before the restart and must still be after it.

use std::time::Duration;

use ailb_tests::nacos::{free_port, NacosInstance, RnacosServer};
use ailb_tests::status::backend;
use ailb_tests::{
    base_config, client_bin, preflight, wait_until, BackendServer, CgroupGuard, ConnectOpts, Daemon, TestClient,
};

const MODEL: &str = "restart-7b";
const VIP: &str = "127.77.13.1:8000";
const ADDR: &str = "127.0.13.11:18511";
const HINT_MB: u32 = 8_000;

fn instance(free_mb: u32, updated_at_ms: u64) -> NacosInstance {
    let (ip, port) = ADDR.split_once(':').expect("ip:port");
    let mut i = NacosInstance::new(MODEL, ip, port.parse().expect("port"))
        .meta("model_id", MODEL)
        .meta("gpu_type", "A100-80GB")
        .meta("remaining_memory_mb", &free_mb.to_string())
        .meta("updated_at_ms", &updated_at_ms.to_string())
        .meta("gpu_util", "50")
        .meta("health_status", "healthy");
    i.ephemeral = false;
    i
}

/// (free MB, capacity MB) of the backend in the kernel's maps.
fn memory(d: &Daemon) -> (Option<u64>, Option<u64>) {
    let st = d.status();
    let b = backend(&st, ADDR).unwrap_or_else(|| panic!("{ADDR} not in the maps: {st}"));
    (b["free_mem_mb"].as_u64(), b["mem_capacity_mb"].as_u64())
}

/// One connect hinting [`HINT_MB`]: the backend it reached, or the error.
fn connect(client: &TestClient, cg: &CgroupGuard) -> Result<String, String> {
    let res = client.connect(Some(cg), &ConnectOpts::new(VIP, 1).memory_mb(HINT_MB));
    let r = res.into_iter().next().expect("one result");
    match (r.ok, r.backend) {
        (true, Some(b)) => Ok(b),
        _ => Err(format!("errno {:?}: {:?}", r.errno, r.error)),
    }
}

#[test]
fn a_restarted_daemon_keeps_the_capacity_of_a_busy_backend() {
    let bin = preflight();
    let nacos = RnacosServer::start();
    let cg = CgroupGuard::new("restart-capacity");
    let _server = BackendServer::start_all(&[ADDR]);
    nacos.register(&instance(24_000, 1));
    let mut cfg = base_config("restart-capacity", &cg);
    cfg.listen = Some(format!("127.0.0.1:{}", free_port()));
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = [\"{VIP}\"]\n\n\
         [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"100ms\"\n",
        nacos.url()
    );
    let mut daemon = Daemon::start(&bin, &cfg);
    let client = TestClient::new(client_bin!());
    wait_until("the idle report in the maps", Duration::from_secs(5), || {
        (memory(&daemon) == (Some(24_000), Some(24_000))).then_some(())
    });

    // Busy: 4 GB free now, 24 GB when idle. An 8 GB hint is queued there, not refused.
    nacos.register(&instance(4_000, 2));
    wait_until("the busy report in the maps", Duration::from_secs(5), || {
        (memory(&daemon) == (Some(4_000), Some(24_000))).then_some(())
    });
    assert_eq!(connect(&client, &cg), Ok(ADDR.to_string()), "queued on the backend's idle capacity");

    // SIGKILL and restart while the backend is still busy.
    daemon.kill9();
    daemon.restart();
    assert_eq!(connect(&client, &cg), Ok(ADDR.to_string()), "still queued after the restart, not refused");
    assert_eq!(memory(&daemon), (Some(4_000), Some(24_000)), "the restarted daemon keeps the capacity");
    daemon.wait_inflight_zero(Duration::from_secs(5));
}
