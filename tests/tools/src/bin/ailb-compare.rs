//! `ailb-compare` (root): balancing policies compared in one run, on the same simulated GPU
//! fleet (or, with `--engine vllm`, the same real vLLM servers) and the same request list; see
//! [`ailb_tools::compare`] for the method and the policies.

use ailb_tools::compare::{self, args::Args};
use clap::Parser;

fn main() -> anyhow::Result<()> {
    compare::main(Args::parse())
}
