//! `ailb-agent-bench`: the agent's benchmark, the time from a changed NVML value to the new
//! metadata in Nacos. Run by `cargo xtask bench`; needs no root and no GPU.
//!
//! Setup per publish interval: rnacos (v1 Open API), a FAKE `libnvidia-ml.so` whose values come
//! from a state file (tests/integration/fixtures/fake_nvml.c), a fake vLLM metrics server, and `ailb agent`
//! with `nvml = true` on one fake 80 GiB GPU. Runs once with the default `publish_interval`
//! (500 ms) and once with 1 s.
//!
//! Each of `--changes N` (default 100) changes moves the GPU's used memory by 700 MiB (above the
//! default 512 MiB threshold), to a value never seen before; the changes are spaced by a
//! pseudo-random fraction of the interval after the previous one was seen, so that they do not
//! phase-lock with the agent's timer. Measured from writing the state file (atomically, by
//! rename) to rnacos' `/nacos/v1/ns/instance/list?healthyOnly=false` showing the new
//! `remaining_memory_mb` (polled every 2 ms). The fake NVML makes the sample instant, so this is
//! the agent's own latency (timer, scrape, compare, write) plus rnacos; a real driver adds its
//! call time (NVML's memory query is typically well under a millisecond).
//!
//! As root it also runs `ailb run` reading that rnacos (Nacos discovery, its default 100 ms poll,
//! attached to a child cgroup it creates) and measures the whole path the same way: from the
//! state file to the daemon's `/v1/plan` showing the backend's new free memory, which the
//! daemon publishes only after writing the plan into the kernel maps.
//!
//! Writes `target/bench/agent.md` (in the target directory it was built into, see
//! [`crate::target_dir`]) and prints it.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ailb_tests::agent_harness::{meta, Agent, FakeNvml, FakeVllm, IP, SERVICE};
use ailb_tests::nacos::{free_port, RnacosServer};
use ailb_tests::{base_config, CgroupGuard, Daemon};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "ailb-agent-bench", about = "Time from a changed (fake) NVML value to the new metadata in Nacos")]
pub struct Args {
    /// Changes per publish interval.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub changes: u64,
}

const TOTAL_MB: u64 = 81920;
const STEP_MB: u64 = 700;
const BASE_USED_MB: u64 = 1000;

fn state(used_mb: u64) -> String {
    format!(
        "count 1\n0 name NVIDIA A100-SXM4-80GB\n0 uuid GPU-0\n0 total_mb {TOTAL_MB}\n0 used_mb {used_mb}\n0 util 30\n"
    )
}

/// xorshift64*: reproducible spacing without a dependency.
struct Rng(u64);

