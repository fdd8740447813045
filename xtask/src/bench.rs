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
//! 8. The peer routers on the fleet (`--only peers`, not part of a plain `cargo xtask bench`:
//!    about an hour): `ailb-compare` with ailb both ways in and on its static config, every
//!    policy of `sglang-router`, SMG and `vllm-router` a team would pick instead, and round robin L4,
//!    on the trace and on the synthetic mix, each at the load the fleet model calls stable and
//!    at one above it ([`PeersRun`]), and the synthetic mix's stable load again over four seeds
//!    with ailb both ways in and the two cache-aware peers (one seed is one draw of where its few
//!    long conversations land, which sets the tail and the spread); reports in
//!    `docs/results/peers-*/`.
//! 9. The front door's tenants and scheduler (`--only overload`): `ailb-overload-bench` from the
//!    `ailb-tools` package: three tenants offered about 5x what two simulated servers serve (a
//!    batch tenant 80 % of it at the lowest priority): the interactive tenants' TTFT P95 against
//!    the same load alone, shares against weights while backlogged, refusals of a higher band
//!    while a lower one waited, and the front door's added p50 with and without tenants when
//!    nothing waits. Its report is written to `target/bench/overload.md`.
//! 10. The race on real engines (`--only real-engine`, not part of a plain `cargo xtask bench`:
//!     about 30 minutes, two real vLLM for CPU servers of 3-4 GB each): `ailb-compare --engine
//!     vllm`, round robin L4, ailb both ways in, its front door with the prefix-aware pick
//!     (approximate, and precise on the servers' KV events), the tenant-pinned oracle, SMG
//!     `cache_aware` and `prefix_hash` and vllm-router `cache_aware` in front of the same
//!     servers, on a shared-prefix mix and a slice of the Mooncake trace; report in
//!     `docs/results/real-engine/`.
//! 11. The long fuzz run: every cargo-fuzz target of `tests/fuzz` for `--fuzz-minutes` (10)
//!     minutes each, from its seeds and the corpus earlier runs grew (`cargo xtask test` runs each
//!     for 10 seconds). A crash stops the run and names the input; it becomes a unit test beside
//!     the parser it broke. Its table goes to `docs/results/fuzz.md`. Needs no root but for
//!     `tc_packet` (the TC program under `BPF_PROG_TEST_RUN`), which says it skipped without.

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
    /// `ailb-compare` against every peer router policy, `--peers-run` (only when asked for).
    Peers,
    /// `ailb-compare --engine vllm`: the race on real vLLM servers (only when asked for).
    #[value(name = "real-engine")]
    RealEngine,
    /// Every fuzz target for `--fuzz-minutes` each.
    Fuzz,
    /// `ailb-scale-bench`: table writes, kernel memory, recompute and connect4 at 1,024 models.
    Scale,
    /// `ailb-tc-bench`: remote new connections through the TC VIP vs direct vs HAProxy; TC ns per packet.
    Tc,
    /// `ailb-overload-bench`: the front door's tenants and scheduler under 5x overload.
    Overload,
}

/// One run of `--only peers`: a workload at a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PeersRun {
    /// The trace at load 0.4, the highest at which the fleet model calls the fleet stable (its
    /// clairvoyant placement's P95 does not grow when the run is twice as long).
    Trace,
    /// The trace at load 0.5, where no placement is stable (every queue grows with the run).
    TraceAbove,
    /// The synthetic mix at its stable load (`ailb-fleet-model --synthetic`).
    Synthetic,
    /// The synthetic mix at the next load of the model's table, where that placement is no longer
    /// stable.
    SyntheticAbove,
    /// The synthetic mix at its stable load on seeds 1 to 4, ailb both ways in against the two
    /// cache-aware peers (`ailb-compare --seeds`: a report per seed and `seeds.md` over them).
    SyntheticSeeds,
}

impl PeersRun {
    const ALL: [PeersRun; 5] = [
        PeersRun::Trace,
        PeersRun::TraceAbove,
        PeersRun::Synthetic,
        PeersRun::SyntheticAbove,
        PeersRun::SyntheticSeeds,
    ];

