//! `cargo xtask bench`: for now the Maglev table benchmarks (build time, disruption). The network
//! benchmarks (ailb vs IPVS vs nginx round robin, with wrk) are planned; see README.

use anyhow::{Context, Result};

use crate::util::{self, say, Step};

pub(crate) fn bench() -> Result<()> {
    let root = util::workspace_root();
    let common = root.join("ailb-common");
    let has_bench = std::fs::read_dir(common.join("benches"))
        .map(|entries| entries.filter_map(|e| e.ok()).any(|e| e.path().extension().is_some_and(|x| x == "rs")))
        .unwrap_or(false);

    if has_bench {
        let step = Step::start("Maglev benchmarks: cargo bench -p ailb-common");
        util::run(util::cargo().args(["bench", "-p", "ailb-common"])).context("cargo bench -p ailb-common")?;
        step.done();
    } else {
        let step = Step::start("Maglev table build time and disruption (ailb-common example `disrupt`)");
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
    }
    say!("network benchmarks (connection rate and latency through the VIP vs IPVS): not yet implemented");
    Ok(())
}
