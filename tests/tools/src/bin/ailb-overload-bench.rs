//! `ailb-overload-bench` (root): ailb's front door with tenants and its scheduler under about
//! five times the fleet's capacity, side by side with the same interactive load alone; see
//! [`ailb_tools::overload`] and `--help`.

use std::process::ExitCode;

use ailb_tools::overload::{self, Args};
use clap::Parser;

fn main() -> ExitCode {
    match overload::main(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ailb-overload-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