    /// The directory under `docs/results/`, whether it is the synthetic mix, and the load.
    fn setup(self) -> (&'static str, bool, f64) {
        match self {
            PeersRun::Trace => ("peers-trace", false, 0.4),
            PeersRun::TraceAbove => ("peers-trace-above", false, 0.5),
            PeersRun::Synthetic => ("peers-synthetic", true, SYNTHETIC_STABLE_LOAD),
            PeersRun::SyntheticAbove => ("peers-synthetic-above", true, SYNTHETIC_ABOVE_LOAD),
            PeersRun::SyntheticSeeds => ("peers-synthetic-seeds", true, SYNTHETIC_STABLE_LOAD),
        }
    }
}

/// The synthetic mix's stable load: the highest of `ailb-fleet-model --synthetic`'s loads at
/// which the clairvoyant placement's P95 does not grow when the run is twice as long
/// (`docs/results/fleet-model-synthetic.md`).
const SYNTHETIC_STABLE_LOAD: f64 = 2.0;
/// The next load of that table: there the clairvoyant placement's tail grows with the run (the
/// model's kernel pick and its prefix-cache oracle still hold theirs; at 4 none does).
const SYNTHETIC_ABOVE_LOAD: f64 = 3.0;

/// The synthetic mix's time scale in the peer runs. Its short questions take about 10 ms of GPU
/// time, 0.5 ms at the trace's 20x: below what a loopback HTTP hop through a userspace router
/// costs on a shared 2-core host, so the peers' tails would measure the host's scheduling. At
/// 5x they take 2 ms and 1000 requests still arrive within about 10 s.
const SYNTHETIC_TIME_SCALE: f64 = 5.0;

/// ailb both ways in (the front door also with its admission by fleet memory on) and on its
/// static config, every peer router policy, and the L4 baseline.
const PEER_POLICIES: &str = "round-robin,ailb,ailb-gateway,ailb-gateway-admission,ailb-static,ailb-prefix,\
                             ailb-gateway-prefix,sglang-cache-aware,sglang-round-robin,smg-cache-aware,smg-prefix-hash,smg-least-load,vllm-cache-aware,\
                             vllm-consistent-hash";
/// The policies of the run over seeds: ailb both ways in, and the peers that were the best peer
/// in every synthetic run (round robin and the consistent hash were 3-5x slower there).
const SEEDS_POLICIES: &str = "ailb,ailb-gateway,sglang-cache-aware,vllm-cache-aware";
/// How many seeds that run takes.
const SEEDS: u64 = 4;

