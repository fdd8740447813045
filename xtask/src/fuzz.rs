//! `cargo xtask fuzz [--seconds N] [TARGET...]`: builds the cargo-fuzz targets of `tests/fuzz`
//! once, then runs each for N seconds from its checked-in seeds (`tests/fuzz/seeds/TARGET`) and
//! the corpus earlier runs grew (`tests/fuzz/corpus/TARGET`, not checked in). A crash stops the
//! run and names the input libFuzzer saved under `tests/fuzz/artifacts/TARGET`; it becomes a
//! unit test in the crate that owns the parser. The binaries land in the workspace's target
//! directory (`<target>/<host triple>/release/TARGET`), apart from the host builds.
//!
//! Built without a sanitizer (`-s none`): the parsers are safe Rust, so AddressSanitizer finds
//! nothing there that the panics, the overflow checks (`-a`) and the targets' own assertions do
//! not, and costs a slower build and run. Run `cargo +nightly fuzz run --fuzz-dir tests/fuzz
//! TARGET` directly for an ASan build.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::util::{self, say, Step};

/// The fuzz crate, relative to the workspace root.
const FUZZ_DIR: &str = "tests/fuzz";
/// Seconds per target of a plain `cargo xtask fuzz` and of the run inside `cargo xtask test`.
pub(crate) const DEFAULT_SECONDS: u64 = 10;
/// The largest input tried (bytes): room for a long config or metrics page, and a bound on
/// what one input can make a parser allocate.
const MAX_LEN: u32 = 64 * 1024;

/// `cargo +nightly fuzz SUB` on the fuzz crate; `build` without a sanitizer, with overflow
/// checks, into the workspace's target directory.
fn fuzz_cmd(sub: &str) -> Command {
    let mut cmd = util::cargo_nightly();
    cmd.args(["fuzz", sub, "--fuzz-dir", FUZZ_DIR]);
    if sub == "build" {
        cmd.args(["--sanitizer", "none", "--debug-assertions", "--target-dir"]).arg(util::target_dir());
    }
    cmd
}

/// Where `cargo fuzz build` puts a target's binary: it always builds for an explicit target
/// triple (the host's), in release mode.
fn binary(target: &str) -> Result<PathBuf> {
    let version = util::output(Command::new("rustc").args(["+nightly", "-vV"])).context("asking rustc its host")?;
    let host = version.lines().find_map(|l| l.strip_prefix("host: ")).context("no host in `rustc -vV`")?;
    Ok(util::target_dir().join(host.trim()).join("release").join(target))
}

/// Fails with what to do when cargo-fuzz is not installed.
pub(crate) fn check_installed() -> Result<()> {
    if util::output(util::cargo_nightly().args(["fuzz", "--version"])).is_err() {
        bail!(
            "cargo-fuzz is missing (`cargo +nightly fuzz --version` fails): run `cargo xtask setup`, which installs it"
        );
    }
    Ok(())
}

pub(crate) fn fuzz(seconds: u64, only: &[String]) -> Result<()> {
    check_installed()?;
    let all: Vec<String> =
        util::output(&mut fuzz_cmd("list")).context("listing the fuzz targets")?.lines().map(str::to_owned).collect();
    if let Some(unknown) = only.iter().find(|t| !all.contains(t)) {
        bail!("no fuzz target {unknown:?}; the targets: {}", all.join(", "));
    }
    let targets: Vec<&String> = all.iter().filter(|t| only.is_empty() || only.contains(t)).collect();

    let step = Step::start(format!("building {} fuzz target(s) (nightly, cargo-fuzz)", targets.len()));
    // `cargo fuzz build` takes one target or none (all of them).
    let mut build = fuzz_cmd("build");
    if let [one] = targets.as_slice() {
        build.arg(one);
    }
    util::run(&mut build).context("building the fuzz targets")?;
    step.done();

    let root = util::workspace_root().join(FUZZ_DIR);
    for (i, target) in targets.iter().enumerate() {
        let step = Step::start(format!("fuzz {}/{}: {target} for {seconds}s", i + 1, targets.len()));
        run_target(&root, target, seconds)?;
        step.done();
    }
    say!("fuzzing found nothing in {} target(s), {seconds}s each", targets.len());
    Ok(())
}

/// Runs the built binary itself rather than `cargo fuzz run`, which would build again first.
fn run_target(root: &Path, target: &str, seconds: u64) -> Result<()> {
    let corpus = root.join("corpus").join(target);
    let seeds = root.join("seeds").join(target);
    let artifacts = root.join("artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if !seeds.is_dir() {
        bail!("fuzz target {target} has no seeds at {}", seeds.display());
    }
    let bin = binary(target)?;
    // libFuzzer prints a line per new input (thousands in 10 s): they go to a log file, and
    // its end is shown when the target fails.
    let log = root.join("artifacts").join(format!("{target}.log"));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone().with_context(|| format!("opening {} twice", log.display()))?;
    // New inputs go to the first directory (the grown corpus); the seeds stay as checked in.
    let result = util::run(
        Command::new(&bin)
            .stdout(out)
            .stderr(err)
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-max_len={MAX_LEN}"))
            // One input taking 10 s is a hang; more than 2 GiB resident is a leak or a bomb.
            .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
            .arg(&corpus)
            .arg(&seeds),
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    if let Some(last) = lines.iter().rev().find(|l| l.starts_with("stat::number_of_executed_units")) {
        say!("{target}: {}", last.trim_start_matches("stat::"));
    }
    if result.is_err() {
        for line in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("{line}");
        }
        bail!(
            "fuzz target {target} failed: the input is in {} (rerun it with `{} <file>`); add it as a unit test \
             where the parser lives and fix the bug",
            artifacts.display(),
            bin.display()
        );
    }
    Ok(())
}