impl Rng {
    fn fraction(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// `ailb run` on Nacos discovery of `nacos`, for the agent's model, with its HTTP endpoint.
struct Gateway {
    daemon: Daemon,
    listen: String,
    _cg: CgroupGuard,
}

impl Gateway {
    fn start(nacos: &RnacosServer) -> Self {
        let cg = CgroupGuard::new("agent-bench");
        let listen = format!("127.0.0.1:{}", free_port());
        let mut cfg = base_config("agent-bench", &cg);
        cfg.listen = Some(listen.clone());
        cfg.extra = format!(
            "[[models]]\nname = \"{SERVICE}\"\nvips = [\"127.77.30.1:8000\"]\n\n\
             [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\n",
            nacos.url()
        );
        let daemon = Daemon::start(&ailb_tests::ailb_bin(), &cfg);
        Self { daemon, listen, _cg: cg }
    }

    /// The backend's free memory in the daemon's last written plan.
    fn free_mb(&self, port: u16) -> Option<u64> {
        let body = std::panic::catch_unwind(|| ailb_tests::sim::http_get(&self.listen, "/v1/plan")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let addr = format!("{IP}:{port}");
        v["models"][SERVICE]["backends"].as_array()?.iter().find(|b| b["address"] == addr.as_str())?["free_memory_mb"]
            .as_u64()
    }
}

/// Latencies of one change: to rnacos, and (with the daemon) to the written plan.
struct Seen {
    nacos: Vec<Duration>,
    plan: Vec<Duration>,
}

/// Runs `changes` changes against an agent with `publish` (None: the default), with `ailb run`
/// reading rnacos when `gateway`, and returns the latencies, sorted.
fn run(publish: Option<&str>, interval: Duration, changes: usize, seed: u64, gateway: bool) -> Seen {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    let nvml = FakeNvml::build(&state(BASE_USED_MB));
    let agent = Agent::spawn_publishing(
        &nacos,
        &vllm,
        publish,
        "5s",
        &format!("nvml_library = \"{}\"", nvml.lib()),
        "api = \"v1\"",
        "nvml = true\ngpus = [0]",
    )
    .ready();
    let port = agent.instance_port;
    let gw = gateway.then(|| Gateway::start(&nacos));
    let seen = |want: &str| meta(&nacos, port, "remaining_memory_mb").as_deref() == Some(want);
    let planned = |want: u64| gw.as_ref().is_none_or(|g| g.free_mb(port) == Some(want));
    let first = TOTAL_MB - BASE_USED_MB;
    let t = Instant::now();
    while !seen(&first.to_string()) || !planned(first) {
        if t.elapsed() > Duration::from_secs(20) {
            let daemon = gw.as_ref().map(|g| g.daemon.log()).unwrap_or_default();
            panic!("the first registration never showed {first}; agent log:\n{}\ndaemon log:\n{daemon}", agent.log());
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut rng = Rng(seed);
    let mut out = Seen { nacos: Vec::with_capacity(changes), plan: Vec::with_capacity(changes) };
    for i in 1..=changes as u64 {
        std::thread::sleep(interval.mul_f64(rng.fraction()));
        let used = BASE_USED_MB + i * STEP_MB;
        let want = TOTAL_MB - used;
        let t0 = Instant::now();
        nvml.set(&state(used));
        let mut in_nacos = None;
        loop {
            if in_nacos.is_none() && seen(&want.to_string()) {
                in_nacos = Some(t0.elapsed());
                out.nacos.push(t0.elapsed());
            }
            if in_nacos.is_some() && (gw.is_none() || planned(want)) {
                if gw.is_some() {
                    out.plan.push(t0.elapsed());
                }
                break;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                panic!("change {i}: remaining_memory_mb={want} not through after 10 s; agent log:\n{}", agent.log());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    out.nacos.sort();
    out.plan.sort();
    out
}

fn row(label: &str, lat: &[Duration]) -> String {
    format!(
        "| {label} | {} | {} | {} | {} |",
        ms(pct(lat, 50.0)),
        ms(pct(lat, 90.0)),
        ms(pct(lat, 99.0)),
        ms(*lat.last().expect("samples"))
    )
}

/// `ailb-agent-bench`: both intervals, the table printed and written to `target/bench/agent.md`.
pub fn main(args: Args) {
    let changes = args.changes as usize;
    let mut md = String::new();
    let _ = writeln!(md, "### NVML change -> Nacos metadata (`ailb-agent-bench`, {changes} changes per interval)\n");
    let _ = writeln!(md, "| publish_interval | p50 | p90 | p99 | max |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    // The whole path needs `ailb run`, which needs root; without it only the agent's part.
    let gateway = ailb_tests::is_root();
    let mut plan_rows = Vec::new();
    for (label, publish, interval, seed) in [
        ("500ms (default)", None, Duration::from_millis(500), 0xD1B5_4A32_D192_ED03u64),
        ("1s", Some("1s"), Duration::from_secs(1), 0x9E37_79B9_7F4A_7C15u64),
    ] {
        eprintln!("ailb-agent-bench: publish_interval {label}, {changes} changes ...");
        let lat = run(publish, interval, changes, seed, gateway);
        let r = row(label, &lat.nacos);
        eprintln!("{r}");
        let _ = writeln!(md, "{r}");
        if gateway {
            let r = row(label, &lat.plan);
            eprintln!("whole path: {r}");
            plan_rows.push(r);
        }
    }
    let _ = writeln!(
        md,
        "\nMeasured from writing the fake NVML state file to rnacos' instance list showing the new \
         `remaining_memory_mb`; changes of {STEP_MB} MiB (threshold 512), spaced by a pseudo-random fraction \
         of the interval. The target: 1 s."
    );
    if plan_rows.is_empty() {
        let _ = writeln!(md, "\nThe whole path to the kernel maps (`ailb run`) was not measured: it needs root.");
    } else {
        let _ = writeln!(
            md,
            "\n### NVML change -> kernel maps (agent -> rnacos -> `ailb run`, 100 ms poll -> maps)\n\n\
             | publish_interval | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|\n{}\n\n\
             Measured from writing the fake NVML state file to the daemon's `/v1/plan` showing the backend's new \
             free memory (published after the plan is written into the maps), polled every 2 ms.",
            plan_rows.join("\n")
        );
    }
    let dir = crate::target_dir().join("bench");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let path = dir.join("agent.md");
    std::fs::write(&path, &md).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    println!("{md}");
    eprintln!("written to {}", path.display());
}
