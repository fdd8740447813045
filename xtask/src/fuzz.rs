//! `cargo xtask fuzz [--seconds N] [TARGET...]`: builds the cargo-fuzz targets of `tests/fuzz`
//! once, then runs each for N seconds from its checked-in seeds (`tests/fuzz/seeds/TARGET`) and
//! the corpus earlier runs grew (`tests/fuzz/corpus/TARGET`, not checked in). A crash stops the
//! run and names the input libFuzzer saved under `tests/fuzz/artifacts/TARGET`; it becomes a
//! unit test in the crate that owns the parser. The binaries land in the workspace's target
//! directory (`<target>/<host triple>/release/TARGET`), apart from the host builds.
//!
//! `tc_packet` runs the TC program with `BPF_PROG_TEST_RUN`: without root or BPF it exits with
//! [`SKIPPED`] before fuzzing anything, and is reported skipped with its reason.
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

/// The exit status of a target that cannot run here (it prints `TARGET: skipped: REASON`);
/// libFuzzer's own are 77 (a crash) and 70 (a timeout).
const SKIPPED: i32 = 69;

/// What one target's run did, from libFuzzer's final statistics.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) target: String,
    pub(crate) seconds: u64,
    pub(crate) executions: Option<u64>,
    pub(crate) per_second: Option<u64>,
    /// Code edges covered (`cov`) and features (`ft`) at the end.
    pub(crate) coverage: Option<(u64, u64)>,
    /// Inputs in the corpus at the end.
    pub(crate) corpus: Option<u64>,
    /// Why it did not run.
    pub(crate) skipped: Option<String>,
}

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

pub(crate) fn fuzz(seconds: u64, only: &[String]) -> Result<Vec<Outcome>> {
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
    let mut outcomes = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let step = Step::start(format!("fuzz {}/{}: {target} for {seconds}s", i + 1, targets.len()));
        outcomes.push(run_target(&root, target, seconds)?);
        step.done();
    }
    let skipped: Vec<String> =
        outcomes.iter().filter_map(|o| o.skipped.as_ref().map(|why| format!("{} ({why})", o.target))).collect();
    say!("fuzzing found nothing in {} target(s), {seconds}s each", outcomes.len() - skipped.len());
    if !skipped.is_empty() {
        say!("SKIPPED, not run: {}", skipped.join("; "));
    }
    Ok(outcomes)
}

/// Runs the built binary itself rather than `cargo fuzz run`, which would build again first.
fn run_target(root: &Path, target: &str, seconds: u64) -> Result<Outcome> {
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
    let status = Command::new(&bin)
        .stdout(out)
        .stderr(err)
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-max_len={MAX_LEN}"))
        // One input taking 10 s is a hang; more than 2 GiB resident is a leak or a bomb.
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .arg(&corpus)
        .arg(&seeds)
        .status()
        .with_context(|| format!("starting {}", bin.display()))?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let prefix = format!("{target}: skipped: ");
    let why = lines.iter().find_map(|l| l.strip_prefix(prefix.as_str()));
    if let (Some(SKIPPED), Some(why)) = (status.code(), why) {
        say!("{target}: SKIPPED: {why}");
        return Ok(Outcome { target: target.into(), seconds, skipped: Some(why.into()), ..Outcome::default() });
    }
    if !status.success() {
        for line in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("{line}");
        }
        bail!(
            "fuzz target {target} failed ({status}): the input is in {} (rerun it with `{} <file>`); add it as a \
             regression test where the code it broke is tested and fix the bug",
            artifacts.display(),
            bin.display()
        );
    }
    let o = outcome(target, seconds, &lines);
    say!(
        "{target}: {} runs, {} a second, cov {}, corpus {}",
        o.executions.map_or("?".into(), |n| n.to_string()),
        o.per_second.map_or("?".into(), |n| n.to_string()),
        o.coverage.map_or("?".into(), |(c, _)| c.to_string()),
        o.corpus.map_or("?".into(), |n| n.to_string())
    );
    Ok(o)
}

/// The statistics of a finished run's log: `stat::` lines and the last status line
/// (`#N DONE cov: C ft: F corp: K/...`).
fn outcome(target: &str, seconds: u64, lines: &[&str]) -> Outcome {
    let stat = |name: &str| {
        lines.iter().rev().find_map(|l| l.strip_prefix(name)?.trim_start_matches(':').trim().parse::<u64>().ok())
    };
    let last = lines.iter().rev().find(|l| l.starts_with('#') && l.contains(" cov: "));
    let field = |name: &str| {
        let l = last?;
        let rest = &l[l.find(name)? + name.len()..];
        rest.split(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty())?.parse::<u64>().ok()
    };
    Outcome {
        target: target.into(),
        seconds,
        executions: stat("stat::number_of_executed_units"),
        per_second: stat("stat::average_exec_per_sec"),
        coverage: field(" cov: ").zip(field(" ft: ")),
        corpus: field(" corp: "),
        skipped: None,
    }
}

/// The long run's table (Markdown), one row per target.
pub(crate) fn report(outcomes: &[Outcome], when: &str) -> String {
    let mut md = format!(
        "# Long fuzz run\n\nWritten by `cargo xtask bench --only fuzz` ({when}). Every target of `tests/fuzz` from \
         its seeds and the corpus earlier runs grew; libFuzzer's final statistics. A crash stops the run.\n\n\
         | target | seconds | executions | per second | coverage (edges / features) | corpus | |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for o in outcomes {
        let cov = o.coverage.map_or("-".to_string(), |(c, f)| format!("{c} / {f}"));
        let result = o.skipped.as_ref().map_or("no crash".to_string(), |why| format!("**skipped**: {why}"));
        md.push_str(&format!(
            "| `{}` | {} | {} | {} | {cov} | {} | {result} |\n",
            o.target,
            o.seconds,
            n(o.executions),
            n(o.per_second),
            n(o.corpus)
        ));
    }
    md
}

#[cfg(test)]
mod tests;
