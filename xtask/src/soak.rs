//! `cargo xtask soak` (root): builds `ailb` (with its eBPF object), `ailb-soak` and `ailb-sim`
//! (release unless `--debug`), then runs `ailb-soak`: the chaos soak at the fleet's stable
//! load for `--minutes` (20 by default) and the one-minute overload (or only the overload),
//! writing `docs/results/soak/`.

use anyhow::{bail, Context, Result};

use crate::util::{self, Step};

/// What `cargo xtask soak` was asked for.
pub(crate) struct SoakOpts {
    pub minutes: f64,
    pub overload_only: bool,
    pub no_overload: bool,
    pub no_tc: bool,
    pub debug: bool,
}

pub(crate) fn soak(o: &SoakOpts) -> Result<()> {
    let SoakOpts { minutes, overload_only, no_overload, no_tc, debug } = *o;
    if !util::is_root() {
        bail!("cargo xtask soak needs root: it loads eBPF programs and creates a child cgroup");
    }
    crate::build::build(!debug)?;
    let profile = if debug { "debug" } else { "release" };
    let mut build = util::cargo();
    build.args(["build", "--quiet", "-p", "ailb-tools", "-p", "ailb-sim", "--bin", "ailb-soak", "--bin", "ailb-sim"]);
    if !debug {
        build.arg("--release");
    }
    util::run(&mut build).context("building ailb-soak and ailb-sim")?;
    let bin = util::target_dir().join(profile).join("ailb-soak");
    let what = if overload_only {
        "the overload (about 3 minutes: 30 s at the stable load, then the minute at 10x and the drain)".to_string()
    } else if no_overload {
        format!("the chaos soak ({minutes} minutes)")
    } else {
        format!("the chaos soak ({minutes} minutes) and the overload")
    };
    let step = Step::start(format!("ailb-soak: {what}"));
    let mut reproduce = "cargo xtask soak".to_string();
    if debug {
        reproduce.push_str(" --debug");
    }
    if no_tc {
        reproduce.push_str(" --no-tc");
    }
    let mut cmd = std::process::Command::new(&bin);
    // A private copy of `ailb` given by the caller wins over the shared target directory's.
    if std::env::var_os("AILB_BIN").is_none() {
        cmd.env("AILB_BIN", util::ailb_bin(profile));
    }
    cmd.current_dir(util::workspace_root())
        .args(["--minutes", &minutes.to_string(), "--reproduce", &reproduce])
        .arg("--out-dir")
        .arg(util::workspace_root().join("docs/results/soak"));
    if overload_only {
        cmd.arg("--overload-only");
    }
    if no_overload {
        cmd.arg("--no-overload");
    }
    if no_tc {
        cmd.arg("--no-tc");
    }
    util::run(&mut cmd).with_context(|| format!("running {}", bin.display()))?;
    step.done();
    Ok(())
}
