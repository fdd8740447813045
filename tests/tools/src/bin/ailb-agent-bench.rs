//! `ailb-agent-bench`: the time from a changed NVML value to the new metadata in Nacos (no root,
//! no GPU); see [`ailb_tools::agent_bench`].

use ailb_tools::agent_bench::{self, Args};
use clap::Parser;

fn main() {
    agent_bench::main(Args::parse());
}
