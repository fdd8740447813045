//! The command line of `ailb-bench`.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "ailb-bench",
    about = "Data-plane benchmarks of ailb (root): request rate, BPF run time, table swaps, Nacos propagation",
    long_about = "Data-plane benchmarks of ailb, run as root (`cargo xtask bench` runs it).\n\n\
        Everything happens in a network namespace and a child cgroup this program creates (loopback only), \
        both removed on exit: requests per second directly, through the ailb VIP, nginx, HAProxy and IPVS; \
        the ailb programs' run time per connection with 1,000 backends and 100,000 affinity entries; the \
        table rebuild and swap time on a weight change; the time from a Nacos metadata change to the pinned \
        map. Needs wrk, nginx, haproxy, ipvsadm, bpftool and ip (`cargo xtask setup`).\n\n\
        Writes target/bench/datapath.md and prints it.",
    after_help = "Environment:\n  AILB_BIN  the ailb binary to measure; default: the release build, release/ailb in the target \
        directory this binary was built into (target/release/ailb), made by `cargo xtask build --release`"
)]
pub struct Args {
    /// Only measure the metadata propagation from Nacos to the pinned map, and print it.
    #[arg(long)]
    pub propagation_only: bool,
    /// Only measure the programs' run time per connection (kernel BPF statistics, the
    /// prefix rows included), write `target/bench/datapath-bpf.md` and print it. Needs only
    /// bpftool and ip; the userspace build does not matter (the kernel's counters time the
    /// programs alone), so a debug `AILB_BIN` is fine.
    #[arg(long, conflicts_with = "propagation_only")]
    pub bpf_only: bool,
    /// Internal: the connect loop of the BPF run-time section (run inside the cgroup).
    #[arg(long, num_args = 4, value_names = ["VIP", "COUNT", "CONVERSATIONS", "PREFIX"], allow_hyphen_values = true, hide = true)]
    pub connect_loop: Option<Vec<String>>,
}