pub(crate) fn bench(only: &[Part], fuzz_minutes: u64, peers_runs: &[PeersRun]) -> Result<()> {
    // The peer runs take half an hour and the real-engine race 30 minutes and 6-8 GB: only when
    // asked for by name.
    let runs = |p: Part| (only.is_empty() && !matches!(p, Part::Peers | Part::RealEngine)) || only.contains(&p);
    if !peers_runs.is_empty() && !runs(Part::Peers) {
        bail!("--peers-run needs --only peers");
    }
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
    if runs(Part::Overload) {
        overload()?;
        say!("overload report: {}", util::target_dir().join("bench/overload.md").display());
    }
    if runs(Part::Tc) {
        tc()?;
        say!("TC datapath report: {}", util::target_dir().join("bench/tc.md").display());
    }
    if runs(Part::Fleet) {
        compare()?;
        say!("fleet comparison: docs/results/trace/replay.md, docs/results/synthetic/replay.md (with SVG plots)");
    }
    if runs(Part::Peers) {
        peers(if peers_runs.is_empty() { &PeersRun::ALL } else { peers_runs })?;
    }
    if runs(Part::RealEngine) {
        real_engine()?;
        say!("real-engine race: docs/results/real-engine/real-engine.md (with an SVG chart)");
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

/// The front door's tenants and scheduler under overload: `ailb-overload-bench` (it finds
/// `ailb-sim` next to itself).
fn overload() -> Result<()> {
    let what = "front door with tenants: ailb-overload-bench (5x the fleet's capacity; about 2 minutes)";
    release_bench(what, &["ailb-tools", "ailb-sim"], &["ailb-overload-bench", "ailb-sim"], &[])
}

/// The front door: `ailb-frontdoor-bench` (it finds `ailb-sim` next to itself: one build puts
/// both there).
fn frontdoor() -> Result<()> {
    let what = "front door: ailb-frontdoor-bench (wrk vs direct, nginx, sglang-router, vllm-router; 7 rounds, about 15 minutes)";
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
    let trace = trace_path()?;
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
    let step = Step::start("fleet capacity model of the synthetic mix: ailb-fleet-model --synthetic (seconds)");
    util::run(
        std::process::Command::new(&model)
            .arg("--synthetic")
            .args(["--loads", SYNTHETIC_MODEL_LOADS])
            .arg("--out")
            .arg(docs.join("fleet-model-synthetic.md"))
            .arg("--svg")
            .arg(docs.join("fleet-model-synthetic.svg"))
            .stdout(std::process::Stdio::null()),
    )
    .with_context(|| format!("running {} --synthetic", model.display()))?;
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

/// The loads `ailb-fleet-model --synthetic` checks (x the synthetic mix's 5 conversations/s).
const SYNTHETIC_MODEL_LOADS: &str = "1,2,3,4,6,8";

/// The Mooncake trace: `$AILB_TRACE` or the one shipped in `tests/data/`.
fn trace_path() -> Result<std::path::PathBuf> {
    let trace = std::env::var_os("AILB_TRACE")
        .filter(|t| !t.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| util::workspace_root().join("tests/data/mooncake-conversation.jsonl.gz"));
    if !trace.is_file() {
        bail!("the Mooncake trace {} is absent (it ships in tests/data/; or set AILB_TRACE)", trace.display());
    }
    Ok(trace)
}

/// ailb against the peer routers, one `ailb-compare` per run of `runs`, one after the other
/// (two replays at once would share the CPUs and each other's timing); each report goes to
/// `docs/results/<run>/`.
fn peers(runs: &[PeersRun]) -> Result<()> {
    util::build_release_bins(&["ailb-tools", "ailb-sim"], &["ailb-compare", "ailb-sim"])?;
    let bin = util::target_dir().join("release/ailb-compare");
    let docs = util::workspace_root().join("docs/results");
    let trace = trace_path()?;
    for run in runs {
        let (dir, synthetic, load) = run.setup();
        let seeds = *run == PeersRun::SyntheticSeeds;
        let (policies, what, report) = if seeds {
            (SEEDS_POLICIES, format!("{SEEDS} seeds x 4 policies (about 12 minutes)"), "seeds.md")
        } else {
            (PEER_POLICIES, "14 policies (about 14 minutes)".to_string(), "replay.md")
        };
        let step = Step::start(format!(
            "peer routers: ailb-compare {} at load {load}, {what} -> docs/results/{dir}/",
            if synthetic { "--synthetic" } else { "on the trace" }
        ));
        let mut cmd = std::process::Command::new(&bin);
        cmd.env("AILB_BIN", util::ailb_bin("release"))
            .args(["--limit", "1000", "--load", &load.to_string(), "--policies", policies])
            .arg("--out-dir")
            .arg(docs.join(dir));
        if synthetic {
            cmd.args(["--synthetic", "--time-scale", &SYNTHETIC_TIME_SCALE.to_string()]);
        } else {
            cmd.arg("--trace").arg(&trace);
        }
        if seeds {
            cmd.args(["--seeds", &SEEDS.to_string()]);
        }
        util::run(&mut cmd).with_context(|| format!("running {} for docs/results/{dir}", bin.display()))?;
        step.done();
        say!("peer routers, {dir}: docs/results/{dir}/{report}");
    }
    Ok(())
}

/// The race on real engines: `ailb-compare --engine vllm` with its defaults (two vLLM servers,
/// the shared-prefix mix and the trace's slice, six policies); report in
/// `docs/results/real-engine/`. The engine is what `cargo xtask setup` installed under
/// `~/.cache/ailb/`.
fn real_engine() -> Result<()> {
    util::build_release_bins(&["ailb-tools"], &["ailb-compare"])?;
    let bin = util::target_dir().join("release/ailb-compare");
    let out = util::workspace_root().join("docs/results/real-engine");
    let step =
        Step::start("real engines: ailb-compare --engine vllm, 2 servers, 2 workloads x 9 policies (about 30 minutes)");
    let mut cmd = std::process::Command::new(&bin);
    cmd.env("AILB_BIN", util::ailb_bin("release"))
        .args(["--engine", "vllm", "--trace"])
        .arg(trace_path()?)
        .arg("--out-dir")
        .arg(&out);
    util::run(&mut cmd).with_context(|| format!("running {} for docs/results/real-engine", bin.display()))?;
    step.done();
    Ok(())
}
