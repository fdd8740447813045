//! `ailb-scale-bench` (root): kernel tables sized to the model; see [`ailb_tools::scale`].

use std::process::ExitCode;

/// The daemon's allocator, so that the in-process sections measure what the daemon runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match ailb_tools::scale::main(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ailb-scale-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
