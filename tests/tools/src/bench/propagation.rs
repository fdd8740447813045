//! Section 4: how fast a metadata change in Nacos reaches the pinned map.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ailb_tests::nacos::{NacosInstance, RnacosServer};
use ailb_tests::status::backend;
use ailb_tests::{base_config, CgroupGuard, Daemon};

use super::netns::run;
use super::say;

const PROP_CHANGES: usize = 200;
const PROP_POLL: &str = "100ms";

/// The `state` field of backend `id` in the pinned `AILB_BACKENDS` (BTF-formatted bpftool lookup).
fn backend_state(bpffs: &Path, id: u32) -> u64 {
    let key: Vec<String> = id.to_le_bytes().iter().map(|b| b.to_string()).collect();
    let map = bpffs.join("AILB_BACKENDS");
    let mut cmd = Command::new("bpftool");
    cmd.args(["-j", "map", "lookup", "pinned", map.to_str().expect("utf-8"), "key"]).args(&key);
    let v: serde_json::Value = serde_json::from_str(&run(&mut cmd, "bpftool map lookup")).expect("bpftool json");
    v["formatted"]["value"]["state"].as_u64().unwrap_or_else(|| panic!("no formatted state in {v}"))
}

/// From rnacos answering an instance update (the register call returned) to the backend's new
/// state being visible in the pinned map: `PROP_CHANGES` changes that alternately exclude and
/// readmit a backend (free memory below / above the model's requirement).
pub(super) fn propagation(bin: &Path, report: &mut String) {
    let nacos = RnacosServer::start();
    let cg = CgroupGuard::new("bench-nacos");
    let addrs = ["127.0.9.11:18901", "127.0.9.12:18902", "127.0.9.13:18903"];
    let inst = |addr: &str, mem: &str, n: usize| {
        let (ip, port) = addr.split_once(':').expect("ip:port");
        let mut i = NacosInstance::new("prop", ip, port.parse().expect("port"))
            .meta("model_id", "prop")
            .meta("remaining_memory", mem)
            .meta("updated_at_ms", &n.to_string());
        i.ephemeral = false;
        i
    };
    for a in addrs {
        nacos.register(&inst(a, "40", 0));
    }
    let mut cfg = base_config("bench-nacos", &cg);
    cfg.extra = format!(
        "[[models]]\nname = \"prop\"\nvips = [\"127.77.9.1:80\"]\nrequired_memory_mb = 8000\n\n[discovery]\n\
         source = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"{PROP_POLL}\"\n",
        nacos.url()
    );
    let daemon = Daemon::start(bin, &cfg);
    let st = daemon.status();
    let id = backend(&st, addrs[0])
        .and_then(|b| b["id"].as_u64())
        .unwrap_or_else(|| panic!("{} not in status: {st}", addrs[0])) as u32;
    let bpffs = daemon.bpffs().to_path_buf();
    let mut samples = Vec::with_capacity(PROP_CHANGES);
    say(&format!("propagation: {PROP_CHANGES} metadata changes through rnacos (poll {PROP_POLL})"));
    for n in 1..=PROP_CHANGES {
        // Space the changes by a pseudo-random 0..100 ms: otherwise each change is made right
        // after the poll that showed the previous one, phase-locked to the poll timer, and every
        // sample would read one full interval.
        std::thread::sleep(Duration::from_millis((n as u64 * 37) % 100));
        let excluded = n % 2 == 1;
        nacos.register(&inst(addrs[0], if excluded { "4" } else { "40" }, n));
        let t0 = Instant::now();
        let want = if excluded { 0 } else { 1 };
        loop {
            if backend_state(&bpffs, id) & 1 == want {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "change {n} not visible in the pinned map after 5 s");
        }
        samples.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1];
    let _ = writeln!(
        report,
        "\n## Metadata propagation, Nacos -> pinned map\n\nrnacos 0.8.8 (v1 Open API), poll interval {PROP_POLL}, \
         {PROP_CHANGES} changes of one instance's `remaining_memory` that alternately exclude and readmit it \
         (8 GB required), spaced by a pseudo-random 0-100 ms so that they do not phase-lock with the poll \
         timer; from the register call returning to `AILB_BACKENDS` showing the new state \
         (polled with `bpftool map lookup`, a few ms per look).\n\n| p50 | p90 | p99 | max |\n|---:|---:|---:|---:|\n\
         | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        samples[samples.len() - 1]
    );
    say(&format!("propagation p50 {:.0} ms, p99 {:.0} ms", pct(0.5), pct(0.99)));
}
