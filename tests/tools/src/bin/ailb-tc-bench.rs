//! `ailb-tc-bench` (root): remote new connections through the TC datapath vs direct vs
//! HAProxy, and the TC program's run time per packet; see [`ailb_tools::tc_bench`] and `--help`.

use std::process::ExitCode;

use ailb_tools::tc_bench::{self, Args};
use clap::Parser;

fn main() -> ExitCode {
    match tc_bench::main(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ailb-tc-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
