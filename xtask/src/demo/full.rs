//! `cargo xtask run` (default): the fleet demo, `ailb-demo` from the `ailb-tools` package: rnacos,
//! a simulated GPU fleet with one `ailb agent` each, `ailb run` with Nacos discovery attached to a
//! child cgroup, the front door `ailb gateway` inside that cgroup, a load generator speaking plain
//! HTTP to it (`--socket-abi`: tagging its own sockets instead), and a live view (see
//! `tests/tools/src/demo/`).
//!
//! The demo runs in its own process group, so a terminal Ctrl-C reaches only this process, which
//! passes it on to the demo; the demo then stops its children in order (agents deregister, the
//! gateway's pins are removed, the cgroup goes) and exits.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::{install_stop_handler, STOP};
use crate::util::{self, say, Step};
use crate::{build, setup};

pub(crate) fn run(duration: Option<u64>, demo_args: &[OsString]) -> Result<()> {
    if !util::is_root() {
        bail!("cargo xtask run needs root: it loads eBPF programs and creates a cgroup; run with sudo");
    }
    setup::setup()?;
    build::build(true)?;
    // ailb-demo finds ailb-sim and ailb-replay next to itself: one build puts all three there.
    let step = Step::start("building the demo: ailb-demo, ailb-sim, ailb-replay (release)");
    util::build_release_bins(&["ailb-tools", "ailb-sim"], &["ailb-demo", "ailb-sim", "ailb-replay"])?;
    step.done();

    install_stop_handler()?;
    let bin = util::target_dir().join("release/ailb-demo");
    let mut cmd = Command::new(&bin);
    cmd.env("AILB_BIN", util::ailb_bin("release")).stdin(Stdio::null()).process_group(0);
    if let Some(d) = duration {
        cmd.args(["--duration-s", &d.to_string()]);
    }
    cmd.args(demo_args);
    let mut child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
    say!("demo started (pid {}); Ctrl-C stops it and tears everything down", child.id());
    let mut forwarded = false;
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for the demo")? {
            break st;
        }
        if STOP.load(Ordering::SeqCst) && !forwarded {
            // SAFETY: kill(2) on our own child's pid, not yet reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
            forwarded = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        bail!("the demo failed ({status})");
    }
    Ok(())
}
