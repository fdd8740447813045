//! `ailb`: the daemon, the GPU node agent, the front door and the CLI around them.
#![forbid(unsafe_code)]

/// mimalloc, not the system allocator: a fleet-wide recompute builds and drops hundreds of
/// thousands of small strings and nodes (the snapshot, the plan), which take about half the
/// time with it (measured by `ailb-scale-bench recompute`, which uses it too).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    ailb_userspace::cli::main()
}
