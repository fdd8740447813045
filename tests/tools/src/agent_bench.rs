//! `ailb-agent-bench`: the agent's benchmark, the time from a changed NVML value to the new
//! metadata in Nacos. Run by `cargo xtask bench`; needs no root and no GPU.
//!
//! Setup per publish interval: rnacos (v1 Open API), a FAKE `libnvidia-ml.so` whose values come
//! from a state file (tests/integration/fixtures/fake_nvml.c), a fake vLLM metrics server, and `ailb agent`
//! with `nvml = true` on one fake 80 GiB GPU. Runs once with the default `publish_interval`
//! (1 s) and once with 500 ms.
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
//! Writes `target/bench/agent.md` (in the target directory it was built into, see
//! [`crate::target_dir`]) and prints it.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ailb_tests::agent_harness::{meta, Agent, FakeNvml, FakeVllm};
use ailb_tests::nacos::RnacosServer;
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

/// Runs `changes` changes against an agent with `publish` (None: the default) and returns the
/// latencies, sorted.
fn run(publish: Option<&str>, interval: Duration, changes: usize, seed: u64) -> Vec<Duration> {
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
    let seen = |want: &str| meta(&nacos, port, "remaining_memory_mb").as_deref() == Some(want);
    let first = (TOTAL_MB - BASE_USED_MB).to_string();
    let t = Instant::now();
    while !seen(&first) {
        if t.elapsed() > Duration::from_secs(10) {
            panic!("the first registration never showed {first}; agent log:\n{}", agent.log());
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut rng = Rng(seed);
    let mut out = Vec::with_capacity(changes);
    for i in 1..=changes as u64 {
        std::thread::sleep(interval.mul_f64(rng.fraction()));
        let used = BASE_USED_MB + i * STEP_MB;
        let want = (TOTAL_MB - used).to_string();
        let t0 = Instant::now();
        nvml.set(&state(used));
        loop {
            if seen(&want) {
                out.push(t0.elapsed());
                break;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                panic!("change {i}: remaining_memory_mb={want} not in rnacos after 10 s; agent log:\n{}", agent.log());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    out.sort();
    out
}

/// `ailb-agent-bench`: both intervals, the table printed and written to `target/bench/agent.md`.
pub fn main(args: Args) {
    let changes = args.changes as usize;
    let mut md = String::new();
    let _ = writeln!(md, "### NVML change -> Nacos metadata (`ailb-agent-bench`, {changes} changes per interval)\n");
    let _ = writeln!(md, "| publish_interval | p50 | p90 | p99 | max |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    for (label, publish, interval, seed) in [
        ("1s (default)", None, Duration::from_secs(1), 0x9E37_79B9_7F4A_7C15u64),
        ("500ms", Some("500ms"), Duration::from_millis(500), 0xD1B5_4A32_D192_ED03u64),
    ] {
        eprintln!("ailb-agent-bench: publish_interval {label}, {changes} changes ...");
        let lat = run(publish, interval, changes, seed);
        let row = format!(
            "| {label} | {} | {} | {} | {} |",
            ms(pct(&lat, 50.0)),
            ms(pct(&lat, 90.0)),
            ms(pct(&lat, 99.0)),
            ms(*lat.last().expect("samples"))
        );
        eprintln!("{row}");
        let _ = writeln!(md, "{row}");
    }
    let _ = writeln!(
        md,
        "\nMeasured from writing the fake NVML state file to rnacos' instance list showing the new \
         `remaining_memory_mb`; changes of {STEP_MB} MiB (threshold 512), spaced by a pseudo-random fraction \
         of the interval. The target: 1 s."
    );
    let dir = crate::target_dir().join("bench");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let path = dir.join("agent.md");
    std::fs::write(&path, &md).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    println!("{md}");
    eprintln!("written to {}", path.display());
}
