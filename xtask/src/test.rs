//! `cargo xtask test`: the one command CI runs. Lint gate, setup, build, then every test (unit
//! tests, a short fuzz run of each parser of outside input, the integration tests).

use std::ffi::OsString;

use anyhow::{bail, Context, Result};

use crate::util::{self, say, Step};
use crate::{build, setup};

/// The integration test package: it loads programs and attaches them to child cgroups, so
/// its tests run one at a time.
const INTEGRATION_PKG: &str = "ailb-tests";

pub(crate) fn test(extra: &[OsString]) -> Result<()> {
    if !util::is_root() {
        bail!("cargo xtask test needs root: the integration tests load eBPF programs; run with sudo");
    }

    util::say_disk("at the start");
    lint()?;
    setup::setup()?;
    build::build(false)?;

    let ailb = util::ailb_bin("debug");
    if !ailb.is_file() {
        bail!("{} is missing after the build", ailb.display());
    }

    let step = Step::start("unit tests (workspace, without the integration tests)");
    util::run(
        util::cargo()
            // Every failing test binary is reported, not only the first.
            .args(["test", "--workspace", "--exclude", INTEGRATION_PKG, "--all-targets", "--no-fail-fast"])
            .arg("--")
            .args(extra)
            .env("AILB_BIN", &ailb),
    )
    .context("unit tests failed")?;
    step.done();

    // The parsers of outside input, a few seconds each (cargo-fuzz was installed by setup).
    crate::fuzz::fuzz(crate::fuzz::DEFAULT_SECONDS, &[]).context("fuzzing failed")?;

    // `replay_e2e` and `demo` run these binaries of other packages, which cargo does not build
    // for `ailb-tests` (see `ailb_tests::workspace_bin`).
    let step = Step::start("binaries the integration tests run (ailb-sim, ailb-tools)");
    util::run(util::cargo().args(["build", "-p", "ailb-sim", "-p", "ailb-tools", "--bins"]))
        .context("building the ailb-sim and ailb-tools binaries")?;
    step.done();

    util::say_disk("before the integration tests");
    let step = Step::start(format!("integration tests ({INTEGRATION_PKG}, one at a time)"));
    util::run(
        util::cargo()
            .args(["test", "-p", INTEGRATION_PKG, "--all-targets", "--no-fail-fast", "--", "--test-threads=1"])
            .args(extra)
            .env("AILB_BIN", &ailb),
    )
    .context("integration tests failed")?;
    step.done();

    util::say_disk("at the end");
    say!("all tests passed");
    Ok(())
}

/// `cargo fmt --check` (workspace, the eBPF crate, the fuzz crate) and clippy with warnings as
/// errors (workspace and the fuzz crate).
fn lint() -> Result<()> {
    let step = Step::start("lint: cargo fmt --check");
    util::run(util::cargo().args(["fmt", "--all", "--", "--check"]))
        .context("formatting differs: run `cargo fmt --all`")?;
    let ebpf_manifest = util::workspace_root().join("ailb-ebpf/Cargo.toml");
    if ebpf_manifest.is_file() {
        // The eBPF crate is outside the workspace; rustfmt needs no target for it.
        util::run(util::cargo().args(["fmt", "--manifest-path"]).arg(&ebpf_manifest).args(["--", "--check"]))
            .context("formatting differs in ailb-ebpf: run `cargo fmt` there")?;
    }
    // The fuzz crate is its own workspace (see tests/fuzz/Cargo.toml); it checks with stable.
    let fuzz_manifest = util::workspace_root().join("tests/fuzz/Cargo.toml");
    util::run(util::cargo().args(["fmt", "--manifest-path"]).arg(&fuzz_manifest).args(["--", "--check"]))
        .context("formatting differs in tests/fuzz: run `cargo fmt --manifest-path tests/fuzz/Cargo.toml`")?;
    step.done();

    let step = Step::start("lint: cargo clippy --workspace --all-targets -- -D warnings");
    util::run(util::cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))
        .context("clippy found problems")?;
    util::run(util::cargo().args(["clippy", "--manifest-path"]).arg(&fuzz_manifest).args([
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))
    .context("clippy found problems in tests/fuzz")?;
    step.done();
    Ok(())
}
