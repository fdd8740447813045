//! `cargo xtask bench`: every benchmark, measured side by side in one run.
//!
//! 1. The table builder (criterion): `cargo bench -p ailb-common --features std`, and the policy
//!    plus table recompute for 100 models x 100 backends: `cargo bench -p ailb-userspace --bench plan`.
//! 2. Table disruption when a backend goes (a count, not a timing): example `disrupt`.
//! 3. The data plane (root): `ailb-bench` from the `ailb-tools` package: requests per second through the
//!    VIP vs directly vs nginx vs HAProxy (IPVS where the kernel has it), BPF run time per
//!    connection with 1000 backends and 100,000 affinity entries, table swap time. Its report is
//!    written to `target/bench/datapath.md`; `docs/benchmarks.md` quotes a run of it.
//! 4. The GPU node agent: `ailb-agent-bench` from the `ailb-tools` package: time from a changed
//!    (fake) NVML value to the new metadata in rnacos, p50/p90/p99/max at the default 1 s publish
//!    interval and at 500 ms. Its report is written to `target/bench/agent.md`.
//! 5. The front door: `ailb-frontdoor-bench` from the `ailb-tools` package: small non-streamed
//!    requests (`wrk -c16`, a one-token chat completion, keep-alive clients) to one simulated server
//!    directly vs through `ailb gateway` (daemon attached, one row per `upstream_reuse` value) vs
//!    nginx as an L7 proxy with upstream keep-alive vs `sglang-router` and `vllm-router`, in
//!    interleaved rounds: req/s, added p50/p99, ratios, router CPU per request, whether the front
//!    door meets its goals, and where its time goes (strace, perf). Its report is written to
//!    `target/bench/frontdoor.md`.
//! 6. Scale: `ailb-scale-bench` from the `ailb-tools` package: table write time and kernel memory
//!    with 10, 100 and 1,024 models, a recompute of 1,000 models x 16 backends, and connect4's
//!    run time with 1 vs 1,024 models loaded. Its report is written to `target/bench/scale.md`.
//! 7. The fleet comparison: `ailb-fleet-model` (which offered loads the fleet can carry,
//!    `docs/results/fleet-model.md` and `.svg`), then `ailb-compare` on the Mooncake trace (1000 requests at
//!    load 0.4) and on the synthetic mix, six policies each; reports and SVG plots in
//!    `docs/results/{trace,synthetic}/`.
//! 7. The long fuzz run: every cargo-fuzz target of `tests/fuzz` for `--fuzz-minutes` (10)
//!    minutes each, from its seeds and the corpus earlier runs grew (`cargo xtask test` runs each
//!    for 10 seconds). A crash stops the run and names the input; it becomes a unit test beside
//!    the parser it broke. Its table goes to `docs/results/fuzz.md`. Needs no root but for
//!    `tc_packet` (the TC program under `BPF_PROG_TEST_RUN`), which says it skipped without.

use anyhow::{bail, Context, Result};

use crate::util::{self, say, Step};

/// A part of `cargo xtask bench`, for `--only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Part {
    /// Table build time, the policy + table recompute, slots moved when a backend goes.
    Tables,
    /// `ailb-bench`: request rate through the VIP vs direct, nginx, HAProxy; BPF run time; swaps.
    Datapath,
    /// `ailb-agent-bench`: NVML change to Nacos.
    Agent,
    /// `ailb-frontdoor-bench`: small requests through the front door vs direct, nginx and the peer routers.
    #[value(name = "frontdoor")]
    FrontDoor,
    /// `ailb-fleet-model` and `ailb-compare` on the trace and the synthetic mix (`docs/results/`).
    Fleet,
    /// Every fuzz target for `--fuzz-minutes` each.
    Fuzz,
    /// `ailb-scale-bench`: table writes, kernel memory, recompute and connect4 at 1,024 models.
    Scale,
    /// `ailb-tc-bench`: remote new connections through the TC VIP vs direct vs HAProxy; TC ns per packet.
    Tc,
}

