//! `ailb-bench`: data-plane benchmarks, run as root by `cargo xtask bench`.
//!
//! Everything network happens inside a network namespace this program creates (loopback only),
//! and the ailb programs attach to a child cgroup it creates; both are removed on exit.
//!
//! 1. Requests per second of small HTTP requests, one new connection per request
//!    (`wrk -H "Connection: close"`), measured side by side in interleaved rounds:
//!    directly to one backend (no balancer), via the ailb VIP (3 backends), via an nginx
//!    round-robin proxy (L7, 3 backends), via HAProxy in TCP mode (L4 round robin) and via IPVS
//!    round robin where the kernel has it (`CONFIG_IP_VS`). The backends are one nginx process
//!    with one worker serving all three addresses, so every path has the same backend capacity.
//! 2. `connect4` run time from the kernel's BPF statistics (`kernel.bpf_stats_enabled`) with a
//!    1,000-backend model and 100,000 affinity entries.
//! 3. Table build and swap time of the 1,000-backend model on a weight change (daemon log).
//!
//! Writes `target/bench/datapath.md` and prints it.
//!
//! It measures the release build of `ailb` (`release/ailb` in the target directory it was built
//! into, see [`crate::target_dir`]) or `$AILB_BIN`, and fails, naming the path, when that binary is
//! absent: a debug build would measure the debug daemon's table builds.

pub mod args;
pub(crate) mod bpf;
mod http;
pub(crate) mod netns;
mod propagation;
mod table;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use ailb_tests::{base_config, ensure_bpffs, require_root, BackendCfg, CgroupGuard, Daemon, TestConfig};
use anyhow::{bail, Context};

use self::args::Args;
use self::netns::{run, Netns};

const ROUNDS: usize = 3;
const WRK_SECONDS: u32 = 5;
const WRK_CONNECTIONS: u32 = 32;
const VIP: &str = "127.77.0.1:80";
const BIG_VIP: &str = "127.77.1.1:80";
const BACKENDS: [&str; 3] = ["127.0.0.11:18001", "127.0.0.12:18002", "127.0.0.13:18003"];
const PROXY: &str = "127.0.0.20:8080";
const IPVS_VIP: &str = "127.0.0.30:80";
const HAPROXY: &str = "127.0.0.21:8080";
const AFFINITY_ENTRIES: usize = 100_000;
const MEASURE_CONNECTS: usize = 50_000;
/// Prompts of 16 blocks learnt before the prefix rows: 100,000 blocks in the prefix map.
const PREFIX_TENANTS: usize = 6_250;
const PREFIX_BLOCKS: usize = 16 * PREFIX_TENANTS;

fn say(msg: &str) {
    eprintln!("[bench {:>6.1}s] {msg}", START.with(|s| s.elapsed().as_secs_f64()));
}

thread_local! {
    static START: Instant = Instant::now();
}

/// `ailb-bench`: the connect loop (a child mode), only the propagation section, or everything.
pub fn main(args: Args) -> anyhow::Result<()> {
    if let Some(a) = &args.connect_loop {
        bpf::connect_loop(a);
        return Ok(());
    }
    START.with(|_| ());
    let bin = ailb_under_test()?;
    say(&format!("measuring {}", bin.display()));
    require_root();
    ensure_bpffs();
    let tools: &[&str] =
        if args.bpf_only { &["bpftool", "ip"] } else { &["wrk", "nginx", "haproxy", "ipvsadm", "bpftool", "ip"] };
    for tool in tools {
        if Command::new("which").arg(tool).stdout(Stdio::null()).status().map(|s| !s.success()).unwrap_or(true) {
            bail!("{tool} is not installed: run `cargo xtask setup`");
        }
    }
    if args.propagation_only {
        let mut report = String::new();
        propagation::propagation(&bin, &mut report);
        println!("{report}");
        return Ok(());
    }
    let (report, name) =
        if args.bpf_only { (bpf_only(&bin), "datapath-bpf.md") } else { (everything(&bin), "datapath.md") };
    let out = crate::target_dir().join("bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join(name);
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    println!("{report}");
    say(&format!("report written to {}", path.display()));
    Ok(())
}

/// The `ailb` binary to measure: `$AILB_BIN` (unless empty), else the release build in the
/// target directory this binary was built into; an error naming the path and how to build it
/// when it is absent.
pub(crate) fn ailb_under_test() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("AILB_BIN").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        if !path.is_file() {
            bail!("AILB_BIN names {}, which is not a file", path.display());
        }
        return Ok(path);
    }
    let path = crate::target_dir().join("release/ailb");
    if !path.is_file() {
        bail!(
            "the release build of ailb, {}, is absent: build it with `cargo xtask build --release` (it embeds \
             the eBPF object), or name the binary to measure with AILB_BIN",
            path.display()
        );
    }
    Ok(path)
}

