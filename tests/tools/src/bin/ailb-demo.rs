//! `ailb-demo` (root; `cargo xtask run` builds and starts it): the whole system on this machine;
//! see [`ailb_tools::demo`].

use ailb_tools::demo::{self, Args};
use clap::Parser;

fn main() -> anyhow::Result<()> {
    demo::main(Args::parse())
}
