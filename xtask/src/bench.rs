//! `cargo xtask bench`: for now the Maglev table benchmarks (build time, disruption). The network
//! benchmarks (ailb vs IPVS vs nginx round robin, with wrk) are planned; see README.

use anyhow::{Context, Result};

use crate::util::{self, say, Step};

pub(crate) fn bench() -> Result<()> {
    let benches = util::workspace_root().join("ailb-common/benches");
    let has_bench = std::fs::read_dir(benches)
        .map(|entries| entries.filter_map(|e| e.ok()).any(|e| e.path().extension().is_some_and(|x| x == "rs")))
        .unwrap_or(false);

    if has_bench {
        // The table builder needs `std`; cargo silently skips a bench whose required features are off.
        let step = Step::start("Maglev table build time: cargo bench -p ailb-common --features std");
        util::run(util::cargo().args(["bench", "-p", "ailb-common", "--features", "std"]))
            .context("cargo bench -p ailb-common")?;
        step.done();
    }
    // Disruption (how many slots move when a backend goes) is a count, not a timing: the example
    // prints it, and the build time too when there is no criterion bench.
    let step = Step::start("Maglev disruption: ailb-common example `disrupt`");
    util::run(util::cargo().args([
        "run",
        "--quiet",
        "--release",
        "-p",
        "ailb-common",
        "--features",
        "std",
        "--example",
        "disrupt",
    ]))
    .context("running the ailb-common `disrupt` example")?;
    step.done();
    say!("network benchmarks (connection rate and latency through the VIP vs IPVS): not yet implemented");
    Ok(())
}
