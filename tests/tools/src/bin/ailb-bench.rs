//! `ailb-bench` (root): the data-plane benchmarks that `cargo xtask bench` runs; see
//! [`ailb_tools::bench`] and `--help`.

use std::process::ExitCode;

use ailb_tools::bench::{self, args::Args};
use clap::Parser;

fn main() -> ExitCode {
    // The error chain on one line: a backtrace (RUST_BACKTRACE=1 is common) would only hide
    // what to do, e.g. which binary is missing and how to build it.
    match bench::main(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ailb-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