pub(crate) fn bench(only: &[Part], fuzz_minutes: u64) -> Result<()> {
    let runs = |p: Part| only.is_empty() || only.contains(&p);
    if fuzz_minutes == 0 {
        bail!("--fuzz-minutes 0: a fuzz run needs at least one minute per target");
    }
    // Every part but the fuzz run loads programs or starts the fleet.
    let privileged = only.is_empty() || only.iter().any(|&p| p != Part::Fuzz);
    if privileged && !util::is_root() {
        bail!("cargo xtask bench needs root: the data-plane benchmark loads eBPF programs and creates a network namespace");
    }
    if privileged {
        crate::setup::setup()?;
        crate::build::build(true)?;
    }
    if runs(Part::Tables) {
        tables()?;
    }
    if runs(Part::Datapath) {
        datapath()?;
        say!("data-plane report: {}", util::target_dir().join("bench/datapath.md").display());
    }
    if runs(Part::Agent) {
        agent()?;
        say!("agent report: {}", util::target_dir().join("bench/agent.md").display());
    }
    if runs(Part::FrontDoor) {
        frontdoor()?;
        say!("front-door report: {}", util::target_dir().join("bench/frontdoor.md").display());
    }
    if runs(Part::Scale) {
        scale()?;
        say!("scale report: {}", util::target_dir().join("bench/scale.md").display());
    }
    if runs(Part::Tc) {
        tc()?;
        say!("TC datapath report: {}", util::target_dir().join("bench/tc.md").display());
    }
    if runs(Part::Fleet) {
        compare()?;
        say!("fleet comparison: docs/results/trace/replay.md, docs/results/synthetic/replay.md (with SVG plots)");
    }
    if runs(Part::Fuzz) {
        let outcomes = crate::fuzz::fuzz(fuzz_minutes * 60, &[])?;
        let when =
            util::output(std::process::Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])).unwrap_or_default();
        let path = util::workspace_root().join("docs/results/fuzz.md");
        std::fs::write(&path, crate::fuzz::report(&outcomes, when.trim()))
            .with_context(|| format!("writing {}", path.display()))?;
        say!("long fuzz run: {}", path.display());
    }
    Ok(())
}

/// The table builder and the policy recompute (criterion), and the disruption example.
fn tables() -> Result<()> {
    let step = Step::start("table build time: cargo bench -p ailb-common --features std --bench maglev");
    util::run(util::cargo().args(["bench", "-p", "ailb-common", "--features", "std", "--bench", "maglev"]))
        .context("cargo bench -p ailb-common")?;
    step.done();

    let step =
        Step::start("policy + table recompute, 100 models x 100 backends: cargo bench -p ailb-userspace --bench plan");
    util::run(util::cargo().args(["bench", "-p", "ailb-userspace", "--bench", "plan"]))
        .context("cargo bench -p ailb-userspace --bench plan")?;
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

    Ok(())
}

/// Builds `bins` of `packages` in release and runs `bins[0]` with `args` (it finds the others
/// next to itself), as the step `what`.
fn release_bench(what: &str, packages: &[&str], bins: &[&str], args: &[std::ffi::OsString]) -> Result<()> {
    let step = Step::start(what);
    util::build_release_bins(packages, bins)?;
    let bin = util::target_dir().join("release").join(bins[0]);
    util::run(std::process::Command::new(&bin).args(args).env("AILB_BIN", util::ailb_bin("release")))
        .with_context(|| format!("running {}", bin.display()))?;
    step.done();
    Ok(())
}

/// The data plane: `ailb-bench`.
fn datapath() -> Result<()> {
    let what = "data plane: ailb-bench (wrk, BPF statistics, table swaps; about 2 minutes)";
    release_bench(what, &["ailb-tools"], &["ailb-bench"], &[])
}

