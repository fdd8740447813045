//! `cargo xtask`: developer tasks for ailb. See README.md.

mod bench;
mod build;
mod demo;
mod engine;
mod fuzz;
mod setup;
mod soak;
mod test;
mod util;

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ailb developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building and testing needs (nightly rust-src, bpf-linker, bpftool, ...,
    /// vLLM for CPU and the tiny model it serves) and mount bpffs. Idempotent.
    Setup {
        /// Only what `cargo xtask build` needs (nightly rust-src, bpf-linker): the container
        /// image's build stage (docs/deploy/Containerfile).
        #[arg(long)]
        build_only: bool,
    },
    /// Build the eBPF object (target/bpf/ailb.bpf.o) and the `ailb` binary that embeds it.
    Build {
        /// Build `ailb` in release mode (the eBPF object is always optimised).
        #[arg(long)]
        release: bool,
    },
    /// Lint, set up, build, then run every test (needs root). What CI runs.
    Test {
        /// Passed to the test binaries (e.g. a test name filter).
        #[arg(last = true)]
        args: Vec<OsString>,
    },
    /// The demo (needs root): rnacos, simulated GPUs (or, with `--engine vllm`, real vLLM for
    /// CPU servers) with their agents, `ailb run` on a child cgroup, the front door, a load
    /// generator and a live view; `--simple`: three loopback backends and `ailb run` on its
    /// embedded default config.
    Run {
        /// Stop after this many seconds (default: when the load is done, or Ctrl-C; `--simple`:
        /// until Ctrl-C).
        #[arg(long, value_name = "SECS")]
        duration: Option<u64>,
        /// The loopback demo of `ailb run`'s embedded default instead of the fleet.
        #[arg(long, conflicts_with = "engine")]
        simple: bool,
        /// The fleet's model servers: `sim` (simulated GPUs, the default) or `vllm` (real vLLM
        /// for CPU with the tiny model that `cargo xtask setup` makes; real time, 2 servers).
        #[arg(long, value_parser = ["sim", "vllm"])]
        engine: Option<String>,
        /// Passed to `ailb-demo` (e.g. `-- --trace --requests 300`), or with `--simple` to `ailb run`.
        #[arg(last = true)]
        args: Vec<OsString>,
    },
    /// Benchmarks (root): table build and disruption, then the data plane vs direct, nginx, HAProxy,
    /// the GPU node agent, the front door vs nginx and the peer routers, the fleet comparison, and
    /// a long run of every fuzz target (`--only fuzz` needs no root).
    Bench {
        /// Run only these parts (comma-separated; default: all of them, in this order).
        #[arg(long, value_enum, value_delimiter = ',', value_name = "PART")]
        only: Vec<bench::Part>,
        /// Minutes per fuzz target in the long fuzz run (`fuzz`).
        #[arg(long, default_value_t = 10, value_name = "N")]
        fuzz_minutes: u64,
        /// Which runs of `peers` (comma-separated; default: all five, each several minutes).
        #[arg(long, value_enum, value_delimiter = ',', value_name = "RUN")]
        peers_run: Vec<bench::PeersRun>,
    },
    /// The chaos soak (root): the fleet at its stable load through the socket ABI, the front
    /// door and remote clients through the TC datapath (network namespaces the soak makes) while
    /// the daemon, rnacos, an agent and a GPU server are killed and restarted, a bad config is
    /// SIGHUPed and a backend's memory runs low; then ten times the load for a minute.
    /// Reports in docs/results/soak/.
    Soak {
        /// Length of the soak, minutes (3 for a quick check).
        #[arg(long, default_value_t = 20.0)]
        minutes: f64,
        /// Only the overload.
        #[arg(long, conflicts_with = "no_overload")]
        overload_only: bool,
        /// Only the soak, no overload.
        #[arg(long)]
        no_overload: bool,
        /// No TC stream (no namespaces; the socket ABI and the front door on the host's loopback).
        #[arg(long)]
        no_tc: bool,
        /// Debug builds instead of release ones.
        #[arg(long)]
        debug: bool,
    },
    /// Fuzz the parsers of outside input (cargo-fuzz, nightly): build the targets of tests/fuzz,
    /// then run each for a few seconds from its seeds.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = fuzz::DEFAULT_SECONDS, value_name = "N")]
        seconds: u64,
        /// Only these targets (default: every target).
        targets: Vec<String>,
    },
    /// The demo's load generator; `cargo xtask run` starts it inside the demo cgroup.
    #[command(hide = true)]
    DemoClient {
        #[arg(long, default_value = demo::VIP)]
        vip: String,
        #[arg(long, default_value_t = 20)]
        rate: u32,
    },
}

fn main() -> ExitCode {
    // Print the error chain on one line; a backtrace (RUST_BACKTRACE=1 is common in CI) only hides it.
    match dispatch(Cli::parse().cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("[xtask] error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Setup { build_only: false } => setup::setup(),
        Cmd::Setup { build_only: true } => setup::build_only(),
        Cmd::Build { release } => build::build(release),
        Cmd::Test { args } => test::test(&args),
        Cmd::Run { duration, simple: true, args, .. } => demo::run(duration, &args),
        Cmd::Run { duration, simple: false, engine, args } => {
            let mut demo_args: Vec<OsString> = engine.into_iter().flat_map(|e| ["--engine".into(), e.into()]).collect();
            demo_args.extend(args);
            demo::full::run(duration, &demo_args)
        }
        Cmd::Bench { only, fuzz_minutes, peers_run } => bench::bench(&only, fuzz_minutes, &peers_run),
        Cmd::Soak { minutes, overload_only, no_overload, no_tc, debug } => {
            soak::soak(&soak::SoakOpts { minutes, overload_only, no_overload, no_tc, debug })
        }
        Cmd::Fuzz { seconds, targets } => fuzz::fuzz(seconds, &targets).map(drop),
        Cmd::DemoClient { vip, rate } => demo::client::client(&vip, rate),
    }
}