/// A report's title and the machine it ran on, with the command that reproduces it.
fn heading(title: &str, command: &str) -> String {
    let mut report = String::new();
    let _ = writeln!(report, "# {title}\n");
    let _ = writeln!(
        report,
        "Machine: {} cores, kernel {}. Reproduce: `{command}` (as root).\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        run(Command::new("uname").arg("-r"), "uname").trim()
    );
    report
}

/// Every section, in a namespace, a cgroup and a temp dir of their own; returns the report.
fn everything(bin: &std::path::Path) -> String {
    let work = tempfile::Builder::new().prefix("ailb-bench-").tempdir().expect("tempdir");
    let ns = Netns::new();
    let cg = CgroupGuard::new("bench");
    let mut report = heading("ailb data-plane benchmarks", "cargo xtask bench");
    let _servers = http::Servers::start(&ns, work.path());
    say("backends, nginx proxy and haproxy ready");
    let ipvs = http::Ipvs::setup(&ns);
    let mut cfg = daemon_config(&cg);
    let mut daemon = Daemon::start(bin, &cfg);
    say("ailb daemon ready");

    // 1. Requests per second, interleaved rounds.
    http::requests_per_second(&ns, &cg, &ipvs, &mut report);
    // 2. connect4 run time with 1000 backends and 100,000 affinity entries.
    bpf::connect4_run_time(&ns, &cg, &daemon, &mut report);
    // 3. Table build and swap on a weight change of the 1000-backend model.
    table::rebuild_on_weight_change(&mut cfg, &mut daemon, &mut report);
    drop(daemon);
    // 4. Metadata propagation from Nacos to the pinned map.
    propagation::propagation(bin, &mut report);
    report
}

/// Section 2 alone: the programs' run time per connection.
fn bpf_only(bin: &std::path::Path) -> String {
    let ns = Netns::new();
    let cg = CgroupGuard::new("bench-bpf");
    let mut report = heading("ailb data-plane benchmarks: BPF run time only", "ailb-bench --bpf-only");
    let daemon = Daemon::start(bin, &daemon_config(&cg));
    say("ailb daemon ready");
    bpf::connect4_run_time(&ns, &cg, &daemon, &mut report);
    report
}

/// The ailb daemon's config: the 3-backend model on `VIP`, the 1000-backend model on `BIG_VIP`.
fn daemon_config(cg: &CgroupGuard) -> TestConfig {
    let mut cfg = base_config("bench", cg).service("bench", VIP).service("bench-1000", BIG_VIP);
    for b in BACKENDS {
        cfg = cfg.backend(BackendCfg::new("bench", b, 1));
    }
    for i in 0..1000u32 {
        cfg = cfg.backend(BackendCfg::new("bench-1000", &format!("127.1.{}.{}:9000", i / 250, i % 250 + 1), 1 + i % 3));
    }
    // The prefix rows: the big model learns from its picks, for as long as the bench runs.
    cfg.extra.push_str("[[models]]\nname = \"bench-1000\"\nprefix = \"approximate\"\nprefix_ttl = \"1h\"\n");
    cfg
}