/// The TC datapath for remote clients: `ailb-tc-bench`.
fn tc() -> Result<()> {
    let out = util::target_dir().join("bench/tc.md");
    let what = "TC datapath: ailb-tc-bench (namespaces, HAProxy, BPF statistics; about 1 minute)";
    release_bench(what, &["ailb-tools"], &["ailb-tc-bench"], &["--out".into(), out.into()])
}

/// Scale: `ailb-scale-bench`.
fn scale() -> Result<()> {
    release_bench(
        "scale: ailb-scale-bench (1,024 models; about 2 minutes)",
        &["ailb-tools"],
        &["ailb-scale-bench"],
        &[],
    )
}

/// The GPU node agent: `ailb-agent-bench`.
fn agent() -> Result<()> {
    let what = "GPU node agent: ailb-agent-bench (NVML change -> Nacos; about 4 minutes)";
    release_bench(what, &["ailb-tools"], &["ailb-agent-bench"], &[])
}

/// The front door: `ailb-frontdoor-bench` (it finds `ailb-sim` next to itself: one build puts
/// both there).
fn frontdoor() -> Result<()> {
    let what = "front door: ailb-frontdoor-bench (wrk vs direct, nginx, sglang-router, vllm-router; about 2 minutes)";
    release_bench(what, &["ailb-tools", "ailb-sim"], &["ailb-frontdoor-bench", "ailb-sim"], &[])
}

/// Every balancing policy on one simulated GPU fleet, on the Mooncake trace and on the
/// synthetic mix; the reports and plots go to `docs/results/` (checked in, so that the docs show
/// the last run).
fn compare() -> Result<()> {
    // ailb-compare finds ailb-sim next to itself: one build puts both there.
    util::build_release_bins(&["ailb-tools", "ailb-sim"], &["ailb-compare", "ailb-sim", "ailb-fleet-model"])?;
    let bin = util::target_dir().join("release/ailb-compare");
    let docs = util::workspace_root().join("docs/results");
    let trace = std::env::var_os("AILB_TRACE")
        .filter(|t| !t.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| util::workspace_root().join("tests/data/mooncake-conversation.jsonl.gz"));
    if !trace.is_file() {
        bail!("the Mooncake trace {} is absent (it ships in tests/data/; or set AILB_TRACE)", trace.display());
    }
    let step = Step::start(
        "fleet capacity model: ailb-fleet-model (offered load vs placement in simulated time; under a minute)",
    );
    let model = util::target_dir().join("release/ailb-fleet-model");
    util::run(
        std::process::Command::new(&model)
            .arg("--trace")
            .arg(&trace)
            .arg("--loads")
            .arg("0.25,0.3,0.35,0.4,0.5,0.7,1.0")
            .arg("--out")
            .arg(docs.join("fleet-model.md"))
            .arg("--svg")
            .arg(docs.join("fleet-model.svg"))
            .stdout(std::process::Stdio::null()),
    )
    .with_context(|| format!("running {}", model.display()))?;
    step.done();
    let step = Step::start(
        "fleet comparison on the Mooncake trace: ailb-compare (1000 requests at load 0.4, six policies; about 7 minutes)",
    );
    util::run(
        std::process::Command::new(&bin)
            .env("AILB_BIN", util::ailb_bin("release"))
            .arg("--trace")
            .arg(&trace)
            .arg("--out-dir")
            .arg(docs.join("trace")),
    )
    .with_context(|| format!("running {}", bin.display()))?;
    step.done();
    let step = Step::start("fleet comparison on the synthetic mix: ailb-compare --synthetic (about 1 minute)");
    util::run(
        std::process::Command::new(&bin)
            .env("AILB_BIN", util::ailb_bin("release"))
            .arg("--synthetic")
            .args(["--limit", "300", "--load", "1.0"])
            .arg("--out-dir")
            .arg(docs.join("synthetic")),
    )
    .with_context(|| format!("running {}", bin.display()))?;
    step.done();
    Ok(())
}
