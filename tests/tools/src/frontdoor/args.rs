//! The command line of `ailb-frontdoor-bench`.

use std::path::PathBuf;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "ailb-frontdoor-bench",
    about = "Small non-streamed requests through ailb's front door vs direct, nginx, sglang-router, vllm-router (root)",
    long_about = "Small non-streamed requests (a one-token chat completion) through ailb's front door, side by side \
        with the same requests directly to the server, through nginx as an L7 proxy with upstream keep-alive, \
        through sglang-router and through vllm-router, all in front of one simulated server (ailb-sim), in \
        interleaved rounds of `wrk -t1 -c16 -d5s --latency` and of the same with one connection (a closed \
        loop). Runs as root, in a private network namespace \
        (loopback only) and a child cgroup it creates, both removed on exit. Then measures where the front \
        door's time goes (strace -c system calls per request; perf where installed).\n\n\
        Writes target/bench/frontdoor.md and prints it.",
    after_help = "Environment:\n  AILB_BIN         the ailb binary to measure; default: release/ailb in the target directory this \
        binary was built into (`cargo xtask build --release`)\n  AILB_SIM_BIN     the ailb-sim binary; default: the one \
        next to this binary\n  AILB_PEERS_VENV  the venv holding sglang-router and vllm-router; default: target/peers-venv \
        (`cargo xtask setup`)"
)]
pub struct Args {
    /// Interleaved rounds (every path once per round). Seven by default: on shared cores one
    /// round of a path moves by 10-20 %, more than the gap between two close proxies, and the
    /// goal "ahead of the fastest peer" is judged round by round as well as on the medians.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(3..))]
    pub rounds: u32,
    /// Only direct, the default front door, nginx and the HAProxy relay: the rows that decide
    /// the goal against nginx (the fastest peer in every run so far), for more rounds in the
    /// same time. sglang-router, vllm-router and the other front door settings are not run.
    #[arg(long)]
    pub focus: bool,
    /// Seconds of each wrk run.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub seconds: u32,
    /// Seconds of each traced run (strace, perf) after the rounds; 0 skips them.
    #[arg(long, default_value_t = 3)]
    pub profile_seconds: u32,
    /// Where to write the report (default: target/bench/frontdoor.md in the target directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
}
