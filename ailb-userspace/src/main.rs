//! `ailb`: the gateway daemon and its CLI.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    ailb_userspace::cli::main()
}
