//! `cargo xtask bench`: every benchmark, measured side by side in one run.
//!
//! 1. The table builder (criterion): `cargo bench -p ailb-common --features std`.
//! 2. Table disruption when a backend goes (a count, not a timing): example `disrupt`.
//! 3. The data plane (root): `ailb-bench` from the tests crate: requests per second through the
//!    VIP vs directly vs nginx vs HAProxy (IPVS where the kernel has it), BPF run time per
//!    connection with 1000 backends and 100,000 affinity entries, table swap time. Its report is
//!    written to `target/bench/datapath.md`; `docs/benchmarks.md` quotes a run of it.
//! 4. The GPU node agent (issue 4): `ailb-agent-bench` from the tests crate: time from a changed
//!    (fake) NVML value to the new metadata in rnacos, p50/p90/p99/max at the default 1 s publish
//!    interval and at 500 ms. Its report is written to `target/bench/agent.md`.

use anyhow::{bail, Context, Result};

use crate::util::{self, say, Step};

pub(crate) fn bench() -> Result<()> {
    if !util::is_root() {
        bail!("cargo xtask bench needs root: the data-plane benchmark loads eBPF programs and creates a network namespace");
    }
    crate::setup::setup()?;
    crate::build::build(true)?;

    let step = Step::start("table build time: cargo bench -p ailb-common --features std --bench maglev");
    util::run(util::cargo().args(["bench", "-p", "ailb-common", "--features", "std", "--bench", "maglev"]))
        .context("cargo bench -p ailb-common")?;
    step.done();

    let step = Step::start("table disruption: ailb-common example `disrupt`");
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

    let step = Step::start("data plane: ailb-bench (wrk, BPF statistics, table swaps; about 2 minutes)");
    util::run(util::cargo().args(["build", "--quiet", "--release", "-p", "ailb-tests", "--bin", "ailb-bench"]))
        .context("building ailb-bench")?;
    let bin = util::target_dir().join("release/ailb-bench");
    util::run(std::process::Command::new(&bin).env("AILB_BIN", util::ailb_bin("release")))
        .with_context(|| format!("running {}", bin.display()))?;
    step.done();

    let step = Step::start("GPU node agent: ailb-agent-bench (NVML change -> Nacos; about 4 minutes)");
    util::run(util::cargo().args(["build", "--quiet", "--release", "-p", "ailb-tests", "--bin", "ailb-agent-bench"]))
        .context("building ailb-agent-bench")?;
    let bin = util::target_dir().join("release/ailb-agent-bench");
    util::run(std::process::Command::new(&bin).env("AILB_BIN", util::ailb_bin("release")))
        .with_context(|| format!("running {}", bin.display()))?;
    step.done();
    say!("data-plane report: {}", util::target_dir().join("bench/datapath.md").display());
    say!("agent report: {}", util::target_dir().join("bench/agent.md").display());
    Ok(())
}
