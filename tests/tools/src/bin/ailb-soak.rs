//! `ailb-soak` (root): a chaos soak of ailb on a simulated GPU fleet, and an overload; see
//! [`ailb_tools::soak`] for the method.

use ailb_tools::soak::{self, Args};
use clap::Parser;

fn main() -> anyhow::Result<()> {
    soak::main(Args::parse())
}
