//! `ailb-fleet-model`: which offered loads the simulated fleet carries, in simulated time (no
//! root); see [`ailb_tools::capacity`].

use ailb_tools::capacity::{self, Args};
use clap::Parser;

fn main() -> anyhow::Result<()> {
    capacity::main(Args::parse())
}
