//! `ailb-frontdoor-bench` (root): small non-streamed requests through ailb's front door, side by
//! side with direct, nginx, sglang-router and vllm-router; see [`ailb_tools::frontdoor`] and
//! `--help`.

use std::process::ExitCode;

use ailb_tools::frontdoor::{self, args::Args};
use clap::Parser;

fn main() -> ExitCode {
    match frontdoor::main(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ailb-frontdoor-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
